"""`task=node`: node classification — cross-entropy on the seeds' labels, acc / f1_macro / roc_auc."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gnnscale.models import build_model
from gnnscale.sampling.batch import Batch
from gnnscale.tasks.metrics import check_metric, compute_metric


class NodeClassification:
    name = "node"

    def __init__(self, num_classes: int, metric: str = "acc", class_weight: torch.Tensor | None = None):
        check_metric(metric, num_classes)
        self.num_classes = int(num_classes)
        self.metric = metric
        self.class_weight = class_weight

    @property
    def metric_names(self) -> tuple[str, ...]:
        return (self.metric, "loss")

    def build_model(self, model_cfg, in_dim: int):
        """The GNN with its head: the last layer maps to one logit per class."""
        return build_model(model_cfg, in_dim, self.num_classes)

    def loss(self, out: torch.Tensor, b: Batch) -> torch.Tensor:
        logits = b.outputs(out).float()
        if b.loss_weight is None:
            return F.cross_entropy(logits, b.y, weight=self.class_weight)
        per_node = F.cross_entropy(logits, b.y, weight=self.class_weight, reduction="none")
        return (per_node * b.loss_weight).sum() / max(len(b.y), 1)

    def num_scored(self, b: Batch) -> int:
        return len(b.seeds)

    def correct(self, out: torch.Tensor, b: Batch) -> int:
        """Seeds predicted right: the running train accuracy of an epoch."""
        return int((b.outputs(out).detach().argmax(1) == b.y).sum())

    def collect(self, out: torch.Tensor, b: Batch) -> tuple:
        """What evaluation keeps of one batch (on the CPU): ids, logits and labels of its seeds."""
        return b.seeds, b.outputs(out).float().cpu(), b.y.cpu()

    def score(self, collected: list[tuple]) -> dict:
        """The metric and the loss over a whole split, from every batch's collect()."""
        if not collected:
            return {self.metric: float("nan"), "loss": float("nan")}
        logits = torch.cat([c[1] for c in collected])
        y = torch.cat([c[2] for c in collected])
        weight = self.class_weight.cpu() if self.class_weight is not None else None
        return {
            self.metric: compute_metric(self.metric, logits, y, self.num_classes),
            "loss": float(F.cross_entropy(logits, y, weight=weight)),
        }
