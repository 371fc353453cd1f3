"""task=link: the train / val / test BatchStreams of edge batches (sampling/link.py) over the edge split."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from gnnscale.config import eval_batch_size as config_eval_batch_size
from gnnscale.sampling.link import (
    ClusterLinkLoader,
    KnownEdges,
    LinkEvalLoader,
    LinkLoader,
    NegativeSampler,
    WalkLinkLoader,
)
from gnnscale.sampling.two_hop import TwoHopNegatives
from gnnscale.training.batches import BatchStream, FeatureBuffers
from gnnscale.training.build import build_sweeper
from gnnscale.training.phases import resolve_phases

_VAL, _TEST = 1, 2  # seed streams of the evaluation negatives


def build_link_streams(
    cfg: DictConfig,
    data,
    device: torch.device,
    prefetch: int,
    samplers: dict,
    *,
    sync=None,
    all_train=None,
    eval_batch_size: int = 0,
) -> dict:
    """Like training.build.build_streams, for edges: "train" one stream per phase, "val" and "test" the
    held-out edges ranked against seeded negatives. Labels are not read (y stays None). The settings were
    checked up front (training/task_setup.py check_task)."""
    t, task = cfg.train, cfg.task
    split = data.edges
    eval_bs = eval_batch_size or config_eval_batch_size(t)
    buffers = FeatureBuffers(data.features.feat_dim, data.features.dtype, prefetch, device.type == "cuda")
    degree = np.diff(np.asarray(split.indptr)) if task.negative_sampler == "degree" else None
    hard = float(task.get("hard_negatives", 0.0))
    two_hop = TwoHopNegatives(split.indptr, split.indices) if hard > 0 else None
    negatives = NegativeSampler(
        str(task.negative_sampler), data.graph.num_nodes, degree, hard=hard, two_hop=two_hop
    )
    k = int(task.num_negatives)
    # Negatives are drawn from torch's RNG batch by batch, between dropout's draws: no look-ahead.
    sweeper = build_sweeper(data, lookahead=False)

    def stream(make) -> BatchStream:
        return BatchStream(
            make, data.features, None, prefetch=prefetch, device=device, buffers=buffers, sweeper=sweeper
        )

    def train_loader(sampler, batch_size: int):
        if getattr(sampler, "loader", None) is not None:  # cluster_gcn: subgraph batches
            return lambda: ClusterLinkLoader(data.g, split, sampler, k, float(task.target_fraction))
        if task.positives == "random_walk":  # unsupervised GraphSAGE
            walk = int(task.walk_length)
            return lambda: WalkLinkLoader(
                data.g, split, sampler, batch_size, negatives, k=k, walk_length=walk
            )
        return lambda: LinkLoader(data.g, split, sampler, batch_size, negatives, k=k)

    e, n = int(task.eval_negatives), data.graph.num_nodes
    all_nodes = e <= 0 or e >= n  # ranked against every node: filtered by the edges known then

    def eval_loader(pairs, code: int, known_parts: tuple[str, ...]):
        known = KnownEdges.of_split(split, known_parts) if all_nodes else None
        return lambda: LinkEvalLoader(data.g, pairs, samplers["eval"], eval_bs, e, int(cfg.seed), code, known)

    phases = resolve_phases(cfg)
    train = [
        stream(train_loader(sampler, phase.batch_size))
        for phase, sampler in zip(phases, samplers["train"], strict=True)
    ]
    return {
        "train": train,
        # val is filtered by the training and val edges; test also by the test edges (all then known)
        "val": stream(eval_loader(split.val, _VAL, ("val",))),
        "test": stream(eval_loader(split.test, _TEST, ("val", "test"))),
    }
