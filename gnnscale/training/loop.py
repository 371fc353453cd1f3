"""One training epoch and one evaluation pass over a BatchStream; the task supplies loss and metrics.

The epoch is timed in parts (sample / gather / wait / forward / backward / step), batch by batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from gnnscale.training.cpu_math import FLUSH_EVERY, flush_subnormals
from gnnscale.training.sync import SINGLE, Sync
from gnnscale.utils.alloc import release_free_heap

TIME_SPLIT = ("sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s")


@dataclass
class BatchEnd:
    """What a batch-end hook sees: the step within the epoch, the batch's loss and size, its time split,
    and for diagnostics the seeds' labels, the input node ids and the gradient norm."""

    step: int
    loss: float
    seeds: int
    times: dict  # TIME_SPLIT -> seconds of this batch
    labels: torch.Tensor | None = None  # the scored seeds' labels (b.y), on the batch's device
    input_nodes: torch.Tensor | None = None  # global ids whose features the batch read
    grad_norm: float | None = None  # global L2 norm of the (unscaled) gradients, before clipping


def train_epoch(
    model,
    stream,
    task,
    optimizer,
    scheduler,
    precision,
    *,
    grad_clip: float = 0.0,
    input_dropout: float = 0.0,
    on_batch: Callable[[BatchEnd], None] | None = None,
    grad_norm: bool = False,
    sync: Sync = SINGLE,
) -> dict:
    """grad_norm: hand on_batch the gradient norm (free when clipping: clip_grad_norm_ returns it).
    sync: the other processes of a data-parallel run; the returned loss, accuracy and seeds are theirs
    summed, the epoch time the slowest one's."""
    model.train()
    net = sync.forward_module(model)
    num_batches = len(stream)
    params = [p for p in model.parameters() if p.requires_grad]
    scaler = precision.scaler
    t = dict.fromkeys(TIME_SPLIT, 0.0)
    loss_sum, correct, seen, steps, input_rows = 0.0, 0, 0, 0, 0
    t_start = t_prev = time.perf_counter()
    cpu_start = time.process_time()
    for b in stream:
        t0 = time.perf_counter()
        last = steps + 1 == num_batches
        # Input dropout lives here, not in the model: it is the identity at inference anyway.
        x = F.dropout(b.x, input_dropout, training=True) if input_dropout > 0 else b.x
        with sync.step(last):
            with precision.autocast():
                if b.first is None:
                    out = net(b.layers(model.num_layers), x)
                else:  # the first layer's sums, summed as the features were read (training/sum_sweep.py)
                    out = net(b.layers(model.num_layers), None, first=b.first)
            loss = task.loss(out, b)
            t1 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
        t2 = time.perf_counter()
        norm = None
        if grad_clip > 0:
            scaler.unscale_(optimizer)  # clip the true gradients, not the loss-scaled ones
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        elif grad_norm:
            norm = _grad_norm(params) / (scaler.get_scale() if scaler.is_enabled() else 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        if (steps + 1) % FLUSH_EVERY == 0:
            flush_subnormals(params, optimizer)  # training/cpu_math.py: subnormal weights slow the CPU math
        sync.after_step(last)
        t3 = time.perf_counter()
        n = task.num_scored(b)
        batch_loss = float(loss.detach())
        loss_sum += batch_loss * n
        correct += task.correct(out, b)
        seen += n
        steps += 1
        input_rows += len(b.input_nodes)
        times = {
            "sample_s": b.sample_s,
            "gather_s": b.gather_s,
            "data_wait_s": t0 - t_prev,
            "forward_s": t1 - t0,
            "backward_s": t2 - t1,
            "step_s": t3 - t2,
        }
        for k, v in times.items():
            t[k] += v
        if on_batch is not None:
            gn = float(norm) if grad_norm and norm is not None else None
            on_batch(BatchEnd(steps, batch_loss, n, times, b.y, b.input_nodes, gn))
        del b, x, out, loss  # let go before the next batch is sampled (training/batches.py, Memory)
        t_prev = time.perf_counter()
    wall = time.perf_counter() - t_start
    if sync.world > 1:
        loss_sum, correct, seen = sync.sum([loss_sum, correct, seen])
        seen = int(seen)
        wall = sync.max([wall])[0]
    return {
        "loss": loss_sum / max(seen, 1),
        "train_acc": correct / max(seen, 1),
        "steps": steps,
        "seeds": seen,
        "epoch_time_s": wall,
        # CPU seconds of every thread of the process: the work done, whatever else the machine was doing.
        "epoch_cpu_s": time.process_time() - cpu_start,
        "seeds_per_s": seen / max(wall, 1e-9),
        "input_nodes_per_batch": input_rows / max(steps, 1),  # this process's batches
        **t,
    }


@torch.no_grad()
def _grad_norm(params) -> torch.Tensor:
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


@torch.no_grad()
def evaluate(model, stream, task, precision, sync: Sync = SINGLE) -> dict:
    """The task's metrics over one pass of `stream` (a split; under data parallelism this process's
    share of it, every process's results gathered before scoring), plus the pass's time."""
    t0 = time.perf_counter()
    model.eval()
    collected = []
    release_free_heap()  # what training left free in the heap, before the evaluation batches
    for b in stream:
        with precision.autocast():
            if b.first is None:
                out = model(b.layers(model.num_layers), b.x)
            else:  # the first layer's sums, summed as the features were read (training/sum_sweep.py)
                out = model(b.layers(model.num_layers), None, first=b.first)
        collected.append(task.collect(out, b))
        del b, out  # let go before the next batch is sampled (training/batches.py, Memory)
        release_free_heap()  # utils/alloc.py: an evaluation batch's free chunks would otherwise stay in the heap
    collected = sync.gather(collected)
    scores = task.score(collected)
    return {**scores, "time_s": time.perf_counter() - t0 if collected else 0.0}
