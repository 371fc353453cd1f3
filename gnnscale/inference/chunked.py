"""A SAGE layer that sums before it projects, its sums built one chunk of source rows at a time.

SAGEConv 'mean' / 'gcn' with in <= out sums each destination's in-neighbour rows, then applies its
linear maps. Out of core (tiled.py) the input rows arrive a chunk at a time, so a destination's sum is
built chunk by chunk. DGL's CPU sum adds a row's edges one after another in CSC order, so the sum so
far is carried into the next chunk's sum as that row's first source row: every sum ends bit-equal to
DGL's single sum over all the row's edges, whatever the chunks, and the layer bit-equal to the conv an
in-memory run applies (tests/test_infer_chunked.py checks both).
"""

from __future__ import annotations

import numpy as np
import torch

_NO_EIDS = torch.empty(0, dtype=torch.int64)


class ChunkEdges:
    """A batch of destinations' in-edges (local indptr ip, global sorted sources src) split by source
    chunk (bounds: where the chunks start, then the end): edges(c) gives chunk c's, in CSC order."""

    def __init__(self, ip: np.ndarray, src: np.ndarray, bounds: np.ndarray):
        self.src, self.bounds = src, bounds
        self.rows, k = len(ip) - 1, len(bounds) - 1
        # Each row's sources are sorted, so (row, chunk) keys are sorted too: counting them gives every
        # (row, chunk) segment, no sort.
        key = np.repeat(np.arange(self.rows, dtype=np.int64) * k, np.diff(ip))
        key += np.searchsorted(bounds, src, side="right") - 1
        self.starts = np.zeros(self.rows * k + 1, dtype=np.int64)
        np.cumsum(np.bincount(key, minlength=self.rows * k), out=self.starts[1:])
        self.num_chunks = k

    def edges(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(indptr [rows+1], sources relative to the chunk's first row) of the edges into chunk c."""
        k = self.num_chunks
        lo = self.starts[c : self.rows * k : k]
        counts = self.starts[c + 1 : self.rows * k + 1 : k] - lo
        ip = np.zeros(self.rows + 1, dtype=np.int64)
        np.cumsum(counts, out=ip[1:])
        pos = np.arange(int(ip[-1]), dtype=np.int64) + np.repeat(lo - ip[:-1], counts)
        return ip, self.src[pos].astype(np.int64) - self.bounds[c]


def chunk_sum(ip: np.ndarray, src: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """DGL's sum of x[src] per destination row (the kernel SAGEConv's mean and gcn run)."""
    import dgl

    block = dgl.create_block(
        ("csc", (torch.from_numpy(ip), torch.from_numpy(np.ascontiguousarray(src)), _NO_EIDS)),
        num_src_nodes=len(x),
        num_dst_nodes=len(ip) - 1,
    )
    return dgl.ops.copy_u_sum(block, x)


def carried_sum(ip: np.ndarray, src: np.ndarray, x: torch.Tensor, offset: int, carry: bool) -> torch.Tensor:
    """The sums of x[offset + src] per destination row r, continued from x[r] when carry (the sums of
    the chunks before; x[:offset] is the carry area in front of the chunk's rows)."""
    if not carry:
        return chunk_sum(ip, src + offset, x)
    rows = len(ip) - 1
    ip2 = ip + np.arange(rows + 1, dtype=np.int64)
    src2 = np.empty(int(ip2[-1]), dtype=np.int64)
    first = ip2[:-1]
    rest = np.ones(len(src2), dtype=bool)
    rest[first] = False
    src2[first] = np.arange(rows, dtype=np.int64)  # the carried sum: each row's first source row
    src2[rest] = src + offset
    return chunk_sum(ip2, src2, x)
