"""Features read by a cyclic sweep over the feature file (train.feature_cache=read): each batch's rows
picked up as the sweep passes them, so one pass over the disk serves every batch in flight.

On a graph whose features do not fit in RAM, a batch's rows are spread over the whole file: reading
them costs about one pass over it however few they are (coalesced reads at the disk's streaming rate
beat scattered small ones). A superbatch staged whole (the union of its batches' rows held at once)
makes many batches share a pass, but the union grows with every batch and must all fit in RAM. Here a
background thread sweeps the file chunk by chunk, round and round, reading in each chunk the rows the
batches in flight need; a batch is complete one sweep after it joined and is then gathered from RAM. A
batch holds rows only for the part of the sweep it has seen, so with batches joining evenly along the
sweep the rows held average half of what they will hold, and the reads overlap compute. MariusGNN and
DiskGNN also turn random row reads into sequential ones; Ginex's superbatch is the look-ahead.

Rows are held once however many batches in flight need them (RowPool: a slot per row, counted
references, a node -> slot map): batches share hubs and each other's neighbourhoods, and a batch taking
a chunk finds the rows a batch before it took there and still holds. On the 5M-node bench the pool held
0.7x the rows the batches referenced, so 17-20 batches shared a pass where 12.5 did with a copy each.

Reads: chunks are cut at shard boundaries, so each is one byte range of one file. Where the batches in
flight need rows closer together than the reader's coalescing gap (reads_dense: the usual case, since
they hold a good share of the rows), a chunk is read whole straight into one of two chunk buffers
(FeatureReader.read_span, 4 MiB requests all in flight) and the rows not held yet are copied into the
pool; else only those rows are read (FeatureReader.read_rows: sorted, coalesced). The gather is one
select from the pool into the batch's input rows.

Memory: the pool holds row_cap rows plus spare_rows. The batches in flight are as many as keep the rows
held under row_cap (_adjust: one more after a pass with room for another batch's share, one fewer after a
pass that passed it), since how much they share is known only once they are read. A younger batch that
would leave no room for the rows the oldest still needs waits a pass for that chunk; the oldest always
takes its rows (the youngest give theirs back where the pool is full), so it always completes. At most
`max_batches` are in flight (the sampled blocks held), joining spaced along the sweep.

Determinism: batches are sampled in order, in the caller's thread, only when the stream admits them, and
handed out in that order with their rows copied bit for bit, so a run equals an in-memory one batch for
batch. lookahead=False (samplers that draw from torch's RNG during a batch): one batch in flight, sampled
after the one before computed.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import torch

from gnnscale.sampling.batch import Batch, next_sampled
from gnnscale.storage.feature_reader import aligned_buffer, settle
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


def node_map_bytes(num_nodes: int) -> int:
    """RowPool's node -> slot map."""
    return num_nodes * (8 if num_nodes >= 2**31 else 4)


# Rows RowPool.write moves per step (1 MB of 512-byte rows: the scratch block stays in cache).
WRITE_BLOCK = 2048
# RowPool's memory per slot beside the row: its node (int64), reference count (int32), free-stack entry (int64)
SLOT_INDEX_BYTES = 8 + 4 + 8


class RowPool:
    """The rows read ahead, each held once however many batches in flight need it: a slot per row,
    counted references, a node -> slot map so a batch taking a chunk finds the rows of it still held. The
    batches in flight share many rows (hubs, and any two batches' neighbourhoods): on the 5M-node bench
    graph 20 batches' input rows are 0.62x their sum, 30 batches' 0.54x."""

    def __init__(self, num_nodes: int, row_bytes: int, dtype: torch.dtype, capacity: int):
        self.row_bytes, self.dtype = row_bytes, dtype
        # rows moved as the widest words they divide into: torch copies uint8 rows 3x slower than int64
        self.word = next(
            w for w in (torch.int64, torch.int32, torch.int16, torch.uint8) if not row_bytes % w.itemsize
        )
        self._scratch = torch.empty((WRITE_BLOCK, row_bytes // self.word.itemsize), dtype=self.word)
        self.slot_of = np.full(num_nodes, -1, dtype=np.int64 if num_nodes >= 2**31 else np.int32)
        self.capacity = 0
        self.rows = torch.empty((0, row_bytes // self.word.itemsize), dtype=self.word)
        self.node = np.empty(0, dtype=np.int64)
        self.refs = np.empty(0, dtype=np.int32)
        self.free = np.empty(0, dtype=np.int64)  # a stack: the slots used last are used first
        self.nfree = 0
        self.grown = 0
        self._grow(max(1, capacity))

    @property
    def used(self) -> int:
        return self.capacity - self.nfree

    def _grow(self, capacity: int) -> None:
        """Only where the oldest batch alone outgrows the rows held (a batch larger than planned)."""
        old = self.capacity
        buf = aligned_buffer(capacity * self.row_bytes)  # pages touched as slots fill
        if hasattr(mmap, "MADV_HUGEPAGE"):  # rows land on random slots: 2 MB pages copy them 20-30 % faster
            buf.madvise(mmap.MADV_HUGEPAGE)
        rows = torch.frombuffer(buf, dtype=self.word, count=capacity * self.rows.shape[1]).view(capacity, -1)
        if old:
            rows[:old] = self.rows
            self.grown += 1
        self.rows = rows
        self.node = np.concatenate([self.node, np.full(capacity - old, -1, dtype=np.int64)])
        self.refs = np.concatenate([self.refs, np.zeros(capacity - old, dtype=np.int32)])
        free = np.empty(capacity, dtype=np.int64)
        free[: self.nfree] = self.free[: self.nfree]
        free[self.nfree : self.nfree + capacity - old] = np.arange(capacity - 1, old - 1, -1)
        self.free, self.nfree, self.capacity = free, self.nfree + capacity - old, capacity

    def alloc(self, n: int) -> np.ndarray:
        if n > self.nfree:
            self._grow(self.capacity + max(n - self.nfree, self.capacity // 8))
        self.nfree -= n
        return np.sort(self.free[self.nfree : self.nfree + n])  # written in address order: 25 % faster

    def held(self, ids: np.ndarray) -> np.ndarray:
        """Slots of these nodes' rows held (-1: not held)."""
        return self.slot_of[ids].astype(np.int64)

    def release(self, slots: np.ndarray) -> int:
        """One reference fewer on each slot (distinct slots); rows nobody needs any more go. -> rows freed."""
        self.refs[slots] -= 1
        gone = slots[self.refs[slots] == 0]
        nodes = self.node[gone]
        mapped = self.slot_of[nodes] == gone  # a node read again while its old copy was still held
        self.slot_of[nodes[mapped]] = -1
        self.free[self.nfree : self.nfree + len(gone)] = gone
        self.nfree += len(gone)
        return len(gone)

    def write(self, slots: np.ndarray, rows: torch.Tensor, at: np.ndarray | None = None) -> None:
        """rows[at] (rows: [n, row_bytes] uint8; at: all of them where None) into slots given by alloc (no
        lock: nobody reads them yet). Through a small scratch block: a temporary the size of the rows would
        be fresh pages to fault in at every chunk."""
        rows = rows.view(torch.uint8).view(self.word)
        for lo in range(0, len(slots), WRITE_BLOCK):
            hi = min(lo + WRITE_BLOCK, len(slots))
            src = rows[lo:hi] if at is None else self._scratch[: hi - lo]
            if at is not None:
                torch.index_select(rows, 0, torch.from_numpy(at[lo:hi]), out=src)
            self.rows.index_put_((torch.from_numpy(slots[lo:hi]),), src)

    def publish(self, slots: np.ndarray, ids: np.ndarray) -> None:
        """The rows written to slots are nodes ids', findable from now on."""
        self.node[slots] = ids
        self.slot_of[ids] = slots

    def source(self) -> torch.Tensor:
        return self.rows.view(torch.uint8).view(self.dtype)


class InFlight:
    """One batch in flight: its rows not in the hot cache, sorted (ids), where each goes in the batch's
    input rows (dst), and the pool slot each row was given (-1: not yet)."""

    def __init__(self, batch: Batch, ids: np.ndarray, dst: np.ndarray, bounds: np.ndarray):
        self.batch, self.ids, self.dst, self.bounds = batch, ids, dst, bounds
        self.slots = np.full(len(ids), -1, dtype=np.int64)
        counts = np.diff(bounds)
        self.missing = set(np.flatnonzero(counts).tolist())  # chunks whose rows it still needs
        self.got: list[int] = []  # chunks it holds every row of, in the order it got them
        self.reading = 0  # chunks being read for it
        self.held = 0  # slots it references

    @property
    def complete(self) -> bool:
        return not self.missing and not self.reading

    def rows(self, chunk: int) -> slice:
        return slice(int(self.bounds[chunk]), int(self.bounds[chunk + 1]))


class Sweeper:
    """The sweep and the batches in flight (see the module doc). row_cap: rows held for the batches in
    flight; spare_rows: more the oldest batch may take past it; max_batches: batches in flight at most;
    lookahead=False: one. dense: read each chunk whole (FeatureReader.read_span) rather than its needed
    rows (read_rows); None: as reads_dense says."""

    def __init__(
        self,
        features: FeatureStore,
        reader,
        row_cap: int,
        max_batches: int,
        *,
        spare_rows: int = 0,
        lookahead: bool = True,
        chunk_rows: int = 0,
        dense: bool | None = None,
    ):
        self.features, self.reader = features, reader
        self.lookahead = bool(lookahead)
        self.row_cap = max(1, int(row_cap))
        self.spare_rows = max(0, int(spare_rows))
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
        self._pool: RowPool | None = None
        self._staged: tuple | None = None  # (positions, rows, slots) of the batch being gathered
        self._staged_slots: np.ndarray | None = None
        self._cv = threading.Condition()
        self._flight: deque[InFlight] = deque()
        self._pending = 0  # slots given to chunks being read
        self._k = 0  # batches in flight wanted (0: not set yet; then adjusted a pass at a time)
        self._peak = self._deferred = 0  # this pass: the most rows held, rows a batch had to wait a pass for
        self._pos = 0  # the next chunk the sweep looks at
        self._steps = 0  # chunks read so far
        self._join_at = 0.0  # _steps from which the next batch may join
        self._mean_rows = 0.0
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.rows_read = self.rows_evicted = self.rows_found = self.rows_deferred = 0
        self.batches = self.chunks = self.pool_grown = 0
        self.read_s = self.cpu_s = 0.0
        self._in_flight_sum = self._takes = 0

    @property
    def _held(self) -> int:
        """Rows held or being read for the batches in flight and the one being gathered."""
        return self._pool.used if self._pool is not None else 0

    def _ensure_pool(self) -> RowPool:
        if self._pool is None:
            self._pool = RowPool(
                self.features.num_nodes,
                self.reader.row_bytes,
                self.reader.dtype,
                self.row_cap + self.spare_rows,
            )
        return self._pool

    def close(self) -> None:
        self.stop()
        self._staged = None

    # ------------------------------------------------------------ the caller's side
    def _uncached(self, nodes: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(ids, dst): the batch's rows not in the hot cache in node order, and their input positions."""
        slot = self.features.hot_slot
        nodes = nodes.to(torch.int64)
        keep = np.arange(len(nodes)) if slot is None else np.flatnonzero((slot[nodes] < 0).numpy())
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
        if not self._k:
            self._k = flight_target(self.row_cap, self._mean_rows, self.max_batches)
        return self._k

    def _adjust(self) -> None:
        """Under the lock, once a pass: one batch fewer in flight after a pass where a batch had to wait a
        pass for rows or the pool passed row_cap by half its spare, one more where the rows held stayed
        half a batch's share of the pool under row_cap. How much the batches in flight share (the pool held
        0.7 of the rows they referenced on the 5M-node bench) is not known ahead, so the count follows
        what the pool really holds."""
        if self._deferred or self._peak > self.row_cap + self.spare_rows // 2:
            self._k = max(1, self._k - 1)
        elif self._k and self._peak + self._shared() * self._mean_rows / 2 <= self.row_cap:
            self._k = min(self.max_batches, self._k + 1)
        self._peak = self._deferred = 0

    def _spacing(self) -> float:
        """Chunks of sweep between joins: the batches in flight spread over a pass."""
        return self.num_chunks / self._target()

    def join(self, batch: Batch) -> None:
        ids, dst = self._uncached(batch.input_nodes)
        flight = InFlight(batch, ids, dst, np.searchsorted(ids, self._starts))
        self._mean_rows = len(ids) if not self.batches else 0.9 * self._mean_rows + 0.1 * len(ids)
        with self._cv:
            self._ensure_pool()
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
        """The oldest batch, its rows made the ones gather() reads (still held until done_with)."""
        with self._cv:
            self._in_flight_sum += len(self._flight)
            self._takes += 1
            f = self._flight.popleft()
            self._staged = (torch.from_numpy(f.dst), self._pool.source(), torch.from_numpy(f.slots))
            self._staged_slots = f.slots
        return f.batch

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The batch's rows from the hot-feature cache and what the sweep read for it."""
        return self.features.gather(ids, out=out, staged=self._staged)

    def done_with(self) -> None:
        self._staged = None
        with self._cv:
            if self._staged_slots is not None:
                self._pool.release(self._staged_slots)
                self._staged_slots = None
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
        self._staged_slots = None
        self._pending = 0
        if self._pool is not None:
            self.pool_grown += self._pool.grown
        self._pool = None  # its rows go with the batches they were read for

    # ------------------------------------------------------------ the sweep (its own thread)
    def _next_chunk(self) -> int | None:
        needed = set()
        for f in self._flight:
            needed |= f.missing
        if not needed:
            return None
        return min(needed, key=lambda c: (c - self._pos) % self.num_chunks)

    def _receivers(self, chunk: int) -> tuple[list, np.ndarray, np.ndarray]:
        """The batches that take this chunk, oldest first, each referencing the rows of it the pool still
        holds; -> (takers with the rows they read, as (batch, slice of its rows, mask of those read)), the
        rows to read (chunk-local, sorted), and each read row's place in that union. A younger batch waits
        for the next pass where its new rows would leave the pool without room for the rows the oldest
        still needs; the oldest always takes its own, taking back what the youngest batches hold where the
        pool is full. (row_cap is the pool's share the batches in flight are sized for (_adjust): a cap
        that deferred batches whenever the pool passed it had them hold their rows a pass longer, and the
        deferrals cascaded.) Vectorised over the takers: a numpy call per step for all of them, not one
        per batch in flight."""
        pool, lo = self._pool, int(self._starts[chunk])
        cand = [f for f in self._flight if chunk in f.missing]
        spans = [f.rows(chunk) for f in cand]
        sizes = np.array([r.stop - r.start for r in spans], dtype=np.int64)
        at = np.concatenate([[0], np.cumsum(sizes)])
        ids = np.concatenate([f.ids[r] for f, r in zip(cand, spans, strict=True)])
        had = np.concatenate([f.slots[r] for f, r in zip(cand, spans, strict=True)])
        slots = had.copy()
        found = pool.held(ids)
        hit = (had < 0) & (found >= 0)
        slots[hit] = found[hit]
        self._ref(found[hit])
        self.rows_found += int(np.count_nonzero(hit))
        need = slots < 0
        taker = np.repeat(np.arange(len(cand)), sizes)[need]
        local = ids[need] - lo
        union, first = np.unique(local, return_index=True)
        new = np.bincount(taker[first], minlength=len(cand))
        opens = np.bincount(taker, minlength=len(cand))
        oldest = self._flight[0]
        room = pool.capacity - (len(oldest.ids) - oldest.held)
        wanted, taken = None, np.ones(len(cand), dtype=bool)
        for i, f in enumerate(cand):
            if not opens[i]:
                continue
            if wanted is not None:  # a batch before waits: its rows are not in the union
                mine = local[taker == i]
                new[i] = np.count_nonzero(~wanted[mine])
            if f is oldest:
                short = pool.used + self._pending + int(new[i]) - pool.capacity
                for young in reversed(list(self._flight)[1:]):
                    if short <= 0:
                        break
                    short -= self._evict(young)
            elif pool.used + self._pending + int(new[i]) > room:
                self._deferred += int(new[i])
                self.rows_deferred += int(new[i])
                taken[i] = False
                if wanted is None:
                    wanted = np.zeros(int(self._starts[chunk + 1]) - lo, dtype=bool)
                    wanted[local[taken[taker] & (taker < i)]] = True
                continue
            if wanted is not None:
                wanted[mine] = True
            self._pending += int(new[i])
        read = taken[taker]
        if not read.all():
            union = np.unique(local[read])
        place = np.searchsorted(union, local[read])
        for i, f in enumerate(cand):  # the rows found; the chunk is theirs where nothing is left to read
            f.slots[spans[i]] = slots[at[i] : at[i + 1]]
            f.held += int(np.count_nonzero(hit[at[i] : at[i + 1]]))
            if not opens[i]:
                f.missing.discard(chunk)
                f.got.append(chunk)
        readers = [
            (f, spans[i], need[at[i] : at[i + 1]]) for i, f in enumerate(cand) if opens[i] and taken[i]
        ]
        return readers, union, place

    def _ref(self, slots: np.ndarray) -> None:
        """One reference more on each slot, a slot as many times as it is listed."""
        u, n = np.unique(slots, return_counts=True)
        self._pool.refs[u] += n.astype(np.int32)

    def _shared(self) -> float:
        """Rows held per row the batches in flight reference (each row once however many need it)."""
        refs = sum(f.held for f in self._flight) + (
            len(self._staged_slots) if self._staged_slots is not None else 0
        )
        return min(1.0, self._pool.used / refs) if refs and self._pool is not None else 1.0

    def _evict(self, f: InFlight) -> int:
        """Give back every row a batch holds (read again as the sweep comes round) -> rows freed (those no
        other batch holds)."""
        freed = 0
        for c in f.got:
            r = f.rows(c)
            slots = f.slots[r]
            slots = slots[slots >= 0]
            freed += self._pool.release(slots)
            self.rows_evicted += len(slots)
            f.held -= len(slots)
            f.slots[r] = -1
            f.missing.add(c)
        f.got = []
        return freed

    def _plan(self):
        """Under the lock: the next chunk, its takers, the rows to read (None: nothing to read)."""
        chunk = self._next_chunk()
        if chunk is None:
            return None
        readers, union, place = self._receivers(chunk)
        self._pos = (chunk + 1) % self.num_chunks
        if not readers:
            return None
        slots = self._pool.alloc(len(union))
        self._pending -= len(union)
        self._pool.refs[slots] += np.bincount(place, minlength=len(union)).astype(np.int32)
        got = slots[place]
        k = 0
        for f, span, reads in readers:
            mine = f.slots[span]  # a view: written in place
            n = int(np.count_nonzero(reads))
            mine[reads] = got[k : k + n]
            k += n
            f.held += n
            f.missing.discard(chunk)
            f.reading += 1
        return chunk, [f for f, _, _ in readers], union, slots

    def _sweep(self) -> None:
        # Two stages: the next chunk is read while the one before is stored in the pool. (Three chunks in
        # flight read no faster in training on the 5M-node bench, and cost a chunk buffer more.)
        reads = ThreadPoolExecutor(1, thread_name_prefix="gnnscale-sweep-read")
        bufs = [self._chunk_buffer(), self._chunk_buffer()]
        ahead = None  # (chunk, takers, local rows, slots, the read: result() -> rows)
        cpu0 = time.thread_time()  # what the sweep costs the model's cores
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
                    chunk, _, local, _ = planned
                    buf = bufs[k % 2]
                    lo = int(self._starts[chunk])
                    if self.dense:  # queued behind the chunk before's requests: the disk does not wait
                        job = self.reader.read_span(lo, self._starts[chunk + 1], buf)
                    else:
                        job = reads.submit(self._read, local + lo, buf)
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
            self.cpu_s += time.thread_time() - cpu0
            if ahead is not None:
                settle([ahead[4]])  # no read may still write into a buffer once this returns
            reads.shutdown(wait=True)

    def _chunk_buffer(self):
        rows = int(np.diff(self._starts).max())
        if self.dense:
            return self.reader.span_buffer(rows)
        if self.num_chunks == 1:  # one batch in flight: read into a tensor the size of its rows
            return None
        return torch.empty((rows, self.reader.feat_dim), dtype=self.reader.dtype)

    def _read(self, ids: np.ndarray, buf: torch.Tensor | None) -> torch.Tensor:
        """The union of the takers' rows in one chunk, read once (sparse: coalesced requests)."""
        out = None if buf is None else buf[: len(ids)]
        return self.reader.read_rows(torch.from_numpy(ids), out=out).view(torch.uint8)

    def _deliver(self, chunk: int, takers: list, local: np.ndarray, slots: np.ndarray, job) -> None:
        """The rows read stored in their slots; the takers that waited for them told."""
        t0 = time.perf_counter()
        rows = job.result()
        self.read_s += time.perf_counter() - t0
        self.chunks += 1
        self.rows_read += len(local)  # the rows asked for: what the read was for
        self._pool.write(slots, rows, local if self.dense else None)
        with self._cv:
            self._pool.publish(slots, local + int(self._starts[chunk]))
            for f in takers:
                f.reading -= 1
                if chunk not in f.missing:
                    f.got.append(chunk)
            self._steps += 1
            self._peak = max(self._peak, self._pool.used)
            if self._steps % self.num_chunks == 0:
                self._adjust()
            self._cv.notify_all()

    def stats(self) -> dict:
        return {
            "mode": "sweep",
            "reads": "dense" if self.dense else "sparse",
            "batches": self.batches,
            "chunks_read": self.chunks,
            "rows_read": self.rows_read,
            "rows_found_held": self.rows_found,
            "rows_evicted": self.rows_evicted,
            "read_s": round(self.read_s, 3),
            "in_flight_mean": round(self._in_flight_sum / max(self._takes, 1), 2),
            "rows_deferred": self.rows_deferred,
            "cpu_s": round(self.cpu_s, 2),
            "batches_wanted": self._k,
            "pool_grown": self.pool_grown + (self._pool.grown if self._pool is not None else 0),
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
