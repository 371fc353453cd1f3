"""`sampler=random_walk`: PinSAGE-style neighbourhoods, the most visited nodes of short random walks.

For each destination of a layer, `num_walks` walks of up to `walk_length` hops start from it (DGL's
`dgl.sampling.random_walk`; after the first hop each walk stops with probability `restart_prob`, as
PinSAGE's `RandomWalkNeighborSampler` does). A walk steps from a node to one of its in-neighbours,
the nodes whose messages it receives, so neighbourhoods follow message flow on directed graphs too.
The `fanout` most visited nodes (the node itself excluded; ties go to the smaller id, -1 keeps every
visited node) become the destination's sources in that layer's block: multi-hop, importance-ranked
neighbourhoods of a fixed size. Messages are not reweighted by visit counts (GraphSAGE's mean).

DGL walks along out-edges (a CSR) while the graph holds only its CSC, so the walks run on the reversed
graph, whose CSR is that CSC: same arrays, nothing copied. Counting and top-k are numpy, in a fixed
order; the walks are DGL's per-thread streams, reseeded per epoch like neighbour sampling.
"""

from __future__ import annotations

from typing import Sequence

import dgl
import numpy as np
import torch

from gnnscale.errors import ConfigError
from gnnscale.sampling import check_fanouts
from gnnscale.sampling.frontier import Frontier, FrontierBlockSampler
from gnnscale.sampling.graph import adj_to_dgl, ids_for


def top_visited(
    dst: np.ndarray, visits: np.ndarray, walks_per_dst: int, num_nodes: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(src, edge_dst): for each dst[i], the k nodes most often found in its walks' rows of `visits`.

    visits: [len(dst) * walks_per_dst, hops] node ids, -1 after a walk stopped; the walks of dst[i]
    are rows i * walks_per_dst ... Ties go to the smaller id; dst[i] itself is never its own neighbour.
    """
    owner = np.repeat(np.arange(len(dst), dtype=np.int64), walks_per_dst * visits.shape[1])
    v = visits.reshape(-1).astype(np.int64)
    keep = (v >= 0) & (v != dst[owner])
    uniq, counts = np.unique(owner[keep] * num_nodes + v[keep], return_counts=True)
    row, node = uniq // num_nodes, uniq % num_nodes
    order = np.lexsort((node, -counts, row))  # by destination, then most visited, then smaller id
    row, node = row[order], node[order]
    if k > 0:
        rank = np.arange(len(row)) - np.searchsorted(row, row, side="left")
        row, node = row[rank < k], node[rank < k]
    return node, dst[row]


class RandomWalkBlockSampler(FrontierBlockSampler):
    def __init__(
        self,
        fanouts: Sequence[int],
        num_walks: int = 20,
        walk_length: int = 3,
        restart_prob: float = 0.5,
    ):
        super().__init__(fanouts)
        self.num_walks, self.walk_length = int(num_walks), int(walk_length)
        self.restart_prob = float(restart_prob)
        # probability to stop before each hop: never before the first (PinSAGE's termination_prob)
        self._stop = torch.full((self.walk_length,), self.restart_prob, dtype=torch.float32)
        self._stop[0] = 0.0
        self._reversed: tuple[object, object] | None = None  # (g, the reversed graph over its CSC)

    def _reverse(self, g):
        if self._reversed is None or self._reversed[0] is not g:
            indptr, indices, _ = g.adj_tensors("csc")
            self._reversed = (g, adj_to_dgl("csr", indptr, indices, g.num_nodes(), g.idtype))
        return self._reversed[1]

    def frontier(self, g, dst, fanout, depth, exclude_eids=None):
        starts = ids_for(g, dst).repeat_interleave(self.num_walks)
        traces, _ = dgl.sampling.random_walk(
            self._reverse(g), starts, length=self.walk_length, restart_prob=self._stop
        )
        src, edge_dst = top_visited(
            dst.numpy(), traces[:, 1:].numpy(), self.num_walks, g.num_nodes(), int(fanout)
        )
        return Frontier(src, edge_dst)  # not the graph's edges: no edge ids


def build(cfg, num_layers: int, fanouts: Sequence[int] | None = None) -> RandomWalkBlockSampler:
    fanouts = check_fanouts(cfg.fanouts if fanouts is None else fanouts, num_layers)
    num_walks, walk_length = int(cfg.get("num_walks", 20)), int(cfg.get("walk_length", 3))
    restart = float(cfg.get("restart_prob", 0.5))
    if num_walks < 1:
        raise ConfigError(
            f"sampler.num_walks={num_walks} must be at least 1", "use e.g. sampler.num_walks=20"
        )
    if walk_length < 1:
        raise ConfigError(
            f"sampler.walk_length={walk_length} must be at least 1", "use e.g. sampler.walk_length=3"
        )
    if not 0.0 <= restart < 1.0:
        raise ConfigError(
            f"sampler.restart_prob={restart} is outside [0, 1)", "use e.g. sampler.restart_prob=0.5"
        )
    return RandomWalkBlockSampler(fanouts, num_walks, walk_length, restart)
