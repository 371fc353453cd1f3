"""Every RNG a run draws from: reseeded per epoch from (seed, epoch), saved in checkpoints as plain tensors."""

from __future__ import annotations

import random

import numpy as np
import torch


def epoch_seed(seed: int, epoch: int, stream: int = 0, rank: int = 0) -> int:
    """A per-epoch seed: epoch k draws the same randomness whether or not the run was resumed. Each rank
    of a data-parallel run draws its own (rank 0 the single-process run's)."""
    entropy = [int(seed), int(epoch), int(stream)] + ([int(rank)] if rank else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] % (2**31 - 1))


def reseed(seed: int) -> None:
    import dgl

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)  # every thread of this thread's DGL OpenMP team: the ones that will sample


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
