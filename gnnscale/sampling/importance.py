"""`sampler=importance`: neighbour sampling biased towards important sources, DGL's draws.

Each destination draws `fanout` in-neighbours (without replacement unless `replace=true`) with
probability proportional to the source's score (`DGLGraph.sample_neighbors(prob=...)`, DGL's own
non-uniform sampler): `score=degree` (in-degree, from the CSC row pointers; 0 counts as 1 so every
edge can be drawn) or `score=pagerank` (a power iteration over the mmap'd CSC, `pagerank_damping` /
`pagerank_iters`, cached in graph_dir/scores/ by storage/node_scores.py and reused by later runs).
The per-edge probabilities are one float32 per CSC edge, score[indices], in the graph's edge-id order
(csc_to_dgl numbers the edges 0..E-1 in CSC order); they are computed once per process and graph and
shared by the training and evaluation samplers. Messages are not reweighted: hubs simply get picked
more often (the point of the bias: their features are the ones worth gathering).

Determinism: as neighbor's (DGL's per-thread streams, reseeded per epoch), relabelled by gnnscale.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from gnnscale.errors import ConfigError
from gnnscale.sampling import SamplingContext, check_fanouts
from gnnscale.sampling.frontier import FrontierBlockSampler, frontier_of
from gnnscale.sampling.graph import ids_for
from gnnscale.storage.csc import open_csc
from gnnscale.storage.node_scores import CHUNK_EDGES, cached_pagerank, in_degree, pagerank

SCORES = ("degree", "pagerank")
# the last per-edge probability array and its scores file, by (graph, score key)
_shared: dict[tuple, tuple[torch.Tensor, Path | None]] = {}


def edge_probabilities(scores: np.ndarray, indices: np.ndarray) -> torch.Tensor:
    """One float32 per CSC edge: the score of its source, indices[e] (read a chunk at a time)."""
    out = np.empty(len(indices), dtype=np.float32)
    for a in range(0, len(indices), CHUNK_EDGES):
        out[a : a + CHUNK_EDGES] = scores[indices[a : a + CHUNK_EDGES]]
    return torch.from_numpy(out)


def degree_scores(indptr: np.ndarray) -> np.ndarray:
    return np.maximum(in_degree(indptr), 1).astype(np.float64)


def _csc_of(g) -> tuple[np.ndarray, np.ndarray]:
    indptr, indices, _ = g.adj_tensors("csc")
    return indptr.numpy(), indices.numpy()


class ImportanceBlockSampler(FrontierBlockSampler):
    def __init__(
        self,
        fanouts: Sequence[int],
        score: str = "degree",
        damping: float = 0.85,
        iters: int = 50,
        replace: bool = False,
    ):
        super().__init__(fanouts)
        self.score, self.damping, self.iters = score, float(damping), int(iters)
        self.replace = bool(replace)
        self.prob: torch.Tensor | None = None
        self.scores_file = None  # where the PageRank vector is cached (after prepare)

    def _key(self) -> tuple:
        return (self.score,) if self.score == "degree" else (self.score, self.damping, self.iters)

    def prepare(self, ctx: SamplingContext) -> None:
        key = (str(ctx.graph.path), ctx.g.num_edges(), *self._key())
        if key not in _shared:
            indptr, indices = open_csc(ctx.graph)
            path = None
            if self.score == "degree":
                scores = degree_scores(indptr)
            else:
                scores, path = cached_pagerank(ctx.graph, self.damping, self.iters, ctx.cache_dir)
            _shared.clear()  # hold one graph's probabilities at a time
            _shared[key] = (edge_probabilities(scores, indices), path)
        self.prob, self.scores_file = _shared[key]

    def _prob_for(self, g) -> torch.Tensor:
        """The prepared probabilities, or (used without prepare) computed from g alone, uncached."""
        if self.prob is None or len(self.prob) != g.num_edges():
            indptr, indices = _csc_of(g)
            if self.score == "degree":
                scores = degree_scores(indptr)
            else:
                scores = pagerank(indptr, indices, g.num_nodes(), self.damping, self.iters)
            self.prob = edge_probabilities(scores, indices)
        return self.prob

    def frontier(self, g, dst, fanout, depth, exclude_eids=None):
        prob = self._prob_for(g)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            subgraph = g.sample_neighbors(
                ids_for(g, dst), fanout, prob=[prob], replace=self.replace, exclude_edges=exclude_eids
            )
        return frontier_of(subgraph)


def build(cfg, num_layers: int, fanouts: Sequence[int] | None = None) -> ImportanceBlockSampler:
    fanouts = check_fanouts(cfg.fanouts if fanouts is None else fanouts, num_layers)
    score = cfg.get("score", "degree")
    if score not in SCORES:
        raise ConfigError(f"sampler.score={score!r} is not known", f"choose one of {', '.join(SCORES)}")
    damping = float(cfg.get("pagerank_damping", 0.85))
    if not 0.0 < damping < 1.0:
        raise ConfigError(
            f"sampler.pagerank_damping={damping} is outside (0, 1)", "use e.g. sampler.pagerank_damping=0.85"
        )
    iters = int(cfg.get("pagerank_iters", 50))
    if iters < 1:
        raise ConfigError(
            f"sampler.pagerank_iters={iters} must be at least 1", "use e.g. sampler.pagerank_iters=50"
        )
    return ImportanceBlockSampler(fanouts, score, damping, iters, bool(cfg.get("replace", False)))
