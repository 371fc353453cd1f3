"""A SAGE layer computed from its neighbour sums: the layers whose input can be summed where it is read.

SAGEConv 'mean' / 'gcn' with in <= out sums each destination's in-neighbour rows, then applies its linear
maps. Where the rows arrive a chunk at a time (layer-wise inference out of core, inference/tiled.py; a
training sweep over the feature file, training/first_sums.py) the sums are built chunk by chunk, and the
layer's output is then made from them here, with DGL's own operations in DGL's order, so it is bit-equal
to the conv an in-memory run applies (tests/test_infer_chunked.py, tests/test_first_sums.py).
"""

from __future__ import annotations

import torch


def sums_before_projecting(conv) -> bool:
    """SAGEConv mean / gcn with in <= out (DGL sums the input rows, then applies fc_neigh), no activation
    or norm inside the conv: the layer sage_from_sums computes."""
    import dgl.nn as dglnn

    return (
        isinstance(conv, dglnn.SAGEConv)
        and conv._aggre_type in ("mean", "gcn")
        and conv.activation is None
        and conv.norm is None
        and conv._in_src_feats <= conv._out_feats
    )


def sage_from_sums(conv, sums: torch.Tensor, deg: torch.Tensor, h_self: torch.Tensor) -> torch.Tensor:
    """SAGEConv's output from its neighbour sums, with DGL's own operations in DGL's order (checked
    bit-equal to the conv in tests/test_infer_chunked.py). deg: in-degrees [rows] (int64)."""
    if conv._aggre_type == "mean":  # DGL: sum / in-degree clamped to 1, then fc_neigh
        mean = sums / deg.clamp(min=1).to(sums.dtype).view(-1, 1)
        return conv.fc_self(h_self) + conv.fc_neigh(mean)
    # gcn: (sum + self) / (in-degree + 1), fc_neigh, then the bias
    rst = conv.fc_neigh((sums + h_self) / (deg.to(h_self).unsqueeze(-1) + 1))
    return rst + conv.bias if conv.bias is not None else rst
