"""Callbacks the train stage attaches: the console progress (bar and epoch lines) and a plain epoch hook."""

from __future__ import annotations

import time
from typing import Callable

from gnnscale.training.loop import BatchEnd
from gnnscale.training.trainer import Callback
from gnnscale.utils.ui import info


class ConsoleProgress(Callback):
    """A bar per epoch (loss and seeds/s as it goes), then one line per epoch."""

    def __init__(self, bar, epochs: int, metric: str):
        self.bar, self.epochs, self.metric = bar, epochs, metric
        self.task, self.seen, self.t0 = None, 0, 0.0

    def on_epoch_start(self, epoch: int, num_batches: int) -> None:
        self.task = self.bar.add_task(f"epoch {epoch}/{self.epochs}", total=num_batches, extra="")
        self.seen, self.t0 = 0, time.perf_counter()

    def on_batch_end(self, epoch: int, end: BatchEnd) -> None:
        self.seen += end.seeds
        rate = self.seen / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.update(self.task, completed=end.step, extra=f"loss {end.loss:.4f} · {rate:,.0f} seeds/s")

    def on_epoch_end(self, record: dict) -> None:
        self.bar.remove_task(self.task)
        val = record.get(f"val_{self.metric}")
        shown = f"val_{self.metric} {val:.4f}" if val is not None else ""
        star = " *" if record["best"] and f"val_{self.metric}" in record else ""
        info(
            f"epoch {record['epoch']:>3}  loss {record['loss']:.4f}  {shown}{star}  "
            f"{record['seeds_per_s']:,.0f} seeds/s  {record['epoch_time_s']:.2f}s"
        )

    def on_stop(self, reason: str) -> None:
        info(f"early stop: {reason}")


class EpochHook(Callback):
    """Calls fn(epoch) after each epoch's checkpoint is written (tests and the pipeline stop runs here)."""

    def __init__(self, fn: Callable[[int], None]):
        self.fn = fn

    def on_epoch_end(self, record: dict) -> None:
        self.fn(record["epoch"])
