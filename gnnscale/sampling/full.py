"""`sampler=full`: full-graph training — one batch per epoch, every layer over the whole graph.

The batch's subgraph is the graph itself: input_nodes = all nodes (in id order, so the model's output row
i is node i), seeds = the training nodes, output_rows = their ids. The classic setting of GCN (Kipf &
Welling) and of the Planetoid benchmarks; it needs the features and every layer's activations of all
nodes in memory at once, so it is for graphs that fit (the memory plan sizes it like any batch).

The training graph passed in is CSC-only (a zero-copy view of the mmap'd CSC); GraphConv's norm="both"
also reads out-degrees, and the backward pass aggregates along out-edges. So the batch carries a second
DGL graph over the same CSC arrays that may grow its other formats; it is made once and kept, so DGL
builds the transposed adjacency once per run, not once per epoch.
"""

from __future__ import annotations

import torch

from gnnscale.sampling.batch import Batch


class FullGraphSampler:
    def __init__(self):
        self._graph = None
        self._of = None

    def graph_for(self, g):
        """The graph every layer runs on: g's CSC, free to add the formats a layer asks for."""
        if self._of is not g:
            self._graph = g.formats(["csc", "csr", "coo"])  # shares g's CSC arrays (no copy)
            self._of = g
        return self._graph

    def loader(self, g, seeds, batch_size=None, shuffle=True, num_workers=0, drop_last=False):
        """One batch: the whole graph, the loss on `seeds` (batch_size and the rest do not apply)."""
        return FullLoader(self.graph_for(g), torch.as_tensor(seeds, dtype=torch.int64))


class FullLoader:
    def __init__(self, graph, seeds: torch.Tensor):
        self.graph, self.seeds = graph, seeds

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        n = self.graph.num_nodes()
        yield Batch(torch.arange(n), self.seeds, subgraph=self.graph, output_rows=self.seeds)


def build(cfg, num_layers: int, fanouts=None) -> FullGraphSampler:
    return FullGraphSampler()
