"""Which training seeds each rank owns (`dist.split`), and how much of what a rank samples lies outside
its own part (the halo: the nodes whose features a partitioned deployment would fetch from another host).

Both splits deal the graph's nodes to the ranks through a partition from `gnnscale partition`, kept in
graph_dir/partitions/: `random` (nodes dealt at random, seeded) or `metis` (METIS parts with training
nodes balanced, as DistDGL does). A rank trains on the training nodes of its part; ranks with fewer
repeat some of theirs so every rank has as many seeds (and batches) as the largest.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.training.sync import Sync
from gnnscale.training.trainer import Callback

SPLITS = ("random", "metis")


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(
            f"dist.split={split} is not one of {', '.join(SPLITS)}", "use dist.split=random or metis"
        )
    return split


def rank_assignment(graph, split: str, world: int, seed: int) -> np.ndarray:
    """Node -> rank, from the `split` partition into `world` parts (made when missing)."""
    from gnnscale.partition import ensure_partition

    check_split(split)
    return ensure_partition(graph, split, world, seed, balance_train=True if split == "metis" else None)


def rank_seeds(train_ids: torch.Tensor, assignment: np.ndarray, rank: int, world: int) -> torch.Tensor:
    """This rank's training seeds, padded by repeating its own to the largest rank's count."""
    owner = torch.from_numpy(np.asarray(assignment[train_ids.numpy()], dtype=np.int64))
    counts = torch.bincount(owner, minlength=world)
    if int(counts.min()) == 0:
        empty = int(torch.argmin(counts))
        raise DataError(
            f"rank {empty}'s part holds none of the {len(train_ids):,} training nodes",
            "use dist.split=random, fewer processes (dist.nproc) or a graph with more training nodes",
        )
    mine = train_ids[owner == rank]
    short = int(counts.max()) - len(mine)
    return torch.cat([mine, mine.repeat(short // len(mine) + 1)[:short]]) if short else mine


def share_data(data, assignment: np.ndarray, sync: Sync):
    """A view of `data` with this rank's splits: its training seeds, and every world-th node of val and
    test (evaluation gathers every rank's results before scoring, so each node is scored once)."""
    splits = {
        "train": rank_seeds(data.splits["train"], assignment, sync.rank, sync.world),
        **{s: data.splits[s][sync.rank :: sync.world] for s in ("val", "test")},
    }
    return dataclasses.replace(data, splits=splits)


class HaloMeter(Callback):
    """halo_frac in metrics.jsonl: the share of the epoch's sampled input nodes (all ranks) outside the
    sampling rank's part."""

    def __init__(self, assignment: np.ndarray, sync: Sync):
        self.owner = torch.from_numpy(
            np.asarray(assignment, dtype=np.int16 if sync.world < 2**15 else np.int32)
        )
        self.sync = sync
        self.outside = self.total = 0

    def on_epoch_start(self, epoch: int, num_batches: int) -> None:
        self.outside = self.total = 0

    def on_batch_end(self, epoch: int, end) -> None:
        if end.input_nodes is None:
            return
        nodes = end.input_nodes.cpu()
        self.outside += int((self.owner[nodes] != self.sync.rank).sum())
        self.total += len(nodes)

    def on_epoch_record(self, epoch: int, record: dict, model) -> None:
        outside, total = self.sync.sum([self.outside, self.total])
        record["halo_frac"] = round(outside / total, 4) if total else None


def rank_share(cfg, data, sync: Sync):
    """(data with this rank's splits, the rank's callbacks, every training node); unchanged in one process."""
    if sync.world == 1:
        return data, [], None
    assignment = sync.rank_zero_first(
        lambda: rank_assignment(data.graph, cfg.dist.split, sync.world, int(cfg.seed))
    )
    return share_data(data, assignment, sync), [HaloMeter(assignment, sync)], data.splits["train"]


def rank_budget(budget, sync: Sync):
    """A rank's share of the machine's memory budget: the ranks on one machine share its RAM."""
    from gnnscale.dist.ddp import local_world
    from gnnscale.utils.memlimit import Budget

    n = local_world() if sync.world > 1 else 1
    return budget if n == 1 else Budget(budget.bytes // n, f"{budget.why}, shared by {n} ranks")


def dist_summary(dist_cfg, sync: Sync) -> dict:
    return {
        "kind": str(dist_cfg.kind),
        "world_size": sync.world,
        "split": str(dist_cfg.split),
        "grad_compression": str(dist_cfg.grad_compression),
        "local_steps": int(dist_cfg.local_steps),
    }
