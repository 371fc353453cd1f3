"""The training data path: mmap'd CSC structure, FeatureStore features, labels and splits from the shards."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnnscale.errors import DataError
from gnnscale.sampling.graph import csc_to_dgl, to_dgl_graph
from gnnscale.storage.csc import load_csc, open_csc
from gnnscale.storage.edge_split import ensure_edge_split
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.verify import verify_graph_dir
from gnnscale.utils.mmap_advice import advise_tensor
from gnnscale.utils.ui import info

FEATURE_CACHES = ("auto", "memory", "mmap", "read")
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
    feature_cache: str  # memory | mmap | read: what `auto` decided
    edges: object = None  # task=link: the storage.edge_split.EdgeSplit (g is then its message-passing graph)
    reader: object = None  # feature_cache=read: the storage.feature_reader.FeatureReader
    # feature_cache=read: (rows the batches in flight may hold, the most batches in flight, rows more the
    # oldest batch may take)
    stage: tuple = (0, 0, 0)
    sums_bytes: int = 0  # feature_cache=read, first-layer sums: what their cohorts may hold (the plan's)

    @property
    def name(self) -> str:
        return str(self.graph.meta["name"])

    def hold_features_in_memory(self) -> None:
        features = self.features.reopened(in_memory=True)
        if not features.all_finite():
            raise DataError(
                f"features in '{self.graph.path}' hold NaN or inf",
                "clean the source features and re-run `gnnscale shard`",
            )
        self.features, self.feature_cache = features, "memory"

    def hold_structure_in_memory(self) -> None:
        """The CSC read into RAM with large sequential reads: the sampler then never faults. (A link run's
        message-passing graph is its edge split's, left as it is.)"""
        if self.edges is None:
            indptr, indices = load_csc(self.graph, resident=True)
            self.g = csc_to_dgl(indptr, indices, self.graph.num_nodes)

    def read_features_ahead(self, plan) -> None:
        """Features read from the shards by a sweep ahead of the model (training/sweep.py), or where the
        plan (training/memory_plan.MemoryPlan) has sums_bytes by passes adding the batches' first-layer sums
        (training/sum_sweep.py), not page-faulted."""
        from gnnscale.storage.feature_reader import FeatureReader

        self.reader = FeatureReader(self.graph)
        self.stage = (int(plan.sweep_cap), int(plan.stage_batches), int(plan.stage_reserve))
        self.sums_bytes = int(plan.sums_bytes)
        self.feature_cache = "read"

    def read_at_random(self) -> None:
        """The memory-mapped CSC and features will not all stay in the page cache: no read-around on
        their page faults, each reads its own page (utils/mmap_advice.py)."""
        for t in self.g.adj_tensors("csc")[:2]:  # the graph's own tensors: DGL keeps the mapping
            advise_tensor(t, "random")
        if not self.features.in_memory:
            self.features.advise("random")

    def cache_hot_features(self, rows: int) -> int:
        """Hold the `rows` highest in-degree nodes' features in RAM (memory-mapped features only)."""
        indptr, _ = open_csc(self.graph)
        return self.features.cache_hottest(rows, indptr)

    @property
    def csc_bytes(self) -> int:
        """The sampler's structure as its DGL graph holds it, at the real itemsizes: int32 indices and an
        int32 copy of indptr when build-csr wrote int32, int64 for a CSC built before (a link run: its
        edge split's message-passing CSC)."""
        indptr, indices, _ = self.g.adj_tensors("csc")
        return int(indptr.nbytes + indices.nbytes)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "num_nodes": self.graph.num_nodes,
            "feat_dim": self.features.stored_dim,
            **({"degree_feature": True} if self.features.degree_indptr is not None else {}),
            "num_classes": self.num_classes,
            "graph_dir": str(self.graph.path),
        }


def load_train_data(
    graph_dir: str, feature_cache: str = "mmap", verify: str = "stamp", degree_feature: bool = False
) -> TrainData:
    """Structure, labels and splits; features memory-mapped, or in RAM for feature_cache=memory
    (`auto` is decided later, from the memory plan: TrainData.hold_features_in_memory). First the files
    are checked against meta.json (verify=stamp|full|off, storage/verify.py): a changed one is exit 2.
    degree_feature: each feature row ends in log1p(in-degree) (model.degree_feature)."""
    graph = GraphDir(graph_dir)
    verify_graph_dir(graph.path, verify, meta=graph.meta)
    g = to_dgl_graph(graph)  # raises GraphDirError with "run build-csr first" when csc/ is absent
    num_classes = int(graph.meta["num_classes"])
    indptr = g.adj_tensors("csc")[0].numpy() if degree_feature else None
    features = FeatureStore(graph, in_memory=False, degree_indptr=indptr)
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
    data = TrainData(graph, g, features, labels, splits, num_classes, features.feat_dim, "mmap")
    if feature_cache == "memory":
        data.hold_features_in_memory()
    return data


def load_link_data(
    graph_dir: str, task_cfg, seed: int, emb_dim: int, verify: str = "stamp", degree_feature: bool = False
) -> TrainData:
    """task=link: the edge split (made on first use), the message-passing graph without its val / test
    edges, features; labels are not needed. num_classes is the embedding width (the model's output).
    The degree column (degree_feature) counts message-passing edges only: a val / test edge adds nothing."""
    graph = GraphDir(graph_dir)
    verify_graph_dir(graph.path, verify, meta=graph.meta)
    split = ensure_edge_split(
        graph, seed, float(task_cfg.val_fraction), float(task_cfg.test_fraction), task_cfg.split_file
    )
    info(
        f"edge split '{split.name}': {split.num_train:,} train / {split.val.shape[1]:,} val / "
        f"{split.test.shape[1]:,} test edges (val / test left out of message passing)"
    )
    g = csc_to_dgl(split.indptr, split.indices, graph.num_nodes)
    n = graph.num_nodes
    labels = torch.full((n,), -1, dtype=torch.int64)
    nodes = torch.arange(n)
    # The memory plan probes node batches; a link batch's nodes are drawn from all of them.
    splits = {"train": nodes, "val": nodes[:0], "test": nodes[:0]}
    features = FeatureStore(graph, in_memory=False, degree_indptr=split.indptr if degree_feature else None)
    return TrainData(graph, g, features, labels, splits, int(emb_dim), features.feat_dim, "mmap", split)
