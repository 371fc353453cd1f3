"""Tasks (`task=`): what a model is trained to do — its head, its loss and its metrics from a Batch.

A task has: `build_model(model_cfg, in_dim)` (the GNN with this task's head), `loss(out, batch)`,
`correct(out, batch)` and `num_scored(batch)` (the running train score), `collect(out, batch)` and
`score(collected)` (evaluation over a split), `metric` and `metric_names`. The trainer knows nothing
else about it. Node classification and link prediction (tasks/link.py); adding one: a file here and an entry in TASKS.
"""

from __future__ import annotations

from typing import Callable

import torch

from gnnscale.errors import ConfigError
from gnnscale.tasks.metrics import class_weights
from gnnscale.tasks.node import NodeClassification


def _node(train_cfg, data, device: torch.device, task_cfg=None) -> NodeClassification:
    weight = None
    if train_cfg.class_weights:
        weight = class_weights(data.labels[data.splits["train"]], data.num_classes).to(device)
    return NodeClassification(data.num_classes, str(train_cfg.metric), weight)


def _link(train_cfg, data, device: torch.device, task_cfg=None):
    from gnnscale.tasks.link import LinkPrediction
    from gnnscale.tasks.pair_features import PairStructure

    wanted = bool(task_cfg.get("pair_features", False)) or bool(task_cfg.get("heuristics", True))
    return LinkPrediction(task_cfg, PairStructure.of_split(data.edges) if wanted else None)


# name -> factory(train_cfg, TrainData, device, task_cfg) -> task
TASKS: dict[str, Callable] = {"node": _node, "link": _link}


def build_task(name: str, train_cfg, data, device: torch.device, task_cfg=None):
    if name not in TASKS:
        raise ConfigError(f"task={name!r} is not available", f"choose one of {', '.join(TASKS)}")
    return TASKS[name](train_cfg, data, device, task_cfg)


__all__ = ["TASKS", "NodeClassification", "build_task"]
