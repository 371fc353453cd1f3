"""Optimizer (Adam / AdamW with weight decay) and a per-step LR schedule: linear warmup, then cosine / step / none."""

from __future__ import annotations

import math

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


def lr_factor(step: int, steps_per_epoch: int, opts) -> float:
    """LR multiplier at optimizer step `step` (0-based). Stepped per batch, so warmup is smooth."""
    warmup = int(round(float(opts.warmup_epochs) * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    total = max(1, int(opts.epochs) * steps_per_epoch - warmup)
    done = min(step - warmup, total)
    if opts.schedule == "cosine":
        lo = float(opts.min_lr_ratio)
        return lo + (1.0 - lo) * 0.5 * (1.0 + math.cos(math.pi * done / total))
    if opts.schedule == "step":
        return float(opts.step_gamma) ** (done // max(1, int(opts.step_epochs) * steps_per_epoch))
    return 1.0


def build_scheduler(optimizer, steps_per_epoch: int, opts) -> torch.optim.lr_scheduler.LambdaLR:
    if opts.schedule not in SCHEDULES:
        raise ConfigError(
            f"train.schedule={opts.schedule!r} is not known", f"choose one of {', '.join(SCHEDULES)}"
        )
    # A closure, not a callable object: LambdaLR's state_dict then holds only numbers (weights_only-safe).
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, steps_per_epoch, opts))
