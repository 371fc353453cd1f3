"""Classification metrics on full-split predictions: acc, f1_macro, roc_auc (binary)."""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.errors import ConfigError

METRICS = ("acc", "f1_macro", "roc_auc")


def check_metric(name: str, num_classes: int | None = None) -> None:
    if name not in METRICS:
        raise ConfigError(f"train.metric={name!r} is not known", f"choose one of {', '.join(METRICS)}")
    if name == "roc_auc" and num_classes is not None and num_classes != 2:
        raise ConfigError(
            f"train.metric=roc_auc needs a binary task, this graph has {num_classes} classes",
            "use train.metric=acc or train.metric=f1_macro",
        )


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(1) == y).float().mean()) if len(y) else float("nan")


def f1_macro(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    """Mean F1 over the classes present in the labels or the predictions (sklearn's convention)."""
    if not len(y):
        return float("nan")
    pred = logits.argmax(1)
    k = num_classes
    conf = torch.bincount(y * k + pred, minlength=k * k).reshape(k, k).double()
    tp = conf.diag()
    support, predicted = conf.sum(1), conf.sum(0)
    present = (support + predicted) > 0
    f1 = 2 * tp / (support + predicted).clamp(min=1)
    return float(f1[present].mean())


def roc_auc(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Binary ROC-AUC of the positive-class score (Mann-Whitney U, ties get half credit)."""
    from scipy.stats import rankdata

    y_np = y.numpy().astype(bool)
    pos, neg = int(y_np.sum()), int((~y_np).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    score = (logits[:, 1] - logits[:, 0]).double().numpy()  # monotone in softmax p(class 1)
    ranks = rankdata(score)
    return float((ranks[y_np].sum() - pos * (pos + 1) / 2) / (pos * neg))


def compute_metric(name: str, logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    logits, y = logits.float().cpu(), y.cpu()
    if name == "acc":
        return accuracy(logits, y)
    if name == "f1_macro":
        return f1_macro(logits, y, num_classes)
    if name == "roc_auc":
        return roc_auc(logits, y)
    raise ConfigError(f"train.metric={name!r} is not known", f"choose one of {', '.join(METRICS)}")


def class_weights(train_labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Inverse frequency, normalised so a balanced split gets weight 1 for every class."""
    counts = torch.bincount(train_labels, minlength=num_classes).double()
    w = counts.sum() / (num_classes * counts.clamp(min=1))
    return torch.where(counts > 0, w, torch.zeros_like(w)).float()


def finite_or_none(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 6)
