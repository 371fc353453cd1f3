"""Batches whose first layer is summed by passes over the feature file (feature_cache=read, a first layer that
sums before it projects: SAGE mean / gcn with in <= out, the neighbour sampler, fp32, no input dropout):
the training batches and the evaluation ones (a SumSweep each; they never run at once).

The row sweep (training/sweep.py) holds every input row of a batch until the batch computes: 148k rows,
76 MB a batch on the 5M-node bench, so a pass over the file serves as many batches as the memory left
holds rows for. This one holds, per batch, the first layer's running neighbour sums and its destinations'
own rows (training/first_sums.py: 2 x 11k rows there), so the same memory carries several times more
batches per pass, and the model gets the first layer's sums instead of rows to gather and aggregate.

Batches go in cohorts: a cohort is sampled (in the caller's thread, in order, as any stream samples), its
first-layer edges planned, then one pass over the file, first chunk to last (the order its sums must be
added in to equal DGL's), adds every chunk into the cohort's sums, in a thread, the next chunk read while
one is added. While a cohort's pass runs, the cohort before it computes, and the one after it is sampled.
So two cohorts' sums are held, and one cohort's sampled blocks beside them: the two together are as many
batches as fit what the memory plan gave the cohorts (training/memory_plan.py, sums_bytes), and each
cohort takes what the one before it leaves of that (an odd count alternates k + 1 and k: 3.5 batches a
pass where 7 fit, not 3).

Why cohorts and not batches joining the sweep wherever it is: a batch's sums must be added from its first
chunk on to equal DGL's, so a batch joining mid-file needs its edges listed from there, in every run, at
join points fixed whatever the budget. Simulated with the 1M-node bench's pass (0.5 s) and step (0.1 s),
such points served more batches a pass than cohorts only when few (8), and those capped the 5M-node
graph's 64 batches held at 8 a pass: a slot freed while the model computes misses its successor's point.
Bit-equal to training with the features in RAM: same batches, same sums, same weights.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np

from gnnscale.sampling.batch import Batch, next_sampled
from gnnscale.storage.feature_reader import settle
from gnnscale.training.first_sums import SCRATCH_BYTES, CohortSums, scratch_for
from gnnscale.training.threads import single_threaded
from gnnscale.utils.ui import info

# Rows read per step of a pass: long reads for the disk (the reader splits them into requests in flight),
# and a small buffer (two of them): what the memory plan gives a 1M-node graph in 0.9 GB is a few cohorts'
# batches, and every MB of buffer is taken from them.
CHUNK_BYTES = 8 << 20
# At most this many batches a cohort: past that a pass costs less than the cohort's compute anyway.
MOST_BATCHES = 256
# A cohort's edge lists per edge: destination and source (int32 each).
EDGE_BYTES = 4 * 2
# A sampled first block per edge, as the heap holds it: 37 batches of the 5M-node bench graph (165k
# first-layer edges and 148k input ids each) took 162 MB to sample, 20 bytes an edge beside the ids; peak
# RssAnon passed the plan by about that much while it was not counted.
SAMPLED_EDGE_BYTES = 24


def batch_bytes(b: Batch, dim: int) -> int:
    """What one batch costs a cohort (shape_bytes of its sampled blocks)."""
    return shape_bytes(
        b.blocks[0].num_dst_nodes(),
        [blk.num_edges() for blk in b.blocks],
        [blk.num_dst_nodes() for blk in b.blocks],
        len(b.input_nodes),
        dim,
    )


def shape_bytes(first_dst: int, edges, dsts, input_rows: int, dim: int) -> int:
    """What one batch costs, as one of the two cohorts held, from its sizes (edges and dsts per block, input
    layer first): its first layer's sums and own rows (float32), its edge lists, its other sampled blocks
    and input ids while the cohort waits for its pass and computes (int64 ids: CSC, edge ids), and half its
    first block: that block goes once the cohort's edge lists are made (SumSweep._plan), but the heap
    keeps its memory for the next cohort's sampling (utils/alloc.py), so one cohort's worth stays.
    The memory plan prices cohorts with it before any batch is summed; the pass's buffers and scratch are
    PASS_BYTES, once."""
    blocks = sum(int(e) * 8 * 2 + int(d) * 8 for e, d in zip(edges[1:], dsts[1:], strict=True))
    first_block = int(edges[0]) * SAMPLED_EDGE_BYTES // 2
    return (
        2 * int(first_dst) * dim * 4 + int(edges[0]) * EDGE_BYTES + blocks + first_block + int(input_rows) * 8
    )


def held_of(budget: int, per_batch: int) -> int:
    """Batches the two cohorts held at once have together: as many as fit the budget at per_batch each
    (at least one a cohort)."""
    return int(max(2, min(2 * MOST_BATCHES, int(budget) // max(int(per_batch), 1))))


def batches_a_pass(budget: int, per_batch: int) -> float:
    """Batches a pass serves, on average: cohorts alternate, each taking what the one before leaves."""
    return held_of(budget, per_batch) / 2


# What a pass holds whatever its cohort: two chunk buffers (one read while the other is added) and the
# gather scratch.
PASS_BYTES = 2 * CHUNK_BYTES + SCRATCH_BYTES


class SumSweep:
    """The passes and their cohorts (see the module doc). budget: bytes the cohorts may hold."""

    def __init__(self, features, reader, budget: int, *, what: str = "training batches"):
        self.features, self.reader, self.what = features, reader, what
        self.budget = max(0, int(budget))
        self.starts = reader.spans(max(1, CHUNK_BYTES // max(reader.row_bytes, 1)))
        self.dim = int(features.stored_dim)
        self._stop = threading.Event()
        self.passes = self.batches = self.held = 0
        self.read_s = self.cpu_s = self.wait_s = 0.0
        self.rows_read = 0
        self._scratch = scratch_for(self.dim)  # the passes run one at a time: one scratch for all

    def held_for(self, b: Batch) -> int:
        """Batches two cohorts hold together: as many as fit the budget, each at batch_bytes (two at least)."""
        return held_of(self.budget, batch_bytes(b, self.dim))

    def _pass(self, cohort: CohortSums, bufs) -> None:
        """Every chunk of the file, first to last, added into the cohort (the sweep's thread)."""
        cpu0 = time.thread_time()
        starts, reader = self.starts, self.reader
        job = reader.read_span(starts[0], starts[1], bufs[0])
        try:
            for c in range(len(starts) - 1):
                t0 = time.perf_counter()
                rows = job.result()
                self.read_s += time.perf_counter() - t0
                job = None
                if self._stop.is_set():
                    return
                if c + 2 < len(starts):  # the next chunk read while this one is added
                    job = reader.read_span(starts[c + 1], starts[c + 2], bufs[(c + 1) % 2])
                lo, hi = int(starts[c]), int(starts[c + 1])
                cohort.add(c, rows.view(self.features.dtype).view(hi - lo, self.dim))
            self.rows_read += int(starts[-1])
            self.passes += 1
        finally:
            if job is not None:
                settle([job])  # no read may still write into a buffer once this returns
            self.cpu_s += time.thread_time() - cpu0

    def _sample(self, it, k: int) -> list[Batch]:
        out = []
        while len(out) < k:
            b = next_sampled(it)
            if b is None:
                break
            out.append(b)
        return out

    def _plan(self, batches: list[Batch]) -> CohortSums:
        cohort = CohortSums(
            [(b.input_nodes, b.blocks[0]) for b in batches], self.starts, self.dim, scratch=self._scratch
        )
        for b in batches:  # the model reads the sums instead: its largest block goes now
            b.blocks = [None, *b.blocks[1:]]
        return cohort

    def stream(self, it: Iterator[Batch], finish: Callable[[Batch], None]) -> Iterator[Batch]:
        """The loader's batches, in order, each with b.first = (sums, own rows, in-degrees) of its first
        layer; finish(b) sets what else the model reads (labels)."""
        self._stop.clear()
        pool = ThreadPoolExecutor(1, thread_name_prefix="gnnscale-sums", initializer=single_threaded)
        rows = int(np.diff(self.starts).max())
        bufs = [self.reader.span_buffer(rows) for _ in range(2)]
        job = None
        try:
            cur = self._sample(it, 1)
            if not cur:
                return
            held = self.held_for(cur[0])
            if held != self.held:  # said once a run (the first epoch), again only if it changes
                mb = batch_bytes(cur[0], self.dim) / 1e6
                a_pass = f"{held // 2}" if held % 2 == 0 else f"{held // 2}-{held // 2 + 1}"
                info(
                    f"{self.what}: first layer summed as the feature file is read, {a_pass} batches a pass "
                    f"({mb:,.0f} MB each, two passes' worth, {held}, held in {self.budget / 1e9:.2f} GB)"
                )
                self.held = held
            cur += self._sample(it, (held + 1) // 2 - 1)
            sums = self._plan(cur)
            job = pool.submit(self._pass, sums, bufs)
            while cur:
                nxt = self._sample(it, held - len(cur))  # sampled while the pass runs; both held next
                t0 = time.perf_counter()
                job.result()
                waited = time.perf_counter() - t0
                self.wait_s += waited
                job = None
                nxt_sums = self._plan(nxt) if nxt else None
                if nxt_sums is not None:
                    job = pool.submit(self._pass, nxt_sums, bufs)
                for i, b in enumerate(cur):
                    b.first = sums.batch(i)
                    finish(b)
                    b.gather_s = waited if i == 0 else 0.0  # waiting for the disk is the cohort's gather
                    self.batches += 1
                    cur[i] = None  # not held once the consumer lets go of it
                    yield b
                    b = None
                cur, sums = nxt, nxt_sums
        finally:
            self._stop.set()
            if job is not None:
                try:
                    job.result()
                except BaseException:  # the caller's own exception (or its close) is the one to raise
                    pass
            pool.shutdown(wait=True)

    def close(self) -> None:
        self._stop.set()

    def stats(self) -> dict:
        return {
            "mode": "first-layer sums",
            "reads": "dense",
            "batches": self.batches,
            "cohort_batches": (self.held + 1) // 2,
            "batches_held": self.held,
            "passes": self.passes,
            "batches_a_pass": round(self.batches / self.passes, 2) if self.passes else None,
            "chunks_read": self.passes * (len(self.starts) - 1),
            "rows_read": self.rows_read,
            "read_s": round(self.read_s, 3),
            "waited_s": round(self.wait_s, 3),
            "cpu_s": round(self.cpu_s, 2),
            "num_chunks": len(self.starts) - 1,
        }
