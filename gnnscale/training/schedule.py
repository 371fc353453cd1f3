"""Optimizer (Adam / AdamW with weight decay) and a per-step LR schedule: linear warmup, then cosine / step / none."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from gnnscale.errors import ConfigError

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("none", "cosine", "step")


def build_optimizer(params, opts) -> torch.optim.Optimizer:
    if opts.optimizer == "adam":
        return torch.optim.Adam(params, lr=opts.lr, weight_decay=opts.weight_decay)
    if opts.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    raise ConfigError(
        f"train.optimizer={opts.optimizer!r} is not known", f"choose one of {', '.join(OPTIMIZERS)}"
    )


class StepClock:
    """Optimizer steps against epochs when epochs differ in steps (train.phases): where an epoch (or a
    fraction of one) ends, counted in steps, and the run's total."""

    def __init__(self, epoch_steps: Sequence[int]):
        self.epoch_steps = [int(n) for n in epoch_steps]
        self.offsets = [0]
        for n in self.epoch_steps:
            self.offsets.append(self.offsets[-1] + n)
        self.total = self.offsets[-1]
        self.uniform = len(set(self.epoch_steps)) <= 1

    def steps_at(self, epochs: float) -> int:
        """Steps taken after `epochs` epochs (fractional: part of the next epoch's steps)."""
        if self.uniform:  # the single-phase formula, unchanged
            return int(round(float(epochs) * (self.epoch_steps[0] if self.epoch_steps else 0)))
        whole = min(int(math.floor(epochs)), len(self.epoch_steps))
        frac = float(epochs) - whole
        extra = frac * self.epoch_steps[whole] if whole < len(self.epoch_steps) else 0.0
        return int(round(self.offsets[whole] + extra))


def lr_factor(step: int, clock: StepClock | int, opts) -> float:
    """LR multiplier at optimizer step `step` (0-based). Stepped per batch, so warmup is smooth.

    clock: the run's StepClock, or a steps-per-epoch count (every one of opts.epochs alike)."""
    if not isinstance(clock, StepClock):
        clock = StepClock([int(clock)] * int(opts.epochs))
    warmup = clock.steps_at(float(opts.warmup_epochs))
    if step < warmup:
        return (step + 1) / warmup
    total = max(1, clock.total - warmup)
    done = min(step - warmup, total)
    if opts.schedule == "cosine":
        lo = float(opts.min_lr_ratio)
        return lo + (1.0 - lo) * 0.5 * (1.0 + math.cos(math.pi * done / total))
    if opts.schedule == "step":
        if clock.uniform:
            return float(opts.step_gamma) ** (done // max(1, int(opts.step_epochs) * clock.epoch_steps[0]))
        # A decay every step_epochs epochs after warmup, wherever those epochs end in steps.
        k, w, every = 0, float(opts.warmup_epochs), int(opts.step_epochs)
        while step >= clock.steps_at(w + (k + 1) * every) and w + (k + 1) * every <= len(clock.epoch_steps):
            k += 1
        return float(opts.step_gamma) ** k
    return 1.0


def build_scheduler(optimizer, steps: int | Sequence[int], opts) -> torch.optim.lr_scheduler.LambdaLR:
    """steps: steps per epoch (all epochs alike), or every epoch's steps (train.phases)."""
    if opts.schedule not in SCHEDULES:
        raise ConfigError(
            f"train.schedule={opts.schedule!r} is not known", f"choose one of {', '.join(SCHEDULES)}"
        )
    clock = StepClock([int(steps)] * int(opts.epochs) if isinstance(steps, int) else steps)
    # A closure, not a callable object: LambdaLR's state_dict then holds only numbers (weights_only-safe).
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, clock, opts))
