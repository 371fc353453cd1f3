"""The first layer's neighbour sums of a cohort of batches, added one chunk of the feature file at a time.

Out of core, a batch's input rows are spread over the whole feature file, and holding them until the batch
computes is what limits the batches a pass over the disk can serve (training/sweep.py holds 148k rows,
76 MB, per batch on the 5M-node bench). A first layer that sums before it projects (models/sums.py: SAGE
mean / gcn, in <= out) needs, per destination of blocks[0], only the sum of its in-neighbours' rows and
its own row: 2 x 11k rows and 12 B per edge there, 13 MB a batch (scripts/probe_first_layer_sums.py,
bench/results/probe_first_layer_sums.json). So a sweep can add each chunk's rows into the sums of every
batch waiting for them and let the chunk go.

Exactness: DGL's CPU sum adds a destination's edges one after another in the block's order. The sampler
lists each destination's input-layer edges in ascending source id (NeighborBlockSampler(by_source=True)),
and the chunks come in ascending source id too, so adding chunk after chunk, each destination's edges of a
chunk in order, performs the same float additions in the same order: the sums are bit-equal to DGL's and
the layer's output (sage_from_sums) to the in-memory run's (tests/test_first_sums.py). The cohort takes the
chunks from the first to the last: a batch that joined mid-pass would add its edges in another order.

Adds: a chunk's edges for the whole cohort are index_add_ calls over consecutive pieces of at most
SCRATCH_BYTES of gathered rows (torch adds the listed rows one after another, so each destination's edges go
in in their order, piece after piece). On one thread that took half the time of adding the k-th edge of
every destination at once, round after round, and equals it bit for bit (30k edges into 200k sums: 5.6
against 10.9 ms). The pieces bound the scratch: one chunk's gathered rows for a whole cohort would cost
each batch a share as large as a third of its sums.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

# The gathered rows one index_add_ adds (the scratch a pass reuses): large enough that a call's own cost
# is small beside its rows' (4k rows of 256 float32 features).
SCRATCH_BYTES = 4 << 20


class CohortSums:
    """Running first-layer sums for a cohort of batches: add(c, rows) with chunk c's rows (chunk bounds
    `starts`, node ids, ascending), then batch(i) -> (sums, own rows, in-degrees) of batch i's blocks[0].

    blocks[0] of each batch must list each destination's edges in ascending source id (ValueError if not).
    scratch: a float tensor of at least SCRATCH_BYTES to gather rows into (scratch_for; cohorts of one pass
    after another share it), else one of its own.
    """

    def __init__(
        self, batches, starts: np.ndarray, dim: int, dtype: torch.dtype = torch.float32, scratch=None
    ):
        self.starts = np.asarray(starts, dtype=np.int64)
        k = len(self.starts) - 1
        # Grouped by chunk, stable: within a chunk the edges stay in (batch, destination, source) order.
        # Each batch's edges are placed straight into the cohort's arrays, so only one batch's int64
        # temporaries exist at a time: sorting the whole cohort at once held about 40 bytes an edge beside
        # the sums (a 37-batch cohort of the 5M-node bench graph: 6M edges, peak RssAnon 240 MB over plan).
        edges = [(input_nodes.numpy(), block.adj_tensors("csc")) for input_nodes, block in batches]
        counts = np.zeros((len(edges), k), dtype=np.int64)
        own, degs, self.offsets = [], [], [0]
        for b, (inp, (ip, ind, _)) in enumerate(edges):
            gsrc = inp[ind.numpy()].astype(np.int64)
            deg = np.diff(ip.numpy())
            row = np.repeat(np.arange(len(deg), dtype=np.int64), deg)
            if np.any((np.diff(gsrc) < 0) & (row[1:] == row[:-1])):
                raise ValueError("blocks[0] must list each destination's edges in ascending source id")
            counts[b] = np.bincount(self._chunk_of(gsrc), minlength=k)
            own.append(inp[: len(deg)].astype(np.int64))
            degs.append(torch.from_numpy(deg.astype(np.int64)))
            self.offsets.append(self.offsets[-1] + len(deg))
        ids = (
            np.int32
            if self.offsets[-1] < 2**31 and int(np.diff(self.starts).max(initial=0)) < 2**31
            else np.int64
        )
        # where batch b's edges of chunk c begin: chunk-major, then batch
        begin = (np.cumsum(counts.T.ravel()) - counts.T.ravel()).reshape(k, len(edges))
        total = int(counts.sum())
        self.bounds = np.append(begin[:, 0] if len(edges) else np.zeros(k, np.int64), total)
        self.row, self.src = np.empty(total, dtype=ids), np.empty(total, dtype=ids)
        for b, (inp, (ip, ind, _)) in enumerate(edges):
            gsrc = inp[ind.numpy()].astype(np.int64)
            chunk = self._chunk_of(gsrc)
            # a radix sort on 16-bit keys
            order = np.argsort(chunk.astype(np.int16 if k < 2**15 else np.int64), kind="stable")
            chunk = chunk[order]
            rank = np.arange(len(order)) - (np.cumsum(counts[b]) - counts[b])[chunk]  # within its group
            at = begin[chunk, b] + rank
            deg = np.diff(ip.numpy())
            self.row[at] = np.repeat(np.arange(len(deg), dtype=np.int64) + self.offsets[b], deg)[order]
            self.src[at] = gsrc[order] - self.starts[chunk]  # within its chunk
        own_ids = np.concatenate(own)
        self.own_order = np.argsort(own_ids, kind="stable")
        self.own_ids = own_ids[self.own_order]
        self.own_bounds = np.searchsorted(self.own_ids, self.starts)
        self.degs = degs
        n = self.offsets[-1]
        self.sums, self.own = mapped_zeros(n, dim, dtype), mapped_zeros(n, dim, dtype)
        self._scratch = scratch_for(dim, dtype) if scratch is None else scratch
        self._piece = max(1, self._scratch.numel() // max(dim, 1))

    def _chunk_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, ids, side="right") - 1

    @property
    def nbytes(self) -> int:
        """What the cohort holds: sums and own rows, the edge lists (not the scratch it may share)."""
        arrays = (self.row, self.src, self.own_order, self.own_ids)
        tensors = (self.sums, self.own)
        return sum(a.nbytes for a in arrays) + sum(t.numel() * t.element_size() for t in tensors)

    def add(self, c: int, rows: torch.Tensor) -> None:
        """Chunk c's rows (rows[i] is node starts[c] + i) into the sums and the own rows they hold."""
        lo = int(self.starts[c])
        rows = rows.to(self.sums.dtype)  # fp16 / bf16-stored rows: the model reads them as float32
        a, b = int(self.bounds[c]), int(self.bounds[c + 1])
        dim = self.sums.shape[1]
        for lo_e in range(a, b, self._piece):
            hi_e = min(b, lo_e + self._piece)
            out = self._scratch.view(-1)[: (hi_e - lo_e) * dim].view(hi_e - lo_e, dim)
            picked = torch.index_select(rows, 0, torch.from_numpy(self.src[lo_e:hi_e]), out=out)
            self.sums.index_add_(0, torch.from_numpy(self.row[lo_e:hi_e]), picked)
        o0, o1 = int(self.own_bounds[c]), int(self.own_bounds[c + 1])
        if o1 > o0:
            self.own[torch.from_numpy(self.own_order[o0:o1])] = rows[
                torch.from_numpy(self.own_ids[o0:o1] - lo)
            ]

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sums, own rows, in-degrees) of batch i's first-layer destinations, once every chunk was added."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return self.sums[lo:hi], self.own[lo:hi], self.degs[i]


def scratch_for(dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A scratch for CohortSums' gathers: SCRATCH_BYTES, at least one row."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.empty(max(dim, SCRATCH_BYTES // itemsize), dtype=dtype)


def mapped_zeros(rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """A [rows, dim] zero tensor in its own anonymous mapping: the kernel takes its pages back when the cohort
    goes. From the heap (cohorts below glibc's 32 MB mmap threshold, utils/alloc.py) each cohort left
    holes the next one's sizes did not fill: on the 1M-node bench graph (cohorts of two batches) peak
    RssAnon read 792 MB against 764 MB planned, 751 MB with the cohorts in their own mappings. In 2 MiB pages
    where the kernel allows (transparent huge pages on madvise): faulting a cohort's 58 MB in 4 KiB pages
    took 50-200 ms of the pass's CPU, 6.5 ms in huge pages."""
    count = rows * dim
    if count == 0:
        return torch.zeros((rows, dim), dtype=dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(-1, count * itemsize, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # not offered here: 4 KiB pages, slower to fault in, the same zeros
            pass
    return torch.frombuffer(buf, dtype=dtype).view(rows, dim)
