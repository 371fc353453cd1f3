"""One training epoch and one evaluation pass of a DistDGL trainer: DistNodeDataLoader batches, features
and labels pulled from the DistGraph, gradients all-reduced by DDP.

Every trainer takes the same number of steps (DDP waits for every rank at every step): the caller hands
each one the same number of seeds. Evaluation needs no lockstep: each trainer scores its share of the
split and the scores are combined over all of them, so every rank sees the same metric.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from gnnscale.tasks.metrics import compute_metric


def train_epoch(ddp, g, loader, optimizer, scheduler, precision, opts) -> dict:
    """opts: grad_clip, input_dropout, class_weight. Returns the epoch's loss / accuracy over all trainers."""
    ddp.train()
    params = [p for p in ddp.parameters() if p.requires_grad]
    scaler = precision.scaler
    times = {"sample_s": 0.0, "gather_s": 0.0, "compute_s": 0.0}
    loss_sum = correct = seen = steps = 0.0
    t_start = t_prev = time.perf_counter()
    for input_nodes, seeds, blocks in loader:
        t0 = time.perf_counter()
        x = g.ndata["feat"][input_nodes]
        y = g.ndata["label"][seeds]
        t1 = time.perf_counter()
        if opts["input_dropout"] > 0:
            x = F.dropout(x, opts["input_dropout"], training=True)
        with precision.autocast():
            out = ddp(blocks, x)
        loss = F.cross_entropy(out.float(), y, weight=opts["class_weight"])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # DDP all-reduces the gradients here
        if opts["grad_clip"] > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, opts["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        t2 = time.perf_counter()
        n = len(seeds)
        loss_sum += float(loss.detach()) * n
        correct += int((out.detach().argmax(1) == y).sum())
        seen += n
        steps += 1
        times["sample_s"] += t0 - t_prev
        times["gather_s"] += t1 - t0
        times["compute_s"] += t2 - t1
        t_prev = time.perf_counter()
    wall = time.perf_counter() - t_start
    totals = _sum([loss_sum, correct, seen])
    return {
        "loss": totals[0] / max(totals[2], 1),
        "train_acc": totals[1] / max(totals[2], 1),
        "steps": int(steps),
        "seeds": int(totals[2]),
        "epoch_time_s": wall,
        "seeds_per_s": totals[2] / max(wall, 1e-9),
        **times,
    }


@torch.no_grad()
def evaluate(model, g, loader, precision, metric: str, num_classes: int, class_weight=None) -> dict:
    """The metric and loss over a whole split, from every trainer's share of it."""
    model.eval()
    logits, labels = [], []
    for input_nodes, seeds, blocks in loader:
        with precision.autocast():
            out = model(blocks, g.ndata["feat"][input_nodes])
        logits.append(out.float())
        labels.append(g.ndata["label"][seeds])
    mine = (
        torch.cat(logits) if logits else torch.empty(0, num_classes),
        torch.cat(labels) if labels else torch.empty(0, dtype=torch.int64),
    )
    parts = [None] * tdist.get_world_size()
    tdist.all_gather_object(parts, mine)
    all_logits = torch.cat([p[0] for p in parts])
    all_y = torch.cat([p[1] for p in parts])
    if not len(all_y):
        return {metric: float("nan"), "loss": float("nan")}
    return {
        metric: compute_metric(metric, all_logits, all_y, num_classes),
        "loss": float(F.cross_entropy(all_logits, all_y, weight=class_weight)),
    }


def _sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t.tolist()
