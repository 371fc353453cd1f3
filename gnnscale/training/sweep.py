"""Features read by a cyclic sweep over the feature file (train.feature_cache=read): each batch's rows
picked up as the sweep passes them, so one pass over the disk serves every batch in flight.

On a graph whose features do not fit in RAM, a batch's rows are spread over the whole file: reading
them costs about one pass over it however few they are (coalesced reads at the disk's streaming rate
beat scattered small ones). A superbatch staged whole (the union of its batches' rows held at once)
makes many batches share a pass, but the union grows with every batch and must all fit in RAM. Here a
background thread sweeps the file chunk by chunk, round and round, reading in each chunk the rows the
batches in flight need and handing each batch its own slice; a batch is complete one sweep after it
joined and is then gathered from RAM. A batch holds rows only for the part of the sweep it has seen,
so with batches joining evenly along the sweep the rows held average half of what they will hold: as
many batches share a pass as a union staged whole in the same memory, and the reads overlap compute,
which a union staged whole cannot (two halves that do span half as many). MariusGNN and DiskGNN also
turn random row reads into sequential ones; Ginex's superbatch is the look-ahead.

Reads: chunks are cut at shard boundaries, so each is one byte range of one file. Where the batches in
flight need rows closer together than the reader's coalescing gap (reads_dense: the usual case, since
they hold a good share of the rows), a chunk is read whole straight into one of two chunk buffers
(FeatureReader.read_span, 4 MiB requests all in flight) and each batch's rows are cut out of it; else
only the union of their rows is read (FeatureReader.read_rows: sorted, coalesced). A batch's pieces
are in node order, each with the positions its rows take in the batch's input rows, so the gather is
one scatter copy per piece.

Memory: the rows held stay under `row_cap`. When a chunk would overflow it, the batches that joined
last give back the rows they got first (read again as the sweep comes round to them, which is when
those batches would have been complete: they wait only for the chunks given back, and the chunks are
read for the other batches anyway); the oldest batch always takes its rows (past the cap by at most its
own), so it always completes. At most `max_batches` are in flight (the sampled blocks held), joining
spaced along the sweep.

Determinism: batches are sampled in order, in the caller's thread, only when the stream admits them, and
handed out in that order with their rows copied bit for bit, so a run equals an in-memory one batch for
batch. lookahead=False (samplers that draw from torch's RNG during a batch): one batch in flight, sampled
after the one before computed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import torch

from gnnscale.sampling.batch import Batch, next_sampled
from gnnscale.storage.feature_reader import settle
from gnnscale.storage.feature_store import FeatureStore

# Rows the sweep reads in one step (a chunk of node ids): large enough for the disk's streaming rate,
# small enough that the chunk's buffer and the spacing of joins stay fine-grained.
CHUNK_BYTES = 32 << 20
# Batches in flight per batch the held rows could hold whole: evenly spaced along the sweep they hold half
# their rows on average, but joins are not even. On the 5M-node bench (bench_outofcore.py, 3 GB cap, about
# 10 whole batches' rows): 1.3 gave back no rows, 1.45 gave back under 1 % of the rows it read and ran 8 %
# faster, 1.6-2.2 gave back a fifth or more (batches waiting a second pass) and ran slower than either.
FLIGHT_PER_CAPACITY = 1.45
# With rows for few whole batches, one join more or less is a large share: on the 2M-node bench (1.5 GB
# cap, 3.3 whole batches' rows) 1.45 gave back 9.8M rows in 300 batches (a pass served 2.8 of the 4.9 in
# flight); 1.2 and 1.0 gave back none and ran 1.26x faster.
FEW_BATCHES, FLIGHT_PER_CAPACITY_FEW = 8.0, 1.2


def flight_target(row_cap: int, mean_rows: float, max_batches: int) -> int:
    """Batches in flight: as many as the rows held carry (FLIGHT_PER_CAPACITY), up to max_batches.
    Rounded: with 3.3 whole batches' rows, 1.2 x 3.35 let a fifth batch join where 1.2 x 3.32 did not,
    and that run gave back 9M rows (2M-node bench)."""
    whole = row_cap / max(mean_rows, 1.0)
    carry = whole * (FLIGHT_PER_CAPACITY if whole >= FEW_BATCHES else FLIGHT_PER_CAPACITY_FEW)
    return int(max(1, min(max_batches, round(carry))))


def reads_dense(num_nodes: int, row_bytes: int, row_cap: int, gap_bytes: int = 64 << 10) -> bool:
    """Whether the sweep reads its chunks whole: the rows the batches in flight need (about
    FLIGHT_PER_CAPACITY x row_cap of them, spread over the file) lie closer together than the gap the
    reader's coalesced sparse reads would read through anyway (FeatureReader.gap_bytes)."""
    density = min(1.0, FLIGHT_PER_CAPACITY * row_cap / max(num_nodes, 1))
    return row_bytes <= density * gap_bytes


class InFlight:
    """One batch in flight: its rows not in the hot cache, sorted (ids), where each goes in the batch's
    input rows (dst), and the slices the sweep handed it."""

    def __init__(self, batch: Batch, ids: np.ndarray, dst: np.ndarray, bounds: np.ndarray):
        self.batch, self.ids, self.dst, self.bounds = batch, ids, dst, bounds
        counts = np.diff(bounds)
        self.missing = set(np.flatnonzero(counts).tolist())  # chunks whose rows it still needs
        self.pieces: dict[int, torch.Tensor] = {}
        self.reading = 0  # chunks being read for it
        self.held = 0  # rows handed to it or reserved for the chunks being read

    @property
    def complete(self) -> bool:
        return not self.missing and not self.reading

    def count(self, chunk: int) -> int:
        return int(self.bounds[chunk + 1] - self.bounds[chunk])


class Sweeper:
    """The sweep and the batches in flight (see the module doc). row_cap: rows the batches may hold in
    all; max_batches: batches in flight at most; lookahead=False: one. dense: read each chunk whole
    (FeatureReader.read_span) rather than its needed rows (read_rows); None: as reads_dense says."""

    def __init__(
        self,
        features: FeatureStore,
        reader,
        row_cap: int,
        max_batches: int,
        *,
        lookahead: bool = True,
        chunk_rows: int = 0,
        dense: bool | None = None,
    ):
        self.features, self.reader = features, reader
        self.lookahead = bool(lookahead)
        self.row_cap = max(1, int(row_cap))
        self.max_batches = max(1, int(max_batches)) if self.lookahead else 1
        n = features.num_nodes
        self.chunk_rows = int(chunk_rows) or max(1, CHUNK_BYTES // max(reader.row_bytes, 1))
        if dense is None:
            dense = reads_dense(n, reader.row_bytes, self.row_cap, reader.gap_bytes)
        self.dense = bool(dense) and self.lookahead
        if self.lookahead:  # chunks cut at shard boundaries: a chunk is one byte range of one file
            self._starts = reader.spans(self.chunk_rows)
        else:  # one batch at a time: its rows in one coalesced read, as a batch's own gather
            self._starts = np.array([0, n], dtype=np.int64)
        self.num_chunks = len(self._starts) - 1
        self._staged: tuple | None = None  # (positions, pieces) of the batch being gathered
        self._staged_held = 0  # its rows
        self._cv = threading.Condition()
        self._flight: deque[InFlight] = deque()
        self._held = 0
        self._pos = 0  # the next chunk the sweep looks at
        self._steps = 0  # chunks read so far
        self._join_at = 0.0  # _steps from which the next batch may join
        self._mean_rows = 0.0
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.rows_read = self.rows_evicted = self.batches = self.chunks = 0
        self.read_s = 0.0
        self._in_flight_sum = self._takes = 0

    def close(self) -> None:
        self.stop()
        self._staged = None

    # ------------------------------------------------------------ the caller's side
    def _uncached(self, nodes: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(ids, dst): the batch's rows not in the hot cache in node order, and their input positions."""
        slot = self.features.hot_slot
        nodes = nodes.to(torch.int64)
        keep = np.arange(len(nodes)) if slot is None else np.flatnonzero((slot[nodes] < 0).numpy())
        # sorted once here, a piece of the sweep is copied straight into its positions at gather time
        dst = keep[np.argsort(nodes.numpy()[keep], kind="stable")]
        return nodes.numpy()[dst], dst

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    def may_join(self) -> bool:
        """Whether the next batch may join now: room in flight, and spaced along the sweep."""
        if not self._flight:
            return True
        return len(self._flight) < self._target() and self._steps >= self._join_at

    def _target(self) -> int:
        return flight_target(self.row_cap, self._mean_rows, self.max_batches)

    def _spacing(self) -> float:
        """Chunks of sweep between joins: the batches in flight spread over a pass."""
        return self.num_chunks / self._target()

    def join(self, batch: Batch) -> None:
        ids, dst = self._uncached(batch.input_nodes)
        flight = InFlight(batch, ids, dst, np.searchsorted(ids, self._starts))
        self._mean_rows = len(ids) if not self.batches else 0.9 * self._mean_rows + 0.1 * len(ids)
        with self._cv:
            self._flight.append(flight)
            gap = self._spacing()  # a join the caller was late for is caught up, not lost (one at most)
            self._join_at = max(self._join_at, self._steps - gap) + gap
            self.batches += 1
            self._cv.notify_all()

    def wait(self, joining: bool) -> tuple[bool, float]:
        """Block until the oldest batch is complete or (joining: batches are left) another may join:
        (oldest complete, seconds waited)."""
        t0 = time.perf_counter()
        with self._cv:
            self._cv.wait_for(
                lambda: self._error or self._flight[0].complete or (joining and self.may_join())
            )
            if self._error is not None:
                raise self._error
            return self._flight[0].complete, time.perf_counter() - t0

    def take(self) -> Batch:
        """The oldest batch, its rows made the ones gather() reads (still counted as held until
        done_with: they live beside the gathered copy until then)."""
        with self._cv:
            self._in_flight_sum += len(self._flight)
            self._takes += 1
            f = self._flight.popleft()
        chunks = sorted(f.pieces)
        at = [torch.from_numpy(f.dst[f.bounds[c] : f.bounds[c + 1]]) for c in chunks]
        self._staged = (at, [f.pieces.pop(c) for c in chunks])
        self._staged_held = f.held
        return f.batch

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The batch's rows from the hot-feature cache and what the sweep read for it."""
        return self.features.gather(ids, out=out, staged=self._staged)

    def done_with(self) -> None:
        self._staged = None
        with self._cv:
            self._held -= self._staged_held
            self._staged_held = 0
            self._cv.notify_all()

    def start(self) -> None:
        self._stop, self._error = False, None
        self._thread = threading.Thread(target=self._sweep, name="gnnscale-sweep", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._flight.clear()
        self._held = self._staged_held = 0

    # ------------------------------------------------------------ the sweep (its own thread)
    def _next_chunk(self) -> int | None:
        needed = set()
        for f in self._flight:
            needed |= f.missing
        if not needed:
            return None
        return min(needed, key=lambda c: (c - self._pos) % self.num_chunks)

    def _receivers(self, chunk: int) -> list[InFlight]:
        """The batches that take this chunk's rows, oldest first, their rows reserved; younger ones give
        rows back when they would pass row_cap (the oldest always takes its own)."""
        takers = []
        for i, f in enumerate(self._flight):
            if chunk not in f.missing:
                continue
            need = f.count(chunk)
            for young in reversed(list(self._flight)[i + 1 :]):
                if self._held + need <= self.row_cap:
                    break
                self._evict(young, self._held + need - self.row_cap)
            if self._held + need <= self.row_cap or i == 0:
                self._held += need
                f.held += need
                f.missing.discard(chunk)
                f.reading += 1
                takers.append(f)
        return takers

    def _evict(self, f: InFlight, rows: int) -> None:
        """Drop at least `rows` of the rows a batch was handed, those it got first: the sweep reaches their
        chunks again last, just as the batch would have been complete, so it waits only for those."""
        for c in list(f.pieces):  # in the order handed over
            if rows <= 0:
                break
            n = len(f.pieces.pop(c))
            f.missing.add(c)
            f.held -= n
            self._held -= n
            self.rows_evicted += n
            rows -= n

    def _plan(self):
        """Under the lock: the next chunk, its takers and their rows (None: nothing to read)."""
        chunk = self._next_chunk()
        if chunk is None:
            return None
        takers = self._receivers(chunk)
        self._pos = (chunk + 1) % self.num_chunks
        if not takers:
            return None
        return chunk, takers, [f.ids[f.bounds[chunk] : f.bounds[chunk + 1]] for f in takers]

    def _sweep(self) -> None:
        # Two stages: the next chunk is read while the one before is cut into its takers' pieces. (Three
        # chunks in flight read no faster in training on the 5M-node bench, and cost a chunk buffer more.)
        reads = ThreadPoolExecutor(1, thread_name_prefix="gnnscale-sweep-read")
        # one chunk (lookahead=False): each read into its own tensor, handed over whole
        bufs = [self._chunk_buffer(), self._chunk_buffer()] if self.num_chunks > 1 else [None, None]
        ahead = None  # (chunk, takers, segs, the read: result() -> rows)
        k = 0
        try:
            while True:
                with self._cv:
                    if ahead is None:  # else the chunk being read is delivered first, waiting or not
                        self._cv.wait_for(lambda: self._stop or self._next_chunk() is not None)
                    if self._stop:
                        return
                    planned = self._plan()
                nxt = None
                if planned is not None:
                    chunk, _, segs = planned
                    buf = bufs[k % 2]
                    if self.dense:  # queued behind the chunk before's requests: the disk does not wait
                        job = self.reader.read_span(self._starts[chunk], self._starts[chunk + 1], buf)
                    else:
                        job = reads.submit(self._read, segs, buf)
                    nxt = (*planned, job)
                    k += 1
                if ahead is not None:
                    self._deliver(*ahead)
                ahead = nxt
        except BaseException as exc:  # handed to the caller's thread, which raises it
            with self._cv:
                self._error = exc
                self._cv.notify_all()
        finally:
            if ahead is not None:
                settle([ahead[3]])  # no read may still write into a buffer once this returns
            reads.shutdown(wait=True)

    def _chunk_buffer(self):
        rows = int(np.diff(self._starts).max())
        if self.dense:
            return self.reader.span_buffer(rows)
        return torch.empty((rows, self.reader.feat_dim), dtype=self.reader.dtype)

    def _read(self, segs: list, buf: torch.Tensor | None) -> tuple[np.ndarray, torch.Tensor]:
        """One chunk: the union of the takers' rows, read once."""
        union = segs[0] if len(segs) == 1 else np.unique(np.concatenate(segs))
        rows = self.reader.read_rows(torch.from_numpy(union), out=None if buf is None else buf[: len(union)])
        self.rows_read += len(union)
        self.chunks += 1
        return union, rows

    def _deliver(self, chunk: int, takers: list, segs: list, job) -> None:
        """Each taker's rows copied out of the chunk it waited for."""
        t0 = time.perf_counter()
        if self.dense:
            rows, lo = job.result(), int(self._starts[chunk])
            self.read_s += time.perf_counter() - t0
            self.chunks += 1
            needed = np.zeros(len(rows), dtype=bool)
            pieces = []
            for seg in segs:
                at = seg - lo
                needed[at] = True
                pieces.append(rows.index_select(0, torch.from_numpy(at)).view(self.reader.dtype))
            self.rows_read += int(np.count_nonzero(needed))  # the rows asked for: what the read was for
        else:
            union, rows = job.result()
            self.read_s += time.perf_counter() - t0
            pieces = self._cut(union, rows, segs)
        with self._cv:
            for f, piece in zip(takers, pieces, strict=True):
                f.pieces[chunk] = piece
                f.reading -= 1
            self._steps += 1
            self._cv.notify_all()

    def _cut(self, union: np.ndarray, rows: torch.Tensor, segs: list) -> list:
        if len(segs) == 1:
            pieces = [rows if self.num_chunks == 1 else rows.clone()]  # one chunk: the read's own tensor
        else:
            pieces = [rows[torch.from_numpy(np.searchsorted(union, s))] for s in segs]
        return pieces

    def stats(self) -> dict:
        return {
            "mode": "sweep",
            "reads": "dense" if self.dense else "sparse",
            "batches": self.batches,
            "chunks_read": self.chunks,
            "rows_read": self.rows_read,
            "rows_evicted": self.rows_evicted,
            "read_s": round(self.read_s, 3),
            "in_flight_mean": round(self._in_flight_sum / max(self._takes, 1), 2),
            "max_batches": self.max_batches,
            "row_cap": self.row_cap,
            "num_chunks": self.num_chunks,
        }


def swept_batches(sweeper: Sweeper, it: Iterator[Batch], take, gather_into) -> Iterator[Batch]:
    """The loader's batches with their features, read by the sweep. take(rows) -> an output buffer;
    gather_into(batch, out) fills x / y (BatchStream._gather's work)."""
    sweeper.start()
    exhausted, waited = False, 0.0
    try:
        while True:
            while not exhausted and sweeper.may_join():
                b = next_sampled(it)
                exhausted = b is None
                if b is not None:
                    sweeper.join(b)
            if not sweeper.in_flight:
                return
            ready, seconds = sweeper.wait(joining=not exhausted)
            waited += seconds
            if not ready:
                continue  # another batch may join first
            b = sweeper.take()
            try:
                gather_into(b, take(len(b.input_nodes)))
            finally:
                sweeper.done_with()
            b.gather_s += waited  # waiting for the disk is this batch's gather time
            waited = 0.0
            yield b
            b = None
    finally:
        sweeper.stop()
