"""The shared frame of gnnscale's block samplers: one frontier (sampled in-edges) per layer, relabelled.

A subclass says how a layer's edges are drawn (`frontier`: DGL's draws, each sampler its own call); this
class turns them into a block with `BlockBuilder` (sampling/blocks.py: destinations first, the other
sources ascending, the same numbering in every run), output layer first, exactly as
`NeighborBlockSampler` does. A frontier may carry one weight per edge: it travels with its edge into the
block as `edata["edge_weight"]`, which the model's layers then apply to each message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import dgl
import numpy as np
import torch

from gnnscale.models import EDGE_WEIGHT
from gnnscale.sampling.blocks import BlockBuilder
from gnnscale.sampling.graph import as_int64, ids_for


@dataclass
class Frontier:
    """The edges a layer's destinations receive: src[i] -> edge_dst[i] (global ids)."""

    src: np.ndarray
    edge_dst: np.ndarray
    eids: np.ndarray | None = None  # the graph's edge ids (absent for edges that are not the graph's)
    weight: torch.Tensor | None = None  # one per edge, or None: every message counts the same


class FrontierBlockSampler(dgl.dataloading.BlockSampler):
    """A DGL block sampler (usable with `dgl.dataloading.DataLoader`) built from per-layer frontiers.

    fanouts: one per layer, input layer first (DGL's order); -1 = every neighbour the method offers.
    Returns (input_nodes, seeds, blocks) with blocks[0] the input layer's block.
    """

    def __init__(self, fanouts: Sequence[int]):
        super().__init__()
        self.fanouts = [int(f) for f in fanouts]
        self._builder: BlockBuilder | None = None

    def _builder_for(self, g) -> BlockBuilder:
        if self._builder is None or self._builder.n != g.num_nodes():
            self._builder = BlockBuilder(g.num_nodes())
        return self._builder

    def start_batch(self, g) -> None:
        """Per-batch state, drawn before the first layer (LABOR's random seed); nothing by default."""

    def frontier(self, g, dst: torch.Tensor, fanout: int, depth: int, exclude_eids=None) -> Frontier:
        """The sampled in-edges of `dst` (int64) for the layer `depth` steps below the output (0 = output
        layer); exclude_eids come in g's idtype, and DGL wants `dst` in it too (sampling.graph.ids_for)."""
        raise NotImplementedError

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        builder = self._builder_for(g)
        seeds = torch.as_tensor(seed_nodes, dtype=torch.int64)
        exclude_eids = ids_for(g, exclude_eids)  # in g's idtype, as DGL's samplers want it
        self.start_batch(g)
        dst = seeds
        blocks = []
        for depth, fanout in enumerate(reversed(self.fanouts)):
            block, dst = self._block(builder, dst, self.frontier(g, dst, fanout, depth, exclude_eids))
            blocks.insert(0, block)
        return dst, seeds, blocks

    @staticmethod
    def _block(builder: BlockBuilder, dst: torch.Tensor, f: Frontier):
        src = np.asarray(f.src, dtype=np.int64)
        edge_dst = np.asarray(f.edge_dst, dtype=np.int64)
        if f.weight is None:
            return builder.from_edges(dst.numpy(), src, edge_dst, f.eids)
        # The builder may regroup the edges by destination: carry each edge's position through it as its
        # "edge id", then put the weights (and the real edge ids) in the block's edge order.
        block, src_ids = builder.from_edges(dst.numpy(), src, edge_dst, np.arange(len(src)))
        order = block.edata.pop(dgl.EID)
        if f.eids is not None:
            block.edata[dgl.EID] = torch.as_tensor(np.asarray(f.eids)[order.numpy()])
        block.edata[EDGE_WEIGHT] = torch.as_tensor(f.weight, dtype=torch.float32)[order]
        return block, src_ids


def frontier_of(subgraph, weight: torch.Tensor | None = None) -> Frontier:
    """A Frontier from a DGL sampling result (a graph over all nodes holding only the sampled edges), its
    ids int64 whatever the graph's idtype (an int32 graph's would otherwise reach the blocks)."""
    src, edge_dst = subgraph.edges()
    eids = as_int64(subgraph.edata[dgl.EID]) if dgl.EID in subgraph.edata else None
    return Frontier(as_int64(src), as_int64(edge_dst), eids, weight)
