"""The one type every batch source yields, and that BatchStream fills with features and labels.

A sampler (sampling/<kind>.py) sets the structure: which nodes' features to gather, which nodes the
loss is on, and the message-flow structure. BatchStream adds x (the gathered features) and y (the
output nodes' labels). Fields a formation does not use stay None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    input_nodes: torch.Tensor  # global ids whose features are gathered; row i of x is input_nodes[i]
    seeds: torch.Tensor  # the output nodes (global ids) the loss and metrics are computed on
    # Message flow: DGL blocks, input layer first (a block's destinations lead its sources) ...
    blocks: list | None = None
    # ... or one subgraph every layer runs on (subgraph formations: Cluster-GCN, GraphSAINT)
    subgraph: object | None = None
    output_rows: torch.Tensor | None = None  # rows of the model's output that are `seeds` (subgraphs)
    loss_weight: torch.Tensor | None = None  # per-seed loss weights (GraphSAINT's normalisation)
    pos_pairs: torch.Tensor | None = None  # [2, P] edge-task fields: positive (src, dst) pairs ...
    neg_pairs: torch.Tensor | None = None  # ... and sampled negatives
    neg_dst: torch.Tensor | None = None  # [E] negatives every positive's source is scored against (eval)
    # [2, K] (positive, column of neg_dst) pairs that are known edges, not negatives (filtered ranking)
    neg_known: torch.Tensor | None = None
    x: torch.Tensor | None = None
    # (sums, own rows, in-degrees) of blocks[0]'s destinations, in place of x (training/sum_sweep.py)
    first: tuple | None = None
    y: torch.Tensor | None = None
    sample_s: float = 0.0
    gather_s: float = 0.0

    def layers(self, num_layers: int) -> list:
        """What each of the model's layers runs on."""
        return self.blocks if self.blocks is not None else [self.subgraph] * num_layers

    def outputs(self, out: torch.Tensor) -> torch.Tensor:
        """The model's output rows that belong to the seeds."""
        return out if self.output_rows is None else out[self.output_rows]

    def to(self, device: torch.device) -> "Batch":
        """Move what the model reads (blocking copies: a pinned x buffer may be refilled right after)."""
        if self.blocks is not None:
            self.blocks = [b.to(device) if b is not None else None for b in self.blocks]
        if self.first is not None:
            self.first = tuple(t.to(device) for t in self.first)
        if self.subgraph is not None:
            self.subgraph = self.subgraph.to(device)
        for name in (
            "x",
            "y",
            "output_rows",
            "loss_weight",
            "pos_pairs",
            "neg_pairs",
            "neg_dst",
            "neg_known",
        ):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))
        return self


def next_sampled(it) -> Batch | None:
    """The loader's next batch with the time sampling it took (its sample_s); None when it is done."""
    t0 = time.perf_counter()
    b = next(it, None)
    if b is not None:
        b.sample_s = time.perf_counter() - t0
    return b
