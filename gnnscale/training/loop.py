"""One training epoch over a BatchStream, timed in parts: sample / gather / wait / forward / backward / step."""

from __future__ import annotations

import random
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F


def epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """A per-epoch seed: epoch k draws the same randomness whether or not the run was resumed."""
    return int(
        np.random.SeedSequence([int(seed), int(epoch), int(stream)]).generate_state(1)[0] % (2**31 - 1)
    )


def reseed(seed: int) -> None:
    import dgl

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)  # every thread of this thread's DGL OpenMP team: the ones that will sample


def train_epoch(
    model,
    stream,
    optimizer,
    scheduler,
    precision,
    grad_clip: float = 0.0,
    class_weight: torch.Tensor | None = None,
    input_dropout: float = 0.0,
    on_batch: Callable[[int, float, int], None] | None = None,
) -> dict:
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    scaler = precision.scaler
    t = {
        "sample_s": 0.0,
        "gather_s": 0.0,
        "data_wait_s": 0.0,
        "forward_s": 0.0,
        "backward_s": 0.0,
        "step_s": 0.0,
    }
    loss_sum, correct, seen, steps = 0.0, 0, 0, 0
    t_start = t_prev = time.perf_counter()
    cpu_start = time.process_time()
    for b in stream:
        t0 = time.perf_counter()
        t["data_wait_s"] += t0 - t_prev
        t["sample_s"] += b.sample_s
        t["gather_s"] += b.gather_s
        # Input dropout lives here, not in the model: it is the identity at inference anyway.
        x = F.dropout(b.x, input_dropout, training=True) if input_dropout > 0 else b.x
        with precision.autocast():
            logits = model(b.blocks, x)
        loss = F.cross_entropy(logits.float(), b.y, weight=class_weight)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        t2 = time.perf_counter()
        if grad_clip > 0:
            scaler.unscale_(optimizer)  # clip the true gradients, not the loss-scaled ones
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        t3 = time.perf_counter()
        n = len(b.y)
        batch_loss = float(loss.detach())
        loss_sum += batch_loss * n
        correct += int((logits.detach().argmax(1) == b.y).sum())
        seen += n
        steps += 1
        t["forward_s"] += t1 - t0
        t["backward_s"] += t2 - t1
        t["step_s"] += t3 - t2
        if on_batch is not None:
            on_batch(steps, batch_loss, n)
        t_prev = time.perf_counter()
    wall = time.perf_counter() - t_start
    return {
        "loss": loss_sum / max(seen, 1),
        "train_acc": correct / max(seen, 1),
        "steps": steps,
        "seeds": seen,
        "epoch_time_s": wall,
        # CPU seconds of every thread of the process: the work done, whatever else the machine was doing.
        "epoch_cpu_s": time.process_time() - cpu_start,
        "seeds_per_s": seen / max(wall, 1e-9),
        **t,
    }
