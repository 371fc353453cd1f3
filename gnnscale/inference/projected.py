"""A full recomputation of a narrowing SAGE layer from its input rows' projections, collected as they pass.

SAGEConv 'mean' / 'gcn' with in > out projects every source row before aggregating (DGL's lin_before_mp):
  mean: z_v = (W_s h_v + b) + mean_{u in N(v)} W_n h_u      gcn: z_v = (W_n h_v + sum W_n h_u) / (d_v + 1) + b
so the layer needs only W_n h_u and W_s h_v + b per row (out wide, not in). When the layer before it is
updated in one front-to-back pass (propagate.py), that pass projects each batch of its outputs on the way
out, and the layer's input rows never have to be kept in memory or read back: on the 500k-node benchmark
the logits layer (256 -> 16) then needs 2 x 16 floats per node instead of its 256-wide input.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from gnnscale.inference.blocks import Adjacency, projects_sources

_NO_EIDS = torch.empty(0, dtype=torch.int64)


def projectable(conv) -> bool:
    from gnnscale.inference.propagate import propagates

    return propagates(conv) and projects_sources(conv)


class Projections:
    """W_n h and (mean) W_s h + b for every row, filled batch by batch in ascending order."""

    def __init__(self, conv, num_nodes: int):
        self.conv = conv
        self.mean = conv._aggre_type == "mean"
        out = conv._out_feats
        self.a_n = torch.empty((num_nodes, out), dtype=torch.float32)
        self.a_s = torch.empty((num_nodes, out), dtype=torch.float32) if self.mean else None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * 4 for t in (self.a_n, self.a_s) if t is not None)

    def add(self, lo: int, h: torch.Tensor) -> None:
        """The rows lo.. of the layer's input, as the same float32 linear maps DGL applies."""
        conv, hi = self.conv, lo + len(h)
        self.a_n[lo:hi] = F.linear(h, conv.fc_neigh.weight)
        if self.mean:
            self.a_s[lo:hi] = F.linear(h, conv.fc_self.weight, conv.fc_self.bias)


def layer_from_projections(
    proj: Projections, adj: Adjacency, out, z_out, finish, keep, *, batch_size: int, progress=None
) -> int:
    """The layer's outputs (finish(z), or z when finish is None) for every row into `out` (and z into
    z_out), in contiguous batches; keep as in layerwise.compute_layer. Returns the edges aggregated."""
    import dgl

    conv, n = proj.conv, adj.num_nodes
    edges = 0
    for lo in range(0, n, batch_size):
        hi = min(lo + batch_size, n)
        ip, src = adj.in_edges(np.arange(lo, hi, dtype=np.int64))
        edges += len(src)
        block = dgl.create_block(
            ("csc", (torch.from_numpy(ip), torch.from_numpy(src), _NO_EIDS)),
            num_src_nodes=n,
            num_dst_nodes=hi - lo,
        )
        if proj.mean:  # DGL: fc_self(h_dst) + mean of fc_neigh(h_src); a row with no in-edge gets 0
            z = proj.a_s[lo:hi] + dgl.ops.copy_u_mean(block, proj.a_n)
        else:  # DGL: (sum of fc_neigh(h_src) + fc_neigh(h_dst)) / (d + 1) + bias
            deg = torch.from_numpy(np.diff(ip)).to(torch.float32).unsqueeze(1)
            z = (dgl.ops.copy_u_sum(block, proj.a_n) + proj.a_n[lo:hi]) / (deg + 1)
            if conv.bias is not None:
                z = z + conv.bias
        if z_out is not None:
            if keep is not None:
                keep("z", lo, z)
            z_out.write_range(lo, z)
        y = finish(z) if finish is not None else z
        if keep is not None:
            keep("h", lo, y)
        out.write_range(lo, y)
        if progress is not None:
            progress(hi, n)
    return edges
