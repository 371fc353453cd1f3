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

Adds: within a chunk the k-th edge of every destination is added at once (distinct destinations: one
gather, one add, one scatter for all of them, in rounds k = 0, 1, ...). On the 5M-node graph this costs
46 ms per batch for a 24-batch cohort against 55 ms for DGL's sum with the running sums carried in front of
the chunk, and needs no copy of the chunk (the probe measures both).
"""

from __future__ import annotations

import numpy as np
import torch


class CohortSums:
    """Running first-layer sums for a cohort of batches: add(c, rows) with chunk c's rows (chunk bounds
    `starts`, node ids, ascending), then batch(i) -> (sums, own rows, in-degrees) of batch i's blocks[0].

    blocks[0] of each batch must list each destination's edges in ascending source id (ValueError if not).
    """

    def __init__(self, batches, starts: np.ndarray, dim: int, dtype: torch.dtype = torch.float32):
        self.starts = np.asarray(starts, dtype=np.int64)
        k = len(self.starts) - 1
        rows, srcs, own, degs, self.offsets = [], [], [], [], [0]
        for input_nodes, block in batches:
            ip, ind, _ = block.adj_tensors("csc")
            ip, ind = ip.numpy(), ind.numpy()
            gsrc = input_nodes.numpy()[ind].astype(np.int64)
            deg = np.diff(ip)
            row = np.repeat(np.arange(len(deg), dtype=np.int64), deg)
            step = np.diff(gsrc)
            if np.any((step < 0) & (row[1:] == row[:-1])):
                raise ValueError("blocks[0] must list each destination's edges in ascending source id")
            rows.append(row + self.offsets[-1])
            srcs.append(gsrc)
            own.append(input_nodes.numpy()[: len(deg)].astype(np.int64))
            degs.append(torch.from_numpy(deg.astype(np.int64)))
            self.offsets.append(self.offsets[-1] + len(deg))
        row, src = np.concatenate(rows), np.concatenate(srcs)
        n = self.offsets[-1]
        chunk = np.searchsorted(self.starts, src, side="right") - 1
        # grouped by chunk, then destination; stable, so each destination's edges stay in source order
        order = np.argsort(chunk * max(n, 1) + row, kind="stable")
        self.row, self.src, chunk = row[order], src[order], chunk[order]
        self.bounds = np.searchsorted(chunk, np.arange(k + 1))
        first = np.ones(len(row), dtype=bool)
        first[1:] = (self.row[1:] != self.row[:-1]) | (chunk[1:] != chunk[:-1])
        self.rank = np.arange(len(row)) - np.maximum.accumulate(np.where(first, np.arange(len(row)), 0))
        own_ids = np.concatenate(own)
        self.own_order = np.argsort(own_ids, kind="stable")
        self.own_ids = own_ids[self.own_order]
        self.own_bounds = np.searchsorted(self.own_ids, self.starts)
        self.degs = degs
        self.sums = torch.zeros((n, dim), dtype=dtype)
        self.own = torch.empty((n, dim), dtype=dtype)
        most = int(np.diff(self.bounds).max()) if k else 0
        self._scratch = torch.empty((2, most, dim), dtype=dtype)

    @property
    def nbytes(self) -> int:
        """What the cohort holds: sums and own rows, the edge lists, the scratch."""
        arrays = (self.row, self.src, self.rank, self.own_order, self.own_ids)
        tensors = (self.sums, self.own, self._scratch)
        return sum(a.nbytes for a in arrays) + sum(t.numel() * t.element_size() for t in tensors)

    def add(self, c: int, rows: torch.Tensor) -> None:
        """Chunk c's rows (rows[i] is node starts[c] + i) into the sums and the own rows they hold."""
        lo = int(self.starts[c])
        rows = rows.to(self.sums.dtype)  # fp16 / bf16-stored rows: the model reads them as float32
        a, b = int(self.bounds[c]), int(self.bounds[c + 1])
        rank = self.rank[a:b]
        for k in range(int(rank.max()) + 1 if b > a else 0):
            m = np.flatnonzero(rank == k) + a
            at, src = torch.from_numpy(self.row[m]), torch.from_numpy(self.src[m] - lo)
            acc = torch.index_select(self.sums, 0, at, out=self._scratch[0, : len(m)])
            acc.add_(torch.index_select(rows, 0, src, out=self._scratch[1, : len(m)]))
            self.sums.index_copy_(0, at, acc)
        o0, o1 = int(self.own_bounds[c]), int(self.own_bounds[c + 1])
        if o1 > o0:
            self.own[torch.from_numpy(self.own_order[o0:o1])] = rows[
                torch.from_numpy(self.own_ids[o0:o1] - lo)
            ]

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sums, own rows, in-degrees) of batch i's first-layer destinations, once every chunk was added."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return self.sums[lo:hi], self.own[lo:hi], self.degs[i]
