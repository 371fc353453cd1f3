"""`sampler=weighted`: neighbour sampling with probability proportional to a per-edge weight, DGL's draws.

`sampler.edge_weight=<key>` names the weights: graph_dir/csc/edata_<key>.npy, one non-negative float per
CSC edge in csc/indices.npy order (storage/node_scores.py owns the file; gnnscale's sources keep no
per-edge data, so it is provided by the user, e.g. with `node_scores.write_edge_data`). The file is
memory-mapped and handed to `DGLGraph.sample_neighbors(prob=...)` as is; absent, the run stops with
exit 2 saying which file to provide. Messages are not reweighted.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

from gnnscale.errors import ConfigError
from gnnscale.sampling import SamplingContext, check_fanouts
from gnnscale.sampling.frontier import FrontierBlockSampler, frontier_of
from gnnscale.sampling.graph import ids_for
from gnnscale.storage.node_scores import EDGE_KEY, open_edge_data


class WeightedBlockSampler(FrontierBlockSampler):
    def __init__(self, fanouts: Sequence[int], edge_weight: str = "weight", replace: bool = False):
        super().__init__(fanouts)
        self.edge_weight = edge_weight
        self.replace = bool(replace)
        self.prob: torch.Tensor | None = None

    def prepare(self, ctx: SamplingContext) -> None:
        w = open_edge_data(ctx.graph, self.edge_weight)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only mmap: DGL never writes to it
            self.prob = torch.from_numpy(w)

    def frontier(self, g, dst, fanout, depth, exclude_eids=None):
        if self.prob is None:
            raise RuntimeError("WeightedBlockSampler.prepare(ctx) must run before sampling")
        subgraph = g.sample_neighbors(
            ids_for(g, dst), fanout, prob=[self.prob], replace=self.replace, exclude_edges=exclude_eids
        )
        return frontier_of(subgraph)


def build(cfg, num_layers: int, fanouts: Sequence[int] | None = None) -> WeightedBlockSampler:
    fanouts = check_fanouts(cfg.fanouts if fanouts is None else fanouts, num_layers)
    key = str(cfg.get("edge_weight", "") or "")
    if not EDGE_KEY.match(key):
        raise ConfigError(
            f"sampler.edge_weight={key!r} is not a valid key",
            "name the weights with letters, digits, '_', '.' or '-' (graph_dir/csc/edata_<key>.npy)",
        )
    return WeightedBlockSampler(fanouts, key, bool(cfg.get("replace", False)))
