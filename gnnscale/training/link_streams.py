"""task=link: the train / val / test BatchStreams of edge batches (sampling/link.py) over the edge split."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from gnnscale.sampling.link import (
    ClusterLinkLoader,
    LinkEvalLoader,
    LinkLoader,
    NegativeSampler,
    WalkLinkLoader,
)
from gnnscale.training.batches import BatchStream, FeatureBuffers
from gnnscale.training.phases import resolve_phases

_VAL, _TEST = 1, 2  # seed streams of the evaluation negatives


def build_link_streams(
    cfg: DictConfig, data, device: torch.device, prefetch: int, samplers: dict, *_
) -> dict:
    """Like training.build.build_streams, for edges: "train" one stream per phase, "val" and "test" the
    held-out edges ranked against seeded negatives. Labels are not read (y stays None). The settings were
    checked up front (training/task_setup.py check_task)."""
    t, task = cfg.train, cfg.task
    split = data.edges
    eval_bs = int(t.eval_batch_size) or 4 * int(t.batch_size)
    buffers = FeatureBuffers(data.features.feat_dim, data.features.dtype, prefetch, device.type == "cuda")
    degree = np.diff(np.asarray(split.indptr)) if task.negative_sampler == "degree" else None
    negatives = NegativeSampler(str(task.negative_sampler), data.graph.num_nodes, degree)
    k = int(task.num_negatives)

    def stream(make) -> BatchStream:
        return BatchStream(make, data.features, None, prefetch=prefetch, device=device, buffers=buffers)

    def train_loader(sampler, batch_size: int):
        if getattr(sampler, "loader", None) is not None:  # cluster_gcn: subgraph batches
            return lambda: ClusterLinkLoader(data.g, split, sampler, k, float(task.target_fraction))
        if task.positives == "random_walk":  # unsupervised GraphSAGE
            walk = int(task.walk_length)
            return lambda: WalkLinkLoader(data.g, split, sampler, batch_size, negatives, k, walk)
        return lambda: LinkLoader(data.g, split, sampler, batch_size, negatives, k)

    def eval_loader(pairs, code: int):
        return lambda: LinkEvalLoader(
            data.g, pairs, samplers["eval"], eval_bs, int(task.eval_negatives), int(cfg.seed), code
        )

    phases = resolve_phases(cfg)
    train = [
        stream(train_loader(sampler, phase.batch_size))
        for phase, sampler in zip(phases, samplers["train"], strict=True)
    ]
    return {
        "train": train,
        "val": stream(eval_loader(split.val, _VAL)),
        "test": stream(eval_loader(split.test, _TEST)),
    }
