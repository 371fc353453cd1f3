"""Helpers for the infer tests (no tests here): checkpoints in train's format, the full-graph reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from gnnscale.config import compose_config
from gnnscale.inference.layerwise import full_graph_forward
from gnnscale.models import build_model, model_signature, signature_hash
from gnnscale.sampling.graph import to_dgl_graph
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir


def make_ckpt(
    out_dir: Path,
    graph_dir: Path,
    *,
    arch: str = "sage",
    aggregator: str = "mean",
    norm: str = "batch",
    dropout: float = 0.5,
    num_layers: int = 2,
    hidden: int = 16,
    steps: int = 5,
    in_dim: int | None = None,
    seed: int = 0,
) -> Path:
    """A train-style run_dir/checkpoints/last.pt; a few full-graph steps give BatchNorm real running stats."""
    graph = GraphDir(graph_dir)
    feat_dim, num_classes = int(graph.meta["feat_dim"]), int(graph.meta["num_classes"])
    in_dim = feat_dim if in_dim is None else in_dim
    cfg = OmegaConf.create(
        dict(
            arch=arch, hidden=hidden, num_layers=num_layers, aggregator=aggregator, dropout=dropout, norm=norm
        )
    )
    torch.manual_seed(seed)
    model = build_model(cfg, in_dim, num_classes)
    if steps and in_dim == feat_dim:
        g = to_dgl_graph(graph).formats(["csc", "csr", "coo"])
        x = FeatureStore(graph, in_memory=True).gather(torch.arange(graph.num_nodes)).float()
        y, train = graph.labels(), graph.mask("train")
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        model.train()
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model([g] * num_layers, x)[train], y[train])
            loss.backward()
            opt.step()
    sig = model_signature(cfg, in_dim, num_classes)
    ckpt = {
        "model": model.state_dict(),
        "signature": sig,
        "signature_hash": signature_hash(sig),
        "model_cfg": OmegaConf.to_container(cfg),
        "graph": {
            "name": graph.meta["name"],
            "num_nodes": graph.num_nodes,
            "feat_dim": in_dim,
            "num_classes": num_classes,
            "graph_dir": str(graph_dir),
        },
        "epoch": steps,
        "optimizer": {},
    }
    path = Path(out_dir) / "checkpoints" / "last.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path


def reference_layers(ckpt_path: Path, graph_dir: Path, train_mode: bool = False) -> list[np.ndarray]:
    """Every layer of the model's full-graph forward pass (eval mode unless train_mode)."""
    from gnnscale.models.checkpoint import load_model

    ck = load_model(ckpt_path)
    graph = GraphDir(graph_dir)
    g = to_dgl_graph(graph).formats(["csc", "csr", "coo"])
    x = FeatureStore(graph, in_memory=True).gather(torch.arange(graph.num_nodes))
    if train_mode:
        ck.model.train()
    return [h.numpy() for h in full_graph_forward(ck.model, g, x)]


def infer(tmp_path: Path, name: str, *overrides: str) -> dict:
    from gnnscale.stages import infer as stage

    return stage.run(compose_config("infer", [f"run_dir={tmp_path / name}", *overrides]))
