"""Sampled evaluation of a split: logits for every seed node, then the metric and the loss."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from gnnscale.training.metrics import compute_metric


@torch.no_grad()
def predict(model, stream, precision) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(seed ids, logits, labels) over one pass of `stream`, in the stream's order."""
    model.eval()
    ids, outs, ys = [], [], []
    for b in stream:
        with precision.autocast():
            logits = model(b.blocks, b.x)
        ids.append(b.seeds)
        outs.append(logits.float().cpu())
        ys.append(b.y.cpu())
    if not outs:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, 0), torch.empty(0, dtype=torch.int64)
    return torch.cat(ids), torch.cat(outs), torch.cat(ys)


def evaluate(
    model, stream, precision, metric: str, num_classes: int, weight: torch.Tensor | None = None
) -> dict:
    t0 = time.perf_counter()
    _, logits, y = predict(model, stream, precision)
    if len(y) == 0:
        return {metric: float("nan"), "loss": float("nan"), "time_s": 0.0}
    return {
        metric: compute_metric(metric, logits, y, num_classes),
        "loss": float(F.cross_entropy(logits, y, weight=weight)),
        "time_s": time.perf_counter() - t0,
    }
