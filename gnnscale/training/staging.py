"""Features read a superbatch ahead (train.feature_cache=read): explicit reads instead of page faults.

A graph whose features do not fit in RAM used to be trained through memory-mapped shards: every row a
page fault, one 4 KiB read at a time, the slowest way to use a disk. Here the sampler runs a group of
batches (a superbatch) ahead of the model (Ginex's superbatch, VLDB 2022), so the rows those batches
need are known before any of them computes. Their union, sorted, is read once with large coalesced
requests, many in flight (storage/feature_reader.py), into a staging buffer; each batch then gathers
from RAM. While the model trains on one superbatch, the next one is read into the second buffer, and
the rows the two share are copied across instead of read again (what a cache that knows the future
keeps; the degree-ranked hot-feature cache, train.cache_gb, still serves its rows first).

A superbatch grows batch by batch until its rows would overflow a buffer (`row_cap`, sized by the memory
plan) or it holds `max_batches` batches. The memory held: two buffers of row_cap rows, a node -> row
map (4 bytes per node), a mark array (1 byte per node) and the blocks of at most two superbatches.

Determinism: batches are sampled in the same order, in the same thread, as without staging, and only
the sampler draws from DGL's and numpy's RNGs, only the model from torch's; rows are copied bit for bit.
So a staged run equals an in-memory one batch for batch. Samplers that draw from torch's RNG during a
batch (link negatives) would interleave with dropout: those streams stage one batch at a time
(max_batches=1), which keeps the coalesced parallel reads and drops only the look-ahead.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from gnnscale.sampling.batch import Batch
from gnnscale.storage.feature_store import FeatureStore


@dataclass
class Staged:
    """One superbatch: its batches and, once read, which rows of `rows` hold which nodes."""

    batches: list
    ids: torch.Tensor  # the nodes staged (not in the hot-feature cache), in buffer-row order
    rows: torch.Tensor  # [len(ids), stored_dim] view of a staging buffer
    read: int = 0  # rows read from disk (the rest were copied from the previous superbatch)
    seconds: float = 0.0  # time the read took (in the background)


class Stager:
    """Groups a loader's batches into superbatches and reads each one's rows ahead (see the module doc)."""

    def __init__(self, features: FeatureStore, reader, row_cap: int, max_batches: int, overlap: bool = True):
        self.features, self.reader = features, reader
        self.row_cap, self.max_batches = max(1, int(row_cap)), max(1, int(max_batches))
        # overlap: read the next superbatch into a second buffer while this one computes; without it one
        # buffer (twice the rows for the same memory) is read while the model waits
        self.overlap = bool(overlap)
        n = features.num_nodes
        self._mark = np.zeros(n, dtype=bool)  # nodes of the superbatch being collected
        self._slot = torch.full((n,), -1, dtype=torch.int32)  # node -> row of the active superbatch
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._turn = 0
        self._active: Staged | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gnnscale-stage")
        self.rows_read = self.rows_copied = self.superbatches = 0
        self.read_s = 0.0

    @property
    def held_bytes(self) -> int:
        """What the stager itself holds (buffers as allocated, the map and the mark array)."""
        bufs = sum(b.numel() * b.element_size() for b in self._buffers if b is not None)
        return bufs + self._slot.numel() * 4 + self._mark.nbytes

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._buffers = [None, None]
        self._active = None

    # ------------------------------------------------------------ grouping (the caller's thread)
    def _uncached(self, ids: torch.Tensor) -> np.ndarray:
        """The batch's nodes the hot-feature cache does not hold."""
        slot = self.features.hot_slot
        ids = ids if slot is None else ids[slot[ids] < 0]
        return ids.numpy()

    def collect(self, it: Iterator[Batch], first: Batch | None) -> tuple[list, Batch | None]:
        """The next superbatch's batches, sampled now (each with its sample_s), and the batch that did not
        fit (it leads the next superbatch). `first`: a batch left over from the previous call."""
        group, count = [], 0
        while len(group) < self.max_batches:
            if first is not None:
                b, first = first, None
            else:
                t0 = time.perf_counter()
                b = next(it, None)
                if b is None:
                    break
                b.sample_s = time.perf_counter() - t0
            ids = self._uncached(b.input_nodes)
            new = int((~self._mark[ids]).sum())
            if group and count + new > self.row_cap:
                first = b
                break
            self._mark[ids] = True
            count += new
            group.append(b)
        return group, first

    def start(self, group: list) -> Future | None:
        """Begin reading the group's rows into the free buffer (in the background); None for no group.
        Rows the active superbatch holds are copied from it instead of read."""
        if not group:
            return None
        ids = np.flatnonzero(self._mark)
        self._mark[ids] = False
        ids = torch.from_numpy(ids)
        # carried rows come from the other buffer; one buffer is overwritten whole, so none are carried
        held = self._slot[ids] if self._active is not None and self.overlap else None
        if not self.overlap:
            self.release()
        buf = self._buffer(len(ids))
        return self._pool.submit(self._fill, group, ids, held, buf)

    def _buffer(self, rows: int) -> torch.Tensor:
        k = self._turn
        self._turn = 1 - k if self.overlap else 0
        buf = self._buffers[k]
        if buf is None or buf.shape[0] < rows:
            self._buffers[k] = None  # free the old one before allocating its successor
            size = max(rows, min(self.row_cap, self.features.num_nodes))
            buf = torch.empty((size, self.features.stored_dim), dtype=self.features.dtype)
            self._buffers[k] = buf
        return buf

    def _fill(self, group: list, ids: torch.Tensor, held, buf: torch.Tensor) -> Staged:
        """Read side: carried rows first copied from the active buffer, the rest read from disk."""
        t0 = time.perf_counter()
        if held is None:
            order, read = ids, len(ids)
            self.reader.read_rows(ids, out=buf[: len(ids)])
        else:
            have = held >= 0
            new, old = ids[~have], ids[have]
            read = len(new)
            order = torch.cat([new, old])
            self.reader.read_rows(new, out=buf[:read])
            # index_select + index_copy_ semantics via out=: one pass, no temporary
            torch.index_select(self._active.rows, 0, held[have].to(torch.int64), out=buf[read : len(ids)])
        return Staged(group, order, buf[: len(ids)], read, time.perf_counter() - t0)

    def activate(self, staged: Staged) -> None:
        """Make `staged` the superbatch gathers read from (the previous one's rows are let go)."""
        if self._active is not None:
            self._slot[self._active.ids] = -1
        self._slot[staged.ids] = torch.arange(len(staged.ids), dtype=torch.int32)
        self._active = staged
        self.rows_read += staged.read
        self.rows_copied += len(staged.ids) - staged.read
        self.superbatches += 1
        self.read_s += staged.seconds

    def release(self) -> None:
        """After a pass: no superbatch is active (the buffers stay for the next pass)."""
        if self._active is not None:
            self._slot[self._active.ids] = -1
            self._active = None

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The batch's rows from the hot-feature cache and the active superbatch."""
        return self.features.gather(ids, out=out, staged=(self._slot, self._active.rows))

    def stats(self) -> dict:
        total = self.rows_read + self.rows_copied
        return {
            "superbatches": self.superbatches,
            "rows_read": self.rows_read,
            "rows_copied": self.rows_copied,
            "copied_fraction": round(self.rows_copied / total, 4) if total else None,
            "read_s": round(self.read_s, 3),
        }


def staged_batches(stager: Stager, it: Iterator[Batch], take, gather_into) -> Iterator[Batch]:
    """The loader's batches with their features, a superbatch read ahead of the one computing.
    take(rows) -> an output buffer; gather_into(batch, out) fills x / y (BatchStream._gather's work)."""
    group, left = stager.collect(it, None)
    job = stager.start(group)
    try:
        while group:
            if stager.overlap:
                nxt, left = stager.collect(it, left)  # sampled while the current group's rows are read
            t0 = time.perf_counter()
            staged = job.result()
            wait = time.perf_counter() - t0
            job = None
            stager.activate(staged)
            if stager.overlap:
                job = stager.start(nxt)  # read while the current group computes
            for i, b in enumerate(group):
                out = take(len(b.input_nodes))
                gather_into(b, out)
                if i == 0:
                    b.gather_s += wait  # waiting for the disk is this superbatch's gather time
                group[i] = None
                yield b
                b = None
            if not stager.overlap:
                nxt, left = stager.collect(it, left)
                job = stager.start(nxt)
            group = nxt
    finally:
        if job is not None:
            job.result()
        stager.release()
