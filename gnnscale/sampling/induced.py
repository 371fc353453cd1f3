"""Induced subgraphs straight from the CSC: the batch structure of the subgraph formations, built with numpy
instead of `DGLGraph.subgraph`. GraphSAINT builds its node sets here; Cluster-GCN, whose node sets are
unions of fixed clusters, uses the cluster-ordered variant in cluster_gcn.py (ClusterCsc) and `Induced`.

A batch's nodes, in ascending id order (so the feature gather that follows reads rows front to back), are
numbered 0..n-1 through an N-sized id map (-1 = not in the batch; the same trick as sampling/blocks.py's
BlockBuilder): each node's in-edges are sliced out of the CSC, the edges whose source is in the batch are
kept, and their sources renumbered. Kept edges stay grouped by destination in CSC order, so they form the
subgraph's CSC directly: no sort, no hash map, O(in-edges of the batch's nodes) per batch.

The result is a plain DGL graph (not a block) created from that CSC: every layer runs on the same
subgraph, GraphConv's norm="both" reads its in- and out-degrees, and SAGEConv takes each node's own row
from the same input. Its edge i is CSC position i; `edge_ids` maps it to the full graph's edge (CSC
position), which GraphSAINT's aggregator normalisation reads its per-edge coefficient from.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

_CONSECUTIVE_EIDS = torch.empty(0, dtype=torch.int64)


@dataclass
class Induced:
    nodes: np.ndarray  # [n] distinct global ids (ascending from InducedBuilder): local id i is nodes[i]
    indptr: np.ndarray  # [n + 1] the subgraph's CSC
    indices: np.ndarray  # [m] local source ids
    edge_ids: np.ndarray | None  # [m] the full graph's edge (CSC position) of each subgraph edge, if asked

    def in_degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def to_dgl(self):
        """The subgraph as a DGL graph whose only format is its CSC (DGL adds the others when asked)."""
        import dgl

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # views of read-only arrays: DGL never writes
            ip = torch.from_numpy(self.indptr)
            ix = torch.from_numpy(self.indices)
        return dgl.graph(("csc", (ip, ix, _CONSECUTIVE_EIDS)), num_nodes=len(self.nodes))


class InducedBuilder:
    """Induced subgraphs of one CSC graph. Not thread-safe (one scratch id map): one per sampling thread."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray):
        self.indptr = indptr
        self.indices = indices
        self.n = len(indptr) - 1
        self._map = np.full(self.n, -1, dtype=np.int32 if self.n < 2**31 else np.int64)

    @classmethod
    def of(cls, g) -> "InducedBuilder":
        """A builder over a DGL graph's CSC (zero-copy: the arrays of a mmap'd graph stay mapped)."""
        indptr, indices, _ = g.adj_tensors("csc")
        return cls(indptr.numpy(), indices.numpy())

    def in_degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def build(self, nodes: np.ndarray, with_edge_ids: bool = False) -> Induced:
        """The subgraph induced by `nodes` (distinct ids in ascending order): every edge of the graph
        between two of them, each once."""
        nodes = np.ascontiguousarray(nodes, dtype=np.int64)
        n = len(nodes)
        starts = self.indptr[nodes]
        counts = self.indptr[nodes + 1] - starts
        ends = np.cumsum(counts)
        total = int(ends[-1]) if n else 0
        # Positions of every in-edge of the batch's nodes, node after node: start_i + 0..count_i-1.
        pos = np.arange(total, dtype=np.int64)
        pos += np.repeat(starts - (ends - counts), counts)
        local = self._map
        local[nodes] = np.arange(n, dtype=local.dtype)
        try:
            src = local[self.indices[pos]]
        finally:
            local[nodes] = -1  # leave the map clean for the next batch
        keep = src >= 0
        # indptr[i + 1] = kept edges among the first ends[i] in-edges (a running count, 0 before any).
        kept = np.zeros(total + 1, dtype=np.int64)
        np.cumsum(keep, out=kept[1:])
        indptr = np.zeros(n + 1, dtype=np.int64)
        indptr[1:] = kept[ends]
        indices = src[keep].astype(np.int64)
        edge_ids = pos[keep] if with_edge_ids else None
        return Induced(nodes, indptr, indices, edge_ids)


def seed_rows(nodes: np.ndarray, is_seed: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(seeds, output_rows): the batch's nodes that are seeds (in the batch's order) and their local ids."""
    rows = np.flatnonzero(is_seed[nodes])
    return torch.from_numpy(nodes[rows]), torch.from_numpy(rows)


def seed_mask(num_nodes: int, seeds: torch.Tensor) -> np.ndarray:
    mask = np.zeros(num_nodes, dtype=bool)
    mask[torch.as_tensor(seeds, dtype=torch.int64).numpy()] = True
    return mask
