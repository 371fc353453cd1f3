"""Checkpoints: plain dicts of tensors and numbers, written atomically, loaded with weights_only=True.

Contract (the infer stage reads it): keys model, signature, signature_hash, model_cfg, graph,
epoch, optimizer, scheduler, scaler, rng, config_hash, best_val (+ best_epoch, metric, stopped).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.utils.atomic import atomic_path

LAST, BEST = "last.pt", "best.pt"


def rng_state() -> dict:
    """Every RNG as tensors and numbers (no numpy objects, so weights_only loading accepts it)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(py[0]), "state": torch.tensor(py[1], dtype=torch.int64)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"checkpoint {path} does not exist",
            "point resume=/ckpt= at a train run_dir that has checkpoints/last.pt",
        )
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DataError(
            f"cannot read checkpoint {path}: {str(exc).splitlines()[0]}",
            "it is corrupt or not a gnnscale checkpoint",
        ) from None


def check_signature(ckpt: dict, signature: dict, path: Path) -> None:
    """Refuse weights trained for another model shape, naming the fields that differ."""
    theirs = ckpt.get("signature", {})
    diff = [f"{k} {theirs.get(k)!r} vs {signature[k]!r}" for k in signature if theirs.get(k) != signature[k]]
    if diff:
        raise ConfigError(
            f"checkpoint {path} was trained with a different model config ({'; '.join(diff)}; checkpoint vs this run)",
            "resume with the checkpoint's model settings or start a new run (another run_dir, or overwrite=true)",
        )
