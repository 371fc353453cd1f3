"""Features read a superbatch ahead (train.feature_cache=read): explicit reads instead of page faults.

A graph whose features do not fit in RAM used to be trained through memory-mapped shards: every row a
page fault, one 4 KiB read at a time, the slowest way to use a disk. Here the sampler runs a group of
batches (a superbatch) ahead of the model (Ginex's superbatch, VLDB 2022), so the rows those batches
need are known before any of them computes. Their union, sorted, is read once with large coalesced
requests, many in flight (storage/feature_reader.py), into a staging buffer; each batch then gathers
from RAM.

The staging region holds two halves of `row_cap` rows. While the model trains on the superbatch in one
half, the next one is read into the other, and the rows the two share are copied across instead of read
again (what a cache that knows the future keeps; the degree-ranked hot-feature cache, train.cache_gb,
still serves its rows first). That hides the read behind compute, but when the disk is the bound it
sweeps the file twice as often as needed: a superbatch's rows are spread over the whole file, so each
read costs about one pass over it, however many batches share it. Then (read per batch over twice the
compute per batch, measured on the run's own superbatches) the next superbatches take the whole region
instead, each read while the model waits but spanning more batches per pass; back to halves once the
read is under half the compute. Which it is changes which rows are staged together, never a batch.

A superbatch grows batch by batch until its rows would overflow its part of the region (sized by the
memory plan) or it holds `max_batches` batches. The memory held: the region (2 x row_cap rows), a node
-> row map (4 bytes per node), a mark array (1 byte per node) and the blocks of at most two
superbatches (the next one is sampled while the current one's rows are read).

Determinism: batches are sampled in the same order, in the same thread, as without staging, and only
the sampler draws from DGL's and numpy's RNGs, only the model from torch's; rows are copied bit for bit.
So a staged run equals an in-memory one batch for batch. Samplers that draw from torch's RNG during a
batch (link negatives) would interleave with dropout: those streams stage one batch at a time, sampled
after the previous batch computed (lookahead=False), which keeps the coalesced parallel reads and drops
only the look-ahead.
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
    rows: torch.Tensor  # [len(ids), stored_dim] view of the staging region
    half: int | None  # which half of the region holds it (None: the whole region)
    read: int = 0  # rows read from disk (the rest were copied from the previous superbatch)
    seconds: float = 0.0  # time the read took (in the background)


class Stager:
    """Groups a loader's batches into superbatches and reads each one's rows ahead (see the module doc).

    row_cap: rows of one half of the staging region (two halves with overlap, else one); max_batches:
    batches one superbatch may span. adaptive: switch between halves and the whole region from the
    measured read and compute times (off: always halves, as tests pin it). lookahead=False: one batch per
    superbatch, sampled once the one before has computed (samplers that draw from torch's RNG)."""

    def __init__(
        self,
        features: FeatureStore,
        reader,
        row_cap: int,
        max_batches: int,
        overlap: bool = True,
        adaptive: bool = True,
        lookahead: bool = True,
    ):
        self.features, self.reader = features, reader
        # lookahead=False: each batch sampled after the previous one computed, as without staging
        self.lookahead = bool(lookahead)
        self.row_cap = max(1, int(row_cap))
        self.max_batches = max(1, int(max_batches)) if self.lookahead else 1
        self.overlap, self.adaptive = bool(overlap), bool(adaptive) and bool(overlap)
        self.halves = self.overlap  # how the next superbatch is collected: into a half, or the whole region
        self._collected_halves = self.halves
        n = features.num_nodes
        self._mark = np.zeros(n, dtype=bool)  # nodes of the superbatch being collected
        self._marked = 0
        self._slot = torch.full((n,), -1, dtype=torch.int32)  # node -> row of the active superbatch
        self._half_rows = min(self.row_cap, n)
        self._region: torch.Tensor | None = None
        self._active: Staged | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gnnscale-stage")
        self.rows_read = self.rows_copied = self.superbatches = self.whole_reads = self.switches = 0
        self.read_s = 0.0

    @property
    def _region_rows(self) -> int:
        """The region's planned rows: two halves with overlap, else one."""
        return self._half_rows * (2 if self.overlap else 1)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._region = None
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
        # the whole region holds twice a half's rows; the blocks held stay as planned (two superbatches)
        cap = self._half_rows * (1 if self.halves or not self.overlap else 2)
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
            if group and count + new > cap:
                first = b
                break
            self._mark[ids] = True
            count += new
            group.append(b)
        self._marked, self._collected_halves = count, self.halves
        return group, first

    def start(self, group: list, busy: bool) -> Future | None:
        """Begin reading the group's rows (in the background); None for no group, or when the group needs
        the region the active superbatch still uses (busy: its batches are computing), to be started
        again once they are done. Rows the active superbatch holds are copied from it instead of read."""
        if not group:
            return None
        half = None
        if self._collected_halves and self._marked <= self._half_rows:
            if self._active is None:
                half = 0
            elif self._active.half is not None:
                half = 1 - self._active.half
            elif not busy:  # back to halves after a whole-region superbatch, which is done now
                self.release()
                half = 0
        if half is None and busy and self._active is not None:
            return None
        ids = np.flatnonzero(self._mark)
        self._mark[ids] = False
        ids = torch.from_numpy(ids)
        if half is None:
            self.release()  # the whole region is overwritten: nothing is carried
            buf, held = self._whole(len(ids)), None
        else:
            lo = half * self._half_rows
            buf = self._ensure_region()[lo : lo + self._half_rows]
            held = self._slot[ids] if self._active is not None else None
        return self._pool.submit(self._fill, group, ids, held, buf, half)

    def _ensure_region(self) -> torch.Tensor:
        if self._region is None:
            self._region = torch.empty(
                (self._region_rows, self.features.stored_dim), dtype=self.features.dtype
            )
        return self._region

    def _whole(self, rows: int) -> torch.Tensor:
        """The whole region, grown when one batch alone holds more rows (nothing is active then)."""
        if self._region is not None and self._region.shape[0] < rows:
            self._region = None  # free the old one before allocating its successor
        if self._region is None:
            size = max(rows, self._region_rows)
            self._region = torch.empty((size, self.features.stored_dim), dtype=self.features.dtype)
        return self._region

    def _fill(self, group: list, ids: torch.Tensor, held, buf: torch.Tensor, half: int | None) -> Staged:
        """Read side: carried rows first copied from the active superbatch, the rest read from disk."""
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
        return Staged(group, order, buf[: len(ids)], half, read, time.perf_counter() - t0)

    def activate(self, staged: Staged) -> None:
        """Make `staged` the superbatch gathers read from (the previous one's rows are let go)."""
        if self._active is not None:
            self._slot[self._active.ids] = -1
        self._slot[staged.ids] = torch.arange(len(staged.ids), dtype=torch.int32)
        self._active = staged
        self.rows_read += staged.read
        self.rows_copied += len(staged.ids) - staged.read
        self.superbatches += 1
        self.whole_reads += staged.half is None
        self.read_s += staged.seconds

    def observe(self, batches: int, read_s: float, compute_s: float) -> None:
        """After a superbatch: how the next ones are collected. Halves hide the read behind compute but
        hold half the rows, so a superbatch spans fewer batches and the disk is swept more often. When
        the read per batch is over twice the compute per batch, the whole region wins even if its union
        only doubles (sweep/2K + compute < sweep/K); back to halves when it is under half of it."""
        if not self.adaptive or batches <= 0:
            return
        read, compute = read_s / batches, compute_s / batches
        halves = read <= 2 * compute if self.halves else read < compute / 2
        self.switches += halves != self.halves
        self.halves = halves

    def release(self) -> None:
        """After a pass: no superbatch is active (the region stays for the next pass)."""
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
            "whole_region_reads": self.whole_reads,
            "mode_switches": self.switches,
            "rows_read": self.rows_read,
            "rows_copied": self.rows_copied,
            "copied_fraction": round(self.rows_copied / total, 4) if total else None,
            "read_s": round(self.read_s, 3),
        }


def staged_batches(stager: Stager, it: Iterator[Batch], take, gather_into) -> Iterator[Batch]:
    """The loader's batches with their features, a superbatch read ahead of the one computing.
    take(rows) -> an output buffer; gather_into(batch, out) fills x / y (BatchStream._gather's work)."""
    group, left = stager.collect(it, None)
    job = stager.start(group, busy=False)
    try:
        while group:
            nxt = None
            if stager.lookahead:
                nxt, left = stager.collect(it, left)  # sampled while the current group's rows are read
            t0 = time.perf_counter()
            staged = job.result()
            wait = time.perf_counter() - t0
            job = None
            stager.activate(staged)
            if nxt:
                job = stager.start(nxt, busy=True)  # read while the current group computes, where it can be
            compute = 0.0
            for i, b in enumerate(group):
                out = take(len(b.input_nodes))
                gather_into(b, out)
                if i == 0:
                    b.gather_s += wait  # waiting for the disk is this superbatch's gather time
                group[i] = None
                t1 = time.perf_counter()
                yield b
                compute += time.perf_counter() - t1
                b = None
            stager.observe(len(group), staged.seconds, compute)
            if not stager.lookahead:
                nxt, left = stager.collect(it, left)
            if job is None:
                job = stager.start(nxt, busy=False)  # it needed the region this group used
            group = nxt
    finally:
        if job is not None:
            job.result()
        stager.release()
