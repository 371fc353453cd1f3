"""Find a train checkpoint, load it without running code (weights_only) and check it fits the graph."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from gnnscale.errors import ConfigError, DataError
from gnnscale.models import GNN, build_model, model_signature, signature_hash
from gnnscale.storage.graph_dir import GraphDir

REQUIRED_KEYS = ("model", "model_cfg", "graph")
CKPT_NAMES = ("best.pt", "last.pt")  # best on validation first: that is the model a user means


@dataclass
class LoadedCheckpoint:
    path: Path
    model: GNN
    model_cfg: dict
    graph: dict  # {"name", "num_nodes", "feat_dim", "num_classes", "graph_dir"} as train saw it
    in_dim: int
    num_classes: int
    signature_hash: str
    weights_hash: str
    epoch: int | None

    @property
    def num_layers(self) -> int:
        return int(self.model_cfg["num_layers"])


def newest_train_run(runs_root: Path = Path("runs") / "train") -> Path:
    runs = sorted(
        (
            p
            for p in runs_root.glob("*")
            if p.is_dir() and any((p / "checkpoints" / n).is_file() for n in CKPT_NAMES)
        ),
        key=lambda p: p.name,
    )
    if not runs:
        raise ConfigError(
            f"no train run with a checkpoint under {runs_root}/",
            "pass ckpt=PATH (a .pt file or a train run_dir) or run `gnnscale train` first",
        )
    return runs[-1]


def resolve_ckpt(spec: str | None) -> Path:
    """ckpt= may name a checkpoint file, a train run_dir, or its checkpoints/ folder; None = newest run."""
    path = newest_train_run() if not spec else Path(spec)
    if path.is_dir():
        for folder in (path / "checkpoints", path):
            for name in CKPT_NAMES:
                if (folder / name).is_file():
                    return folder / name
        raise ConfigError(
            f"'{path}' holds no checkpoints/best.pt or checkpoints/last.pt",
            "pass ckpt= a train run_dir or a .pt file",
        )
    if not path.is_file():
        raise ConfigError(
            f"checkpoint '{path}' does not exist",
            "pass ckpt= a .pt file or a train run_dir (default: the newest under runs/train)",
        )
    return path


def weights_hash(state_dict: dict) -> str:
    """Identifies the exact weights: cached layer outputs are only reusable with the very same model."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        t = state_dict[key]
        h.update(key.encode())
        if isinstance(t, torch.Tensor):
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def load_checkpoint(spec: str | None) -> LoadedCheckpoint:
    path = resolve_ckpt(spec)
    try:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(
            f"cannot read checkpoint {path}: {first}", "pass a checkpoint written by `gnnscale train`"
        ) from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
        raise DataError(
            f"checkpoint {path} lacks {', '.join(missing)}", "pass a checkpoint written by `gnnscale train`"
        )
    model_cfg = dict(ckpt["model_cfg"])
    graph = dict(ckpt["graph"])
    sig = dict(ckpt.get("signature") or {})
    in_dim = int(sig.get("in_dim", graph.get("feat_dim", -1)))
    num_classes = int(sig.get("num_classes", graph.get("num_classes", -1)))
    if in_dim < 1 or num_classes < 1:
        raise DataError(
            f"checkpoint {path} records no input dimension / class count",
            "pass a checkpoint written by `gnnscale train`",
        )
    cfg = OmegaConf.create(
        {"arch": "sage", "aggregator": "mean", "dropout": 0.0, "norm": "none", **model_cfg}
    )
    model = build_model(cfg, in_dim, num_classes)
    try:
        model.load_state_dict(ckpt["model"], strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise DataError(
            f"checkpoint {path} weights do not match its model_cfg ({first})",
            "the file is corrupt or from another model; retrain",
        ) from None
    sig_hash = signature_hash(model_signature(cfg, in_dim, num_classes))
    if ckpt.get("signature_hash") and ckpt["signature_hash"] != sig_hash:
        raise DataError(
            f"checkpoint {path} signature_hash does not match its model_cfg",
            "the file is corrupt or edited; retrain",
        )
    # Eval mode is the whole point: dropout off, BatchNorm on its running statistics.
    model.eval()
    epoch = ckpt.get("epoch")
    return LoadedCheckpoint(
        path=path,
        model=model,
        model_cfg=model_cfg,
        graph=graph,
        in_dim=in_dim,
        num_classes=num_classes,
        signature_hash=sig_hash,
        weights_hash=weights_hash(ckpt["model"]),
        epoch=int(epoch) if epoch is not None else None,
    )


def check_fits_graph(ck: LoadedCheckpoint, graph: GraphDir) -> None:
    """A model trained on another graph must not silently produce garbage embeddings."""
    feat_dim, num_classes = int(graph.meta["feat_dim"]), int(graph.meta["num_classes"])
    trained_on = f"trained on '{ck.graph.get('graph_dir') or ck.graph.get('name')}'"
    if ck.in_dim != feat_dim:
        raise DataError(
            f"checkpoint {ck.path} expects {ck.in_dim} input features but graph_dir '{graph.path}' has feat_dim {feat_dim} ({trained_on})",
            "pass graph_dir= the graph the model was trained on, or retrain on this one",
        )
    if ck.num_classes != num_classes:
        raise DataError(
            f"checkpoint {ck.path} predicts {ck.num_classes} classes but graph_dir '{graph.path}' has {num_classes} ({trained_on})",
            "pass graph_dir= the graph the model was trained on, or retrain on this one",
        )
