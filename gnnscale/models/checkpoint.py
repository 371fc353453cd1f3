"""The checkpoint format, owned here alone: written by train, read by resume, infer and --update.

A checkpoint is a plain dict of tensors and numbers, written atomically and loaded with
weights_only=True (a file from elsewhere cannot run code). Keys:
  format_version, model (state_dict), signature (+ signature_hash), model_cfg, graph (what it was
  trained on), epoch, optimizer, scheduler, scaler, rng, config_hash, best_val, best_epoch, metric, stopped.
Files written before format_version existed are version 1.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from gnnscale.errors import ConfigError, DataError
from gnnscale.models import GNN, build_model, model_signature, signature_hash
from gnnscale.storage.run_dir import read_json
from gnnscale.utils.atomic import atomic_path, write_json
from gnnscale.utils.diskspace import ensure_space

FORMAT_VERSION = 1
KNOWN_VERSIONS = (1,)
REQUIRED_KEYS = ("model", "model_cfg", "graph")
LINK_DECODER = "link_decoder."  # the state-dict prefix of task=link's decoder weights (mlp, or pair counts)
# Beside the checkpoints: {file name: [sha256, ...]}, the hashes a checkpoint file may have. While a file is
# being replaced both its old and new hash are listed, so a run killed at any point leaves a pair that
# checks; a changed byte matches neither.
SUMS_FILE = "sha256.json"


def _read_sums(folder: Path) -> dict:
    sums = read_json(folder / SUMS_FILE)
    return sums if isinstance(sums, dict) else {}


def save_checkpoint(paths: Path | list[Path], state: dict) -> None:
    """Write state to each path (serialised once: best.pt and last.pt of one epoch are the same bytes),
    atomically, with its sha256 recorded in SUMS_FILE beside it."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    buf = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, **state}, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    folder = paths[0].parent
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".*.pt.*.tmp"):  # left by a run killed mid-write (the run_dir lock is ours)
        stale.unlink(missing_ok=True)
    ensure_space(folder, len(data) * len(paths) + 16384)  # the last epoch's files stay as they are
    sums = _read_sums(folder)
    # until each file is renamed into place, every hash it may have on disk stays accepted
    pending = {p.name: list(dict.fromkeys([digest, *sums.get(p.name, [])])) for p in paths}
    write_json(folder / SUMS_FILE, {**sums, **pending})
    for path in paths:
        with atomic_path(path, need_bytes=len(data)) as tmp:
            tmp.write_bytes(data)
    write_json(folder / SUMS_FILE, {**sums, **{p.name: [digest] for p in paths}})


def read_checkpoint(path: str | Path) -> dict:
    """The raw checkpoint dict; the one place a checkpoint is unpickled (weights_only), after its sha256
    is checked against the one train recorded beside it (checkpoints/sha256.json)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"checkpoint {path} does not exist",
            "point resume=/ckpt= at a train run_dir that has checkpoints/last.pt",
        )
    data = path.read_bytes()
    recorded = _read_sums(path.parent).get(path.name)
    if recorded and hashlib.sha256(data).hexdigest() not in recorded:
        raise DataError(
            f"checkpoint {path} does not match the sha256 recorded in {path.parent / SUMS_FILE} "
            "(it is corrupt or was changed)",
            "restore the file, or retrain (`gnnscale train`, overwrite=true for this run_dir)",
        )
    try:
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
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
    version = ckpt.get("format_version", 1)
    if not isinstance(version, int) or version not in KNOWN_VERSIONS:
        raise DataError(
            f"checkpoint {path} has format version {version!r}, this gnnscale reads "
            f"{', '.join(map(str, KNOWN_VERSIONS))}",
            "upgrade gnnscale if a newer one wrote it, or retrain with this one",
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
    task: str = "node"  # link: the last layer is an embedding of width num_classes, not class logits
    # task=link: mlp when a trained pair decoder (link_decoder.*) scored the pairs; dot+counts when the
    # inner product had a learned term of the pair's structural counts added (task.pair_features)
    decoder: str = "dot"

    @property
    def num_layers(self) -> int:
        return int(self.model_cfg["num_layers"])

    @property
    def degree_feature(self) -> bool:
        """Trained with model.degree_feature: its input rows end in log1p(in-degree)."""
        return bool(self.model_cfg.get("degree_feature", False))


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
    # task=link's decoder=mlp rides in the state as link_decoder.*: embeddings need only the GNN's part.
    state = {k: v for k, v in ckpt["model"].items() if not k.startswith(LINK_DECODER)}
    try:
        model.load_state_dict(state, strict=True)
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
        task=str(ckpt.get("task", "node")),
        decoder=_decoder_kind(ckpt["model"], num_classes),
    )


def _decoder_kind(state: dict, width: int) -> str:
    """A pair MLP reads a * b (the embedding width, plus any counts); a count head only the few counts."""
    first = state.get(LINK_DECODER + "net.0.weight")
    if first is None:
        return "dot"
    return "dot+counts" if first.shape[1] < width else "mlp"


def check_fits_graph(ck: LoadedCheckpoint, graph) -> None:
    """A model trained on another graph must not silently produce garbage embeddings (graph: a GraphDir)."""
    feat_dim, num_classes = int(graph.meta["feat_dim"]), int(graph.meta["num_classes"])
    trained_on = f"trained on '{ck.graph.get('graph_dir') or ck.graph.get('name')}'"
    if ck.in_dim != feat_dim + ck.degree_feature:  # the degree column is appended, not stored
        raise DataError(
            f"checkpoint {ck.path} expects {ck.in_dim - ck.degree_feature} input features but graph_dir '{graph.path}' has feat_dim {feat_dim} ({trained_on})",
            "pass graph_dir= the graph the model was trained on, or retrain on this one",
        )
    if ck.task == "node" and ck.num_classes != num_classes:
        raise DataError(
            f"checkpoint {ck.path} predicts {ck.num_classes} classes but graph_dir '{graph.path}' has {num_classes} ({trained_on})",
            "pass graph_dir= the graph the model was trained on, or retrain on this one",
        )
