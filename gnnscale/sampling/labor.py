"""`sampler=labor`: LABOR (layer-neighbor) sampling, DGL's draws with gnnscale's block relabelling.

LABOR (Balın & Çatalyürek, NeurIPS 2023; `dgl.dataloading.LaborSampler`) gives every candidate source
node t one random variate r_t per batch and layer, shared by all the destinations that could pick t:
each destination keeps about `fanout` neighbours, as neighbour sampling does, but destinations of a
batch tend to pick the same sources, so the batch needs far fewer input nodes (less feature gathering,
a smaller first layer). LABOR-i (`importance_sampling=i`, -1 = until it converges) also optimises the
inclusion probabilities, which shrinks the batch further; its edges then carry weights (normalised per
destination to sum to its sampled degree) that the model applies to each message.
`layer_dependency=true` reuses one variate per node across layers: fewer distinct nodes still.

Determinism: the variates come from a random seed handed to DGL, drawn per batch from torch's RNG
(reseeded per epoch by the training loop, or per worker by the DataLoader), so seeded runs repeat; the
variates depend on the seed and the node id only, not on threads.
"""

from __future__ import annotations

from typing import Sequence

import torch
from dgl import backend as F

from gnnscale.errors import ConfigError
from gnnscale.sampling import check_fanouts
from gnnscale.sampling.frontier import FrontierBlockSampler, frontier_of
from gnnscale.sampling.graph import ids_for

SEED_HIGH = 2**62  # random seeds are drawn from [0, SEED_HIGH): room for + layer without overflow


class LaborBlockSampler(FrontierBlockSampler):
    def __init__(self, fanouts: Sequence[int], importance_sampling: int = 0, layer_dependency: bool = False):
        super().__init__(fanouts)
        self.importance_sampling = int(importance_sampling)
        self.layer_dependency = bool(layer_dependency)
        self._seed = 0

    def start_batch(self, g) -> None:
        self._seed = int(torch.randint(0, SEED_HIGH, (1,)).item())

    def frontier(self, g, dst, fanout, depth, exclude_eids=None):
        seed = torch.tensor([self._seed + (0 if self.layer_dependency else depth)], dtype=torch.int64)
        subgraph, importances = g.sample_labors(
            ids_for(g, dst),
            fanout,
            importance_sampling=self.importance_sampling,
            random_seed=F.zerocopy_to_dgl_ndarray(seed),
            exclude_edges=exclude_eids,
        )
        weight = None  # LABOR-0 returns none: every sampled message counts the same
        if self.importance_sampling and importances and len(importances[0]) == subgraph.num_edges():
            weight = importances[0]
        return frontier_of(subgraph, weight)


def build(cfg, num_layers: int, fanouts: Sequence[int] | None = None) -> LaborBlockSampler:
    fanouts = check_fanouts(cfg.fanouts if fanouts is None else fanouts, num_layers)
    iters = cfg.get("importance_sampling", 0)
    if not isinstance(iters, int) or isinstance(iters, bool) or iters < -1:
        raise ConfigError(
            f"sampler.importance_sampling={iters!r} is not valid",
            "use 0 (LABOR-0), a positive number of iterations (LABOR-i) or -1 (until it converges)",
        )
    return LaborBlockSampler(fanouts, iters, bool(cfg.get("layer_dependency", False)))
