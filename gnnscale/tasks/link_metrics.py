"""Link-prediction metrics: ROC-AUC, MRR and Hits@K from positive scores and their negatives' scores.

Ranking (OGB's protocol, as ogbl-citation2): each positive is ranked against its own row of negative
scores; rank = 1 + (negatives above it) + half the ties, MRR = mean(1 / rank), Hits@K = share of positives
with rank <= K. NaN entries in a row are no negatives (masked: the positive's own destination and, ranked
against all nodes, the source itself and its other known edges: the filtered setting, sampling/link.py).
ROC-AUC pools every positive and every (non-NaN) negative: the probability that a random positive scores
above a random negative, ties counting half (Mann–Whitney U, as sklearn.metrics.roc_auc_score).
"""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.errors import ConfigError

HITS_K = (10, 50, 100)
LINK_METRICS = ("auc", "mrr", *(f"hits@{k}" for k in HITS_K))


def check_link_metric(metric: str) -> None:
    if metric not in LINK_METRICS:
        raise ConfigError(f"task.metric={metric!r} is not known", f"choose one of {', '.join(LINK_METRICS)}")


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC-AUC of positives vs negatives via average ranks (tie-aware)."""
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    neg = neg[~np.isnan(neg)]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    scores = np.concatenate([pos, neg])
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    # average 1-based rank of each distinct value: those below it, plus the middle of its ties
    below = np.concatenate([[0], np.cumsum(counts)[:-1]])
    avg_rank = below + (counts + 1) / 2.0
    rank_sum = avg_rank[inverse[: len(pos)]].sum()
    return float((rank_sum - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def ranks(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """1-based rank of each positive pos[i] among its negatives neg[i, :] (NaN = no negative)."""
    pos = pos.reshape(-1, 1).double()
    neg = neg.double()
    valid = ~torch.isnan(neg)
    above = ((neg > pos) & valid).sum(1).double()
    ties = ((neg == pos) & valid).sum(1).double()
    return 1.0 + above + 0.5 * ties


def ranking_scores(r: torch.Tensor) -> dict:
    """MRR and Hits@K from the positives' 1-based ranks."""
    if len(r) == 0:
        return {m: float("nan") for m in LINK_METRICS if m != "auc"}
    r = r.double()
    return {"mrr": float((1.0 / r).mean()), **{f"hits@{k}": float((r <= k).double().mean()) for k in HITS_K}}


def link_scores(pos: torch.Tensor, neg: torch.Tensor) -> dict:
    """Every link metric from positive scores [P] and negative scores [P, E] (NaN entries masked)."""
    if len(pos) == 0:
        return dict.fromkeys(LINK_METRICS, float("nan"))
    return {"auc": roc_auc(pos.numpy(), neg.numpy()), **ranking_scores(ranks(pos, neg))}
