"""DGL blocks from (destination, source) edge lists: the relabelling step shared by sampling and inference.

A block's sources are its destinations first (DGL's block convention, which SAGEConv relies on to find
each destination's own row) followed by the other distinct sources in increasing id order. The order
matters for speed: the feature gather that follows reads rows front to back instead of at random.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

# Below this many edges per node of the graph, finding a batch's distinct sources by sorting them beats
# scanning an N-sized mark array (the scan costs O(N) per layer however small the batch).
_SORT_BELOW_EDGES_PER_NODE = 1 / 16
# An empty edge-id array tells dgl.create_block the edge ids are 0..E-1 (cheaper than an arange).
_CONSECUTIVE_EIDS = torch.empty(0, dtype=torch.int64)


class BlockBuilder:
    """DGL blocks for batches of destination nodes, in one of two layouts.

    compact: sources = destinations first, then the other distinct sources ascending (local ids), so a
      layer's input rows are gathered into one [num_src, dim] tensor.
    global: the sources are all N nodes in their own ids, so a layer can read its input array in place with
      no gather at all; only valid for layers that touch source rows through edge messages alone.

    Relabelling uses two N-sized scratch arrays (a bool mark and an int32/64 id map) instead of a hash
    map: O(edges) per batch, a few bytes per node, and no state between batches. Not thread-safe: one
    builder per sampling thread or process.
    """

    def __init__(self, num_nodes: int):
        self.n = num_nodes
        self._mark = np.zeros(num_nodes, dtype=bool)
        self._map = np.empty(num_nodes, dtype=np.int32 if num_nodes < 2**31 else np.int64)

    def _relabel(self, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
        """Map every node of dst ∪ src to its local id; returns the sources that are not destinations."""
        n_dst = len(dst)
        if len(src) < self.n * _SORT_BELOW_EDGES_PER_NODE:
            others = np.unique(src)
            self._mark[dst] = True
            others = others[~self._mark[others]]
            self._mark[dst] = False
        else:
            self._mark[src] = True
            self._mark[dst] = False
            others = np.flatnonzero(self._mark)
            self._mark[others] = False  # leave the scratch clean for the next batch
        self._map[dst] = np.arange(n_dst, dtype=self._map.dtype)
        self._map[others] = np.arange(n_dst, n_dst + len(others), dtype=self._map.dtype)
        return others

    def compact(self, dst: np.ndarray, ip: np.ndarray, src: np.ndarray):
        """(block, source ids) for destinations `dst` whose in-edges are src[ip[i]:ip[i+1]] (CSC rows)."""
        dst = np.ascontiguousarray(dst, dtype=np.int64)
        others = self._relabel(dst, src)
        local = self._map[src].astype(np.int64)
        src_ids = torch.from_numpy(np.concatenate([dst, others]))
        return self._block(ip, local, len(src_ids), dst, src_ids), src_ids

    def from_edges(
        self, dst: np.ndarray, src: np.ndarray, edge_dst: np.ndarray, eids=None, by_source: bool = False
    ):
        """(block, source ids) from an edge list (src[i] -> edge_dst[i], global ids) into destinations `dst`.

        `dst` may be in any order (a shuffled batch of seeds); the block's destination i is dst[i].
        by_source: each destination's edges in ascending source id (else in the order given), the order a
        sum built chunk by chunk over the feature file adds them in (training/first_sums.py).
        """
        dst = np.ascontiguousarray(dst, dtype=np.int64)
        others = self._relabel(dst, src)
        row = self._map[edge_dst]
        if by_source and len(row) > 1:
            # radix sort of one int64 key: 3 ms for 150k edges, a twentieth of sampling the batch
            order = np.argsort(row.astype(np.int64) * self.n + src, kind="stable")
            src, row = src[order], row[order]
            eids = eids[order] if eids is not None else None
        elif len(row) > 1 and not bool((row[1:] >= row[:-1]).all()):
            order = np.argsort(row, kind="stable")  # group the edges by destination, keeping their order
            src, row = src[order], row[order]
            eids = eids[order] if eids is not None else None
        ip = np.zeros(len(dst) + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=len(dst)), out=ip[1:])
        local = self._map[src].astype(np.int64)
        src_ids = torch.from_numpy(np.concatenate([dst, others]))
        block = self._block(ip, local, len(src_ids), dst, src_ids)
        if eids is not None:
            import dgl

            block.edata[dgl.EID] = torch.as_tensor(eids)
        return block, src_ids

    def global_(self, dst: np.ndarray, ip: np.ndarray, src: np.ndarray):
        """A block whose sources are every node (ids unchanged) and whose destinations are `dst`."""
        dst = np.ascontiguousarray(dst, dtype=np.int64)
        return self._block(ip, np.ascontiguousarray(src, dtype=np.int64), self.n, dst, None)

    @staticmethod
    def _block(ip, local, num_src: int, dst: np.ndarray, src_ids):
        import dgl

        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", UserWarning
            )  # slices of read-only mmaps: DGL never writes to them
            indptr = torch.from_numpy(np.ascontiguousarray(ip, dtype=np.int64))
            indices = torch.from_numpy(local)
        block = dgl.create_block(
            ("csc", (indptr, indices, _CONSECUTIVE_EIDS)),
            num_src_nodes=num_src,
            num_dst_nodes=len(dst),
        )
        if src_ids is not None:
            block.srcdata[dgl.NID] = src_ids
        block.dstdata[dgl.NID] = torch.from_numpy(dst)
        return block
