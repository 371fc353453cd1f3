"""`sampler=neighbor`: fixed-fanout neighbour sampling, DGL's draws with gnnscale's block relabelling.

The random draws are DGL's own (`DGLGraph.sample_neighbors`, the call inside
`dgl.dataloading.NeighborSampler`), so the sampled neighbourhoods follow the same distribution.
Turning each layer's sampled edges into a block is done by `BlockBuilder` instead of `dgl.to_block`:
DGL's multi-threaded relabelling (`to_block`, `sample_neighbors_fused`) numbers the sources in an order
that varies from run to run, so seeded runs would not repeat, and its single-threaded relabelling is
the slowest part of a batch (on the 500k-node benchmark graph: 14 ms per batch for DGL's sampler on
one thread, 10 ms with this relabelling, which also numbers the sources in ascending id order and so
makes the feature gather that follows read the rows front to back).
"""

from __future__ import annotations

from typing import Sequence

import dgl
import torch

from gnnscale.sampling.blocks import BlockBuilder
from gnnscale.sampling.frontier import frontier_of
from gnnscale.sampling.graph import ids_for


class NeighborBlockSampler(dgl.dataloading.BlockSampler):
    """A DGL block sampler: usable with `dgl.dataloading.DataLoader` like `NeighborSampler`.

    fanouts: one per layer, input layer first (DGL's order); -1 takes every in-neighbour.
    by_source: the input layer's block lists each destination's edges in ascending source id (its sums can
    then be built a chunk of the feature file at a time, bit-equal: training/first_sums.py).
    Returns (input_nodes, seeds, blocks) with blocks[0] the input layer's block.
    """

    def __init__(self, fanouts: Sequence[int], replace: bool = False, by_source: bool = False):
        super().__init__()
        self.fanouts = [int(f) for f in fanouts]
        self.replace = bool(replace)
        self.by_source = bool(by_source)
        self._builder: BlockBuilder | None = None

    def _builder_for(self, g) -> BlockBuilder:
        if self._builder is None or self._builder.n != g.num_nodes():
            self._builder = BlockBuilder(g.num_nodes())
        return self._builder

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        builder = self._builder_for(g)
        seeds = torch.as_tensor(seed_nodes, dtype=torch.int64)
        exclude = ids_for(g, exclude_eids)
        dst = seeds
        blocks = []
        for depth, fanout in enumerate(reversed(self.fanouts)):
            sampled = g.sample_neighbors(ids_for(g, dst), fanout, replace=self.replace, exclude_edges=exclude)
            f = frontier_of(sampled)  # int64 ids whatever g's idtype: the same block from either
            by_source = self.by_source and depth == len(self.fanouts) - 1
            block, dst = builder.from_edges(dst.numpy(), f.src, f.edge_dst, f.eids, by_source=by_source)
            blocks.insert(0, block)
        return dst, seeds, blocks
