"""`task=link`: link prediction — node embeddings from the GNN, a pair decoder, a loss on positive and
negative pair scores, and ranking metrics (tasks/link_metrics.py) over held-out edges.

The model is the usual GNN whose last layer outputs `model.hidden`-wide embeddings (no class head), so
`infer` writes the embeddings as for any checkpoint. decoder=dot scores a pair by the inner product of
its embeddings; decoder=mlp by a small MLP on their elementwise product (its weights ride along in the
model's state as `link_decoder.*`). loss=bce: binary cross-entropy with positives 1 and negatives 0;
loss=margin: the hinge max(0, 1 - s_pos + s_neg) for each positive and each of its negatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gnnscale.errors import ConfigError
from gnnscale.models import build_model
from gnnscale.models.checkpoint import LINK_DECODER
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.link import POSITIVES
from gnnscale.tasks.link_metrics import check_link_metric, link_scores

DECODERS = ("dot", "mlp")
LOSSES = ("bce", "margin")
_EVAL_ROWS = 256  # mlp decoder at evaluation: positives scored against all negatives this many at a time


def check_link_cfg(task_cfg) -> None:
    check_link_metric(str(task_cfg.metric))
    if int(task_cfg.num_negatives) < 1:
        raise ConfigError(
            f"task.num_negatives={task_cfg.num_negatives} must be at least 1",
            "use e.g. task.num_negatives=1 (negatives per positive edge)",
        )
    if task_cfg.decoder not in DECODERS:
        raise ConfigError(
            f"task.decoder={task_cfg.decoder!r} is not known", f"choose one of {', '.join(DECODERS)}"
        )
    if task_cfg.loss not in LOSSES:
        raise ConfigError(f"task.loss={task_cfg.loss!r} is not known", f"choose one of {', '.join(LOSSES)}")
    if task_cfg.positives not in POSITIVES:
        raise ConfigError(
            f"task.positives={task_cfg.positives!r} is not known", f"choose one of {', '.join(POSITIVES)}"
        )
    if task_cfg.in_batch_negatives and task_cfg.decoder != "dot":
        raise ConfigError(
            "task.in_batch_negatives needs task.decoder=dot",
            "set task.decoder=dot or task.in_batch_negatives=false",
        )


class PairMLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h).squeeze(-1)


class LinkPrediction:
    name = "link"

    def __init__(self, task_cfg):
        check_link_cfg(task_cfg)
        self.metric = str(task_cfg.metric)
        self.decoder_kind = str(task_cfg.decoder)
        self.loss_kind = str(task_cfg.loss)
        self.k = int(task_cfg.num_negatives)
        self.in_batch = bool(task_cfg.in_batch_negatives)
        self.decoder: PairMLP | None = None
        # decoder=dot's scale: 1 (a plain inner product). Measured on Cora: 1 / sqrt(width) with lr 0.01 let
        # the embeddings collapse (loss stuck at log 2); the plain product at lr 0.005 trains steadily.
        self.scale = 1.0

    @property
    def metric_names(self) -> tuple[str, ...]:
        return (self.metric, "loss")

    def build_model(self, model_cfg, in_dim: int):
        """The GNN with an embedding head (model.hidden wide), plus the pair decoder's weights if any."""
        model = build_model(model_cfg, in_dim, int(model_cfg.hidden))
        if self.decoder_kind == "mlp":
            self.decoder = PairMLP(int(model_cfg.hidden))
            # trained, saved and restored with the GNN (models/checkpoint.LINK_DECODER: infer leaves it out)
            model.add_module(LINK_DECODER.rstrip("."), self.decoder)
        return model

    def pair_scores(self, h: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """decoder=dot: the inner product <a, b> (what a top-K inner-product search over the embeddings ranks by);
        decoder=mlp: the MLP on a * b."""
        a, b = h[pairs[0]], h[pairs[1]]
        return self.decoder(a * b) if self.decoder is not None else (a * b).sum(-1) * self.scale

    def _scores(self, out: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        h = b.outputs(out).float()
        pos, neg = self.pair_scores(h, b.pos_pairs), self.pair_scores(h, b.neg_pairs)
        if self.in_batch and b.pos_pairs.shape[1] > 1:
            # Every source against the batch's other destinations (those equal to its own are masked).
            u, v = b.pos_pairs
            grid = h[u] @ h[v].T * self.scale
            other = v[None, :] != v[:, None]
            neg = torch.cat([neg, grid[other]])
        return pos, neg

    def loss(self, out: torch.Tensor, b: Batch) -> torch.Tensor:
        pos, neg = self._scores(out, b)
        if self.loss_kind == "margin":
            k = max(len(neg) // max(len(pos), 1), 1)
            head = pos.repeat_interleave(k)[: len(neg)]
            return F.relu(1.0 - head + neg[: len(head)]).mean()
        logits = torch.cat([pos, neg])
        target = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
        return F.binary_cross_entropy_with_logits(logits, target)

    def num_scored(self, b: Batch) -> int:
        return int(b.pos_pairs.shape[1])

    def correct(self, out: torch.Tensor, b: Batch) -> float:
        """The running train score: positives' share of pairs classified right (score > 0 vs < 0)."""
        with torch.no_grad():
            pos, neg = self._scores(out.detach(), b)
            right = (pos > 0).float().mean() + (neg < 0).float().mean()
        return float(right / 2 * len(pos))

    @torch.no_grad()
    def collect(self, out: torch.Tensor, b: Batch) -> tuple:
        """Positive scores [B] and the scores against the batch's shared negatives [B, E] (the positive's
        own destination, and for filtered ranking b.neg_known, masked as NaN), on the CPU."""
        h = out.float()
        u, v = b.pos_pairs
        pos = self.pair_scores(h, b.pos_pairs)
        hn = h[b.neg_dst]
        if self.decoder is None:
            neg = h[u] @ hn.T * self.scale
        else:
            neg = torch.cat(
                [
                    self.decoder(h[u[i : i + _EVAL_ROWS], None, :] * hn[None])
                    for i in range(0, len(u), _EVAL_ROWS)
                ]
            )
        neg = neg.masked_fill(b.neg_dst[None, :] == v[:, None], float("nan"))
        if b.neg_known is not None:  # known edges of each source: no negatives (filtered ranking)
            neg[b.neg_known[0], b.neg_known[1]] = float("nan")
        return pos.cpu(), neg.cpu()

    def score(self, collected: list[tuple]) -> dict:
        if not collected:
            return {self.metric: float("nan"), "loss": float("nan")}
        pos = torch.cat([c[0] for c in collected])
        neg = torch.cat([c[1] for c in collected])
        out = link_scores(pos, neg)
        valid = neg[~torch.isnan(neg)]
        logits = torch.cat([pos, valid])
        target = torch.cat([torch.ones_like(pos), torch.zeros_like(valid)])
        out["loss"] = float(F.binary_cross_entropy_with_logits(logits, target))
        return out
