"""Samplers (`sampler=`) and loaders: plain factories over DGL's samplers and DataLoader.

`build_sampler(cfg, num_layers)` maps a sampler config to a sampler; `build_loader` turns it into an
iterable of `Batch` (sampling/batch.py) over a seed set, seeded and shuffling. A block sampler (a
`dgl.dataloading.BlockSampler`, like `neighbor`: DGL's draws relabelled by gnnscale, see
sampling/neighbor.py) runs inside DGL's DataLoader; a sampler that makes its own batches (a subgraph
formation) has a `loader(g, seeds, batch_size, shuffle, num_workers, drop_last)` method instead.
Adding one: a file in sampling/ and one entry in SAMPLERS with the same factory signature.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from gnnscale.errors import ConfigError
from gnnscale.sampling.batch import Batch


def check_fanouts(fanouts: Sequence[int], num_layers: int, key: str = "sampler.fanouts") -> list[int]:
    fanouts = [int(f) for f in fanouts]
    if len(fanouts) != num_layers:
        raise ConfigError(
            f"{key} has {len(fanouts)} entries but model.num_layers={num_layers}",
            f"give one fanout per layer, e.g. {key}=[{','.join(['10'] * num_layers)}] or change model.num_layers",
        )
    bad = [f for f in fanouts if f == 0 or f < -1]
    if bad:
        raise ConfigError(
            f"{key}={fanouts} holds {bad[0]}", "each fanout is a positive count or -1 (all neighbours)"
        )
    return fanouts


def _neighbor(cfg, num_layers: int, fanouts: Sequence[int] | None):
    from gnnscale.sampling.neighbor import NeighborBlockSampler

    fanouts = check_fanouts(cfg.fanouts if fanouts is None else fanouts, num_layers)
    return NeighborBlockSampler(fanouts, replace=bool(cfg.get("replace", False)))


# kind -> factory(cfg, num_layers, fanouts_override) -> a block sampler, or an object with .loader(...)
SAMPLERS: dict[str, Callable] = {"neighbor": _neighbor}


def check_sampler_cfg(cfg, num_layers: int) -> None:
    if cfg.kind not in SAMPLERS:
        raise ConfigError(
            f"sampler.kind={cfg.kind!r} is not available", f"choose one of {', '.join(SAMPLERS)}"
        )
    check_fanouts(cfg.fanouts, num_layers)


def build_sampler(cfg, num_layers: int, fanouts: Sequence[int] | None = None):
    """Factory: sampler config -> DGL block sampler; `fanouts` overrides cfg.fanouts (evaluation)."""
    check_sampler_cfg(cfg, num_layers)
    return SAMPLERS[cfg.kind](cfg, num_layers, fanouts)


class BlockLoader:
    """Batches of a DGL block sampler: DGL's DataLoader, each (input_nodes, seeds, blocks) as a Batch."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        it = iter(self.loader)  # the shuffle is drawn now, in the caller's thread, after its reseed
        return (Batch(input_nodes, seeds, blocks=blocks) for input_nodes, seeds, blocks in it)


def build_loader(
    g,
    seeds: torch.Tensor,
    sampler,
    batch_size: int,
    shuffle: bool,
    num_workers: int = 0,
    drop_last: bool = False,
):
    """An iterable of Batch over `seeds`. Shuffling draws from numpy's global RNG and sampling from
    DGL's, both reseeded per epoch by the training loop, so every epoch is reproducible."""
    import dgl

    own = getattr(sampler, "loader", None)
    if own is not None:
        return own(g, seeds, batch_size, shuffle, num_workers, drop_last)
    kwargs = {}
    if num_workers > 0:
        # Workers inherit DGL's RNG state by fork; reseed each from torch's per-worker seed
        # (itself drawn from the reseeded main RNG) so workers differ and runs still repeat.
        kwargs["worker_init_fn"] = _seed_worker
        kwargs["persistent_workers"] = False
    return BlockLoader(
        dgl.dataloading.DataLoader(
            g,
            seeds,
            sampler,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=num_workers,
            **kwargs,
        )
    )


_numbered_threads = 1  # the team size up to which this process's DGL threads hold their stream numbers


def set_sampling_threads(n: int) -> None:
    """Size DGL's OpenMP team (its own runtime: torch.set_num_threads does not reach it) so that
    seeded sampling repeats in any process with the same thread count.

    DGL seeds thread k's stream with seed + k, where k is the order in which threads first touch
    their RNG. When a team first seeds all at once, its threads race for those numbers and the
    streams land on different chunks of work in every process. Growing the team one thread at a
    time, seeding at each size, hands the numbers out in OpenMP thread order instead.
    """
    import dgl
    from dgl.utils import set_num_threads

    global _numbered_threads
    n = max(1, int(n))
    for k in range(_numbered_threads, n + 1):
        set_num_threads(k)
        dgl.seed(0)  # the caller reseeds afterwards; this only numbers the team's threads
    _numbered_threads = max(_numbered_threads, n)
    set_num_threads(n)


def _seed_worker(worker_id: int) -> None:
    import dgl
    import numpy as np
    from dgl.utils import get_num_threads

    global _numbered_threads
    _numbered_threads = 1  # a forked worker starts without the parent's OpenMP threads: number its own
    set_sampling_threads(get_num_threads())
    seed = torch.initial_seed() % (2**31)
    np.random.seed(seed)
    dgl.seed(seed)


__all__ = [
    "SAMPLERS",
    "Batch",
    "build_loader",
    "build_sampler",
    "check_fanouts",
    "check_sampler_cfg",
    "set_sampling_threads",
]
