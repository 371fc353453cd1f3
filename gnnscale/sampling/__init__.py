"""Samplers (`sampler=`) and loaders: plain factories over DGL's samplers and DataLoader.

`build_sampler(cfg, num_layers)` maps a sampler config to a sampler; `build_loader` turns it into an
iterable of `Batch` (sampling/batch.py) over a seed set, seeded and shuffling. Two kinds of sampler:

- a block sampler (a `dgl.dataloading.BlockSampler`: neighbor, labor, importance, weighted,
  random_walk) draws a neighbourhood per seed batch and runs inside DGL's DataLoader, its blocks
  relabelled by gnnscale (sampling/blocks.py) so seeded runs repeat;
- a formation that makes its own batches (cluster_gcn, saint, full: one subgraph every layer runs on)
  has a `loader(g, seeds, batch_size, shuffle, num_workers, drop_last)` method instead. Training hands
  cluster_gcn's and saint's subgraphs (`per_batch_subgraphs`) to the model as blocks over the rows the
  loss reads when that leaves the loss unchanged (sampling/prune.py).

A sampler that needs the graph before its first batch (partitions, node scores, pre-sampled
normalisation) has `prepare(ctx: SamplingContext)`, called once by the trainer's factories.
Evaluation (validation, test) of a subgraph formation uses neighbour sampling over all neighbours
(or train.eval_fanouts): exact, and the same for every formation. Adding a sampler: a file in
sampling/, one entry in SAMPLERS, a schema in config/schema.py and a configs/sampler/<kind>.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
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


def _lazy(module: str, factory: str = "build") -> Callable:
    """A SAMPLERS entry whose module is imported only when that kind is chosen."""

    def make(cfg, num_layers: int, fanouts: Sequence[int] | None):
        import importlib

        return getattr(importlib.import_module(f"gnnscale.sampling.{module}"), factory)(
            cfg, num_layers, fanouts
        )

    return make


# kind -> factory(cfg, num_layers, fanouts_override) -> a block sampler, or an object with .loader(...)
SAMPLERS: dict[str, Callable] = {
    "neighbor": _neighbor,
    "labor": _lazy("labor"),
    "importance": _lazy("importance"),
    "weighted": _lazy("weighted"),
    "random_walk": _lazy("random_walk"),
    "cluster_gcn": _lazy("cluster_gcn"),
    "saint": _lazy("saint"),
    "full": _lazy("full"),
}
SEED_ORDERS = ("random", "stratified")
# kind -> its `+exp=` preset (configs/exp/), each one that trains as is; `weighted` needs a user's edge weights
PRESETS = {
    "neighbor": "sage_2hop",
    "labor": "sage_labor",
    "importance": "sage_importance",
    "random_walk": "sage_random_walk",
    "cluster_gcn": "cluster_gcn",
    "saint": "saint",
    "full": "full_gcn",
}


@dataclass
class SamplingContext:
    """What a sampler's `prepare` may read: the graph_dir (partitions, cached node scores), the DGL graph,
    the training seeds and their labels, and a folder of the run to cache its own results in."""

    graph: object  # storage.graph_dir.GraphDir
    g: object  # DGLGraph over the mmap'd CSC
    train_ids: torch.Tensor
    labels: torch.Tensor
    cache_dir: Path | None = None
    seed: int = 0


def has_fanouts(cfg) -> bool:
    """Does this formation sample per-layer neighbourhoods (sampler.fanouts)?"""
    return cfg.get("fanouts") is not None


def check_sampler_cfg(cfg, num_layers: int) -> None:
    if cfg.kind not in SAMPLERS:
        raise ConfigError(
            f"sampler.kind={cfg.kind!r} is not available", f"choose one of {', '.join(SAMPLERS)}"
        )
    if cfg.get("seed_order", "random") not in SEED_ORDERS:
        raise ConfigError(
            f"sampler.seed_order={cfg.seed_order!r} is not known", f"choose one of {', '.join(SEED_ORDERS)}"
        )
    SAMPLERS[cfg.kind](cfg, num_layers, None)  # each factory checks its own options


def build_sampler(cfg, num_layers: int, fanouts: Sequence[int] | None = None):
    """Factory: sampler config -> sampler; `fanouts` overrides cfg.fanouts."""
    check_sampler_cfg(cfg, num_layers)
    return SAMPLERS[cfg.kind](cfg, num_layers, fanouts)


def build_eval_sampler(cfg, num_layers: int, eval_fanouts: Sequence[int] | None = None):
    """The validation / test sampler: the training formation at `eval_fanouts` (default its own fanouts);
    a formation without fanouts (subgraphs, full graph) is evaluated over all neighbours."""
    if has_fanouts(cfg):
        return build_sampler(cfg, num_layers, eval_fanouts)
    from gnnscale.sampling.neighbor import NeighborBlockSampler

    fanouts = [-1] * num_layers if eval_fanouts is None else eval_fanouts
    return NeighborBlockSampler(check_fanouts(fanouts, num_layers, key="train.eval_fanouts"))


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
    seed_labels: torch.Tensor | None = None,
    loss_blocks_layers: int = 0,
):
    """An iterable of Batch over `seeds`. Shuffling draws from numpy's global RNG and sampling from
    DGL's, both reseeded per epoch by the training loop, so every epoch is reproducible.

    seed_labels (the seeds' labels, given for sampler.seed_order=stratified): each batch then holds the
    labels' class proportions; the order is drawn when the loader is iterated, like DGL's shuffle.
    loss_blocks_layers (the model's layer count, when models.exact_on_blocks holds): a formation whose
    batches are per-batch subgraphs yields them as blocks over what the loss reads (sampling/prune.py)."""
    import dgl

    own = getattr(sampler, "loader", None)
    if own is not None:
        loader = own(g, seeds, batch_size, shuffle, num_workers, drop_last)
        if loss_blocks_layers > 0 and getattr(sampler, "per_batch_subgraphs", False):
            from gnnscale.sampling.prune import LossBlocksLoader

            return LossBlocksLoader(loader, loss_blocks_layers)
        return loader
    if seed_labels is not None and shuffle:
        from gnnscale.sampling.stratified import StratifiedLoader

        return StratifiedLoader(
            lambda ordered: build_loader(g, ordered, sampler, batch_size, False, num_workers, drop_last),
            seeds,
            seed_labels,
            batch_size,
        )
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
    "PRESETS",
    "SAMPLERS",
    "Batch",
    "SamplingContext",
    "build_eval_sampler",
    "build_loader",
    "build_sampler",
    "check_fanouts",
    "check_sampler_cfg",
    "has_fanouts",
    "set_sampling_threads",
]
