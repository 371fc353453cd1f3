"""Models (`model=`): GraphSAGE (dgl.nn.SAGEConv), GCN (dgl.nn.GraphConv) and a features-only MLP.

Every model is a stack of layers applied one block at a time, so the same weights serve sampled
mini-batch training (`forward(blocks, x)`) and layer-by-layer full-neighbour inference
(`layer_forward(i, block, h)` over all nodes, one layer at a time).
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch import nn

from gnnscale.errors import ConfigError
from gnnscale.models.sums import sage_from_sums

ARCHS = ("sage", "gcn", "mlp")
AGGREGATORS = ("mean", "pool", "lstm", "gcn")
NORMS = ("none", "batch", "layer")
# A block's or subgraph's edge data under this key weighs each message (GraphSAINT's aggregator
# normalisation); absent, every edge counts the same.
EDGE_WEIGHT = "edge_weight"


class GNN(nn.Module):
    def __init__(
        self,
        arch: str,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int,
        *,
        aggregator: str,
        dropout: float,
        norm: str,
    ):
        super().__init__()
        import dgl.nn as dglnn

        self.arch, self.num_layers = arch, num_layers
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        self.dims = dims
        self.layers = nn.ModuleList()
        for i in range(num_layers):
            if arch == "sage":
                self.layers.append(dglnn.SAGEConv(dims[i], dims[i + 1], aggregator))
            elif arch == "gcn":
                self.layers.append(
                    dglnn.GraphConv(dims[i], dims[i + 1], norm="both", allow_zero_in_degree=True)
                )
            else:
                self.layers.append(nn.Linear(dims[i], dims[i + 1]))
        self.norms = nn.ModuleList(_norm(norm, hidden) for _ in range(num_layers - 1))
        self.dropout = nn.Dropout(dropout)

    def layer_forward(self, i: int, block, h: torch.Tensor, finish: bool = True) -> torch.Tensor:
        """Layer i on one block: h holds the block's source rows, the result its destination rows.
        finish=False: the conv's output, before after_conv."""
        if self.arch == "mlp":
            # A features-only baseline: the block only says which rows are destinations.
            h = self.layers[i](h[: block.num_dst_nodes()])
        elif EDGE_WEIGHT in block.edata:
            w = block.edata[EDGE_WEIGHT]
            if h.device.type == "cpu" and torch.is_autocast_cpu_enabled():
                # DGL casts edge weights to the features' dtype only under CUDA autocast; on CPU a bf16
                # message times an fp32 weight is refused, so weighted layers run in fp32 there.
                with torch.autocast("cpu", enabled=False):
                    h = self.layers[i](block, h.float(), edge_weight=w.float())
            else:
                h = self.layers[i](block, h, edge_weight=w)
        else:
            h = self.layers[i](block, h)
        return self.after_conv(i, h) if finish else h

    def after_conv(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """What layer i applies to its conv's output: norm, activation, dropout (none on the last layer).

        Row-wise, so inference can cache conv outputs and finish them later (inference/propagate.py).
        """
        if i < self.num_layers - 1:
            # In place: the layer's last op (a bias add) does not keep its output for backward, so this
            # saves one [rows, hidden] tensor per layer (autograd would refuse if that ever changed).
            h = self.dropout(torch.relu_(self.norms[i](h)))
        return h

    def forward(self, blocks, x: torch.Tensor | None, first: tuple | None = None) -> torch.Tensor:
        """first: (sums, own rows, in-degrees) of blocks[0]'s destinations (training/first_sums.py) in
        place of x, for a first layer that sums before it projects (models/sums.py); bit-equal."""
        if first is None:
            h, start = x, 0
        else:
            sums, own, deg = first
            h, start = self.after_conv(0, sage_from_sums(self.layers[0], sums, deg, own)), 1
        for i in range(start, len(blocks)):
            h = self.layer_forward(i, blocks[i], h)
        return h


def _norm(kind: str, dim: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm1d(dim)
    if kind == "layer":
        return nn.LayerNorm(dim)
    return nn.Identity()


def exact_on_blocks(cfg) -> bool:
    """Is every layer's output at a node a function of that node's own row and its in-edges alone? Then a
    block holding a node's in-edges gives it the value the whole graph would (sampling/prune.py). Not for
    GraphConv (norm="both" also reads the sources' out-degrees) nor batch norm (statistics over the rows
    a layer computes)."""
    return cfg.arch in ("sage", "mlp") and (cfg.norm or "none") != "batch"


def check_model_cfg(cfg) -> None:
    if cfg.arch not in ARCHS:
        raise ConfigError(f"model.arch={cfg.arch!r} is not known", f"choose one of {', '.join(ARCHS)}")
    if cfg.aggregator not in AGGREGATORS:
        raise ConfigError(
            f"model.aggregator={cfg.aggregator!r} is not known", f"choose one of {', '.join(AGGREGATORS)}"
        )
    norm = cfg.norm or "none"
    if norm not in NORMS:
        raise ConfigError(f"model.norm={cfg.norm!r} is not known", f"choose one of {', '.join(NORMS)}")
    if cfg.num_layers < 1:
        raise ConfigError(
            f"model.num_layers={cfg.num_layers} must be at least 1", "use e.g. model.num_layers=2"
        )
    if cfg.hidden < 1:
        raise ConfigError(f"model.hidden={cfg.hidden} must be positive", "use e.g. model.hidden=256")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.dropout} must be in [0, 1)", "use e.g. model.dropout=0.5")


def build_model(cfg, in_dim: int, num_classes: int) -> GNN:
    """Factory: the `model` config node (arch, hidden, num_layers, aggregator, dropout, norm) -> GNN."""
    check_model_cfg(cfg)
    return GNN(
        cfg.arch,
        int(in_dim),
        int(cfg.hidden),
        int(num_classes),
        int(cfg.num_layers),
        aggregator=cfg.aggregator,
        dropout=float(cfg.dropout),
        norm=cfg.norm or "none",
    )


def model_signature(cfg, in_dim: int, num_classes: int) -> dict:
    """What a checkpoint's weights depend on; a checkpoint from another signature is refused."""
    return {
        "arch": str(cfg.arch),
        "hidden": int(cfg.hidden),
        "num_layers": int(cfg.num_layers),
        "aggregator": str(cfg.aggregator),
        "norm": str(cfg.norm or "none"),
        "in_dim": int(in_dim),
        "num_classes": int(num_classes),
        # only when on: checkpoints made before the option keep their signature hash
        **({"degree_feature": True} if cfg.get("degree_feature", False) else {}),
    }


def signature_hash(signature: dict) -> str:
    return hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:16]
