"""Subgraph batches cut to what the loss reads: one block per layer over the output rows' receptive field.

A subgraph formation (cluster_gcn, saint) would run every layer on its whole subgraph, but the loss reads
only the output rows (the training nodes inside), and a layer's output at a node is read only by the next
layer's destinations and their in-neighbours. Walking back from the output rows over every in-edge of the
subgraph gives one DGL block per layer that holds exactly that: for models whose layer output at a node
depends on that node's own row and its in-edges alone (models.exact_on_blocks: GraphSAGE with any
aggregator, the MLP, with row-wise norms) the loss and its gradients are those of the whole subgraph, the
rows nobody reads left out. On the 500k-node benchmark (20 METIS clusters per batch: 19.8k nodes, 11.9k of
them training nodes) layer 1 keeps 18.3k destinations and layer 2 11.9k, and an epoch's forward +
backward drops from about 1.85 s to 1.6 s (bench/results/cluster_gcn.json before and after this). DGL's
Cluster-GCN recipe computes every row.

`full` keeps its one whole-graph batch: there the blocks would copy the graph's adjacency every epoch.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from gnnscale.models import EDGE_WEIGHT
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.blocks import BlockBuilder
from gnnscale.storage.csc import rows_edges


def loss_blocks(b: Batch, num_layers: int) -> Batch:
    """The same batch as blocks: blocks[-1]'s destinations are the output rows, in their order (so row i
    of the model's output is b.seeds[i]), each block holds every subgraph in-edge of its destinations."""
    import dgl

    g = b.subgraph
    indptr, indices, eids = g.adj_tensors("csc")
    ip, ix = indptr.numpy(), indices.numpy()
    weight = g.edata[EDGE_WEIGHT] if EDGE_WEIGHT in g.edata else None
    eid = eids.numpy() if len(eids) else None  # empty: edge i is CSC position i
    nodes = b.input_nodes
    builder = BlockBuilder(g.num_nodes())
    dst = np.asarray(b.output_rows, dtype=np.int64)
    blocks = []
    for _ in range(num_layers):
        pos, _owner = rows_edges(ip, dst)
        dst_ip = np.zeros(len(dst) + 1, dtype=np.int64)
        np.cumsum(ip[dst + 1] - ip[dst], out=dst_ip[1:])
        block, src = builder.compact(dst, dst_ip, ix[pos])
        if weight is not None:
            block.edata[EDGE_WEIGHT] = weight[torch.from_numpy(pos if eid is None else eid[pos])]
        block.srcdata[dgl.NID] = nodes[src]  # global ids, as every other formation's blocks carry
        block.dstdata[dgl.NID] = nodes[torch.from_numpy(dst)]
        blocks.insert(0, block)
        dst = src.numpy()
    return Batch(nodes[torch.from_numpy(dst)], b.seeds, blocks=blocks, loss_weight=b.loss_weight)


class LossBlocksLoader:
    """A subgraph formation's loader whose batches come out as loss_blocks."""

    def __init__(self, loader, num_layers: int):
        self.loader, self.num_layers = loader, int(num_layers)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        it = iter(self.loader)  # the epoch's draw happens now, in the caller's thread, as without this
        return (loss_blocks(b, self.num_layers) for b in it)
