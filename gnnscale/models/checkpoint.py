"""The checkpoint format, owned here alone: written by train, read by resume, infer and --update.

A checkpoint is a plain dict of tensors and numbers, written atomically and loaded with
weights_only=True (a file from elsewhere cannot run code). Keys:
  format_version, model (state_dict), signature (+ signature_hash), model_cfg, graph (what it was
  trained on), epoch, optimizer, scheduler, scaler, rng, config_hash, best_val, best_epoch, metric, stopped.
Files written before format_version existed are version 1.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from gnnscale.errors import ConfigError, DataError
from gnnscale.models import GNN, build_model, model_signature, signature_hash
from gnnscale.utils.atomic import atomic_path

FORMAT_VERSION = 1
REQUIRED_KEYS = ("model", "model_cfg", "graph")


def save_checkpoint(path: Path, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save({"format_version": FORMAT_VERSION, **state}, tmp)


def read_checkpoint(path: str | Path) -> dict:
    """The raw checkpoint dict; the one place a checkpoint is unpickled (weights_only)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"checkpoint {path} does not exist",
            "point resume=/ckpt= at a train run_dir that has checkpoints/last.pt",
        )
    try:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(
            f"cannot read checkpoint {path}: {first}", "pass a checkpoint written by `gnnscale train`"
        ) from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise DataError(
            f"checkpoint {path} lacks {', '.join(missing)}", "pass a checkpoint written by `gnnscale train`"
        )
    if int(ckpt.get("format_version", 1)) > FORMAT_VERSION:
        raise DataError(
            f"checkpoint {path} has format version {ckpt['format_version']}, this gnnscale reads up to {FORMAT_VERSION}",
            "upgrade gnnscale",
        )
    return ckpt


def check_signature(ckpt: dict, signature: dict, path: Path) -> None:
    """Refuse weights trained for another model shape, naming the fields that differ."""
    theirs = ckpt.get("signature", {})
    diff = [f"{k} {theirs.get(k)!r} vs {signature[k]!r}" for k in signature if theirs.get(k) != signature[k]]
    if diff:
        raise ConfigError(
            f"checkpoint {path} was trained with a different model config ({'; '.join(diff)}; checkpoint vs this run)",
            "resume with the checkpoint's model settings or start a new run (another run_dir, or overwrite=true)",
        )


def weights_hash(state_dict: dict) -> str:
    """Identifies the exact weights: cached layer outputs are only reusable with the very same model."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        t = state_dict[key]
        h.update(key.encode())
        if isinstance(t, torch.Tensor):
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


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


def load_model(path: Path) -> LoadedCheckpoint:
    """The trained model of a checkpoint file, in eval mode, checked against its own signature."""
    ckpt = read_checkpoint(path)
    model_cfg, graph = dict(ckpt["model_cfg"]), dict(ckpt["graph"])
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
    model.eval()  # dropout off, BatchNorm on its running statistics: the point of inference
    epoch = ckpt.get("epoch")
    return LoadedCheckpoint(
        path=Path(path),
        model=model,
        model_cfg=model_cfg,
        graph=graph,
        in_dim=in_dim,
        num_classes=num_classes,
        signature_hash=sig_hash,
        weights_hash=weights_hash(ckpt["model"]),
        epoch=int(epoch) if epoch is not None else None,
    )


def check_fits_graph(ck: LoadedCheckpoint, graph) -> None:
    """A model trained on another graph must not silently produce garbage embeddings (graph: a GraphDir)."""
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
