"""The training data path: mmap'd CSC structure, FeatureStore features, labels and splits from the shards."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.sampling.graph import to_dgl_graph
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.utils.ui import info

FEATURE_CACHES = ("auto", "memory", "mmap")
SPLITS = ("train", "val", "test")


@dataclass
class TrainData:
    graph: GraphDir
    g: object  # DGLGraph over the mmap'd CSC (zero-copy)
    features: FeatureStore
    labels: torch.Tensor  # [N] int64, -1 = unlabelled
    splits: dict  # split -> labelled node ids (int64)
    num_classes: int
    feat_dim: int
    feature_cache: str  # memory | mmap: what `auto` decided

    @property
    def name(self) -> str:
        return str(self.graph.meta["name"])

    def describe(self) -> dict:
        return {
            "name": self.name,
            "num_nodes": self.graph.num_nodes,
            "feat_dim": self.feat_dim,
            "num_classes": self.num_classes,
            "graph_dir": str(self.graph.path),
        }


def decide_feature_cache(mode: str, nbytes: int, budget_mb: float) -> str:
    """`auto` holds the feature matrix in RAM when it fits the budget; else rows come from the mmap'd shards."""
    if mode not in FEATURE_CACHES:
        raise ConfigError(
            f"train.feature_cache={mode!r} is not known", f"choose one of {', '.join(FEATURE_CACHES)}"
        )
    if mode != "auto":
        return mode
    return "memory" if nbytes <= budget_mb * 2**20 else "mmap"


def load_train_data(graph_dir: str, feature_cache: str = "auto", budget_mb: float = 2048.0) -> TrainData:
    graph = GraphDir(graph_dir)
    g = to_dgl_graph(graph)  # raises GraphDirError with "run build-csr first" when csc/ is absent
    num_classes = int(graph.meta["num_classes"])
    feat_dim = int(graph.meta["feat_dim"])
    probe = FeatureStore(graph, in_memory=False)
    mode = decide_feature_cache(feature_cache, probe.nbytes, budget_mb)
    features = FeatureStore(graph, in_memory=True) if mode == "memory" else probe
    if mode == "memory" and features._full is not None and not bool(torch.isfinite(features._full).all()):
        raise DataError(
            f"features in '{graph_dir}' hold NaN or inf",
            "clean the source features and re-run `gnnscale shard`",
        )
    labels = graph.labels().to(torch.int64)
    splits, unlabelled = {}, {}
    for split in SPLITS:
        ids = graph.split_ids(split)
        y = labels[ids]
        if len(y) and (int(y.max()) >= num_classes):
            raise DataError(
                f"{split} labels reach {int(y.max())} but meta.json says {num_classes} classes",
                "re-run `gnnscale shard`",
            )
        splits[split] = ids[y >= 0]  # unlabelled nodes in a split are not scored
        if len(splits[split]) < len(ids):
            unlabelled[split] = len(ids) - len(splits[split])
    if unlabelled:
        info(
            "unlabelled nodes left out of the splits (label -1, not trained on or scored): "
            + ", ".join(f"{split} {k:,}" for split, k in unlabelled.items())
        )
    if len(splits["train"]) == 0:
        raise DataError(
            f"'{graph_dir}' has no labelled training nodes",
            "shard it with a split (data.split_fractions or the source's split)",
        )
    return TrainData(graph, g, features, labels, splits, num_classes, feat_dim, mode)
