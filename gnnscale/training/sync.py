"""What the trainer needs from the other training processes, as one object (the distributed seam).

`Sync` is the single-process case: no other process, nothing to exchange. Data-parallel training
(gnnscale/dist) supplies a subclass; the loop, the trainer and evaluation call these methods and never
torch.distributed themselves, so one process and many run the same code.
"""

from __future__ import annotations

import contextlib
from typing import Sequence


class Sync:
    rank = 0
    world = 1

    def forward_module(self, model):
        """The module the training forward runs through (DDP's wrapper under data parallelism)."""
        return model

    def step(self, last: bool):
        """Context around one batch's forward and backward (DDP: `no_sync` on a local step)."""
        return contextlib.nullcontext()

    def after_step(self, last: bool) -> None:
        """After the optimizer step (periodic model averaging runs here); last = the epoch's last batch."""

    def sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def max(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def gather(self, items: list) -> list:
        """Every process's items, concatenated in rank order (evaluation's per-batch results)."""
        return items

    def agree(self, make):
        """make()'s value, the same on every process (rank 0 decides)."""
        return make()

    def barrier(self) -> None: ...

    def rank_zero_first(self, make):
        """make() on rank 0, then on the others: what it caches (a partition, sampler tables) is made once
        and read by the rest."""
        if self.rank == 0:
            value = make()
            self.barrier()
            return value
        self.barrier()
        return make()

    def close(self) -> None: ...

    def epoch_stats(self) -> dict:
        """This epoch's communication for metrics.jsonl (then reset); nothing in one process."""
        return {}


SINGLE = Sync()
