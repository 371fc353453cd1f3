"""Built-in synthetic graph: a degree-corrected stochastic block model whose blocks are the classes.

Degrees follow a Pareto propensity (power law), an edge stays inside its class with probability
`homophily`, and features are a faint class mean plus Gaussian noise — so a features-only model
does poorly and neighbourhood aggregation does well. Generated chunk by chunk from `(seed, chunk)`
so a 10M-node graph never sits whole in memory (per-node state is a few int/float arrays).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from gnnscale.datasets.base import NodeBlock, Source
from gnnscale.errors import DataError

_NODE_STREAM, _EDGE_STREAM, _MEAN_STREAM, _LABEL_STREAM, _DEGREE_STREAM = 1, 2, 3, 4, 5


class SyntheticSource(Source):
    def __init__(self, cfg):
        self.cfg = cfg
        self.name = cfg.name
        self.num_nodes = int(cfg.num_nodes)
        self.feat_dim = int(cfg.feat_dim)
        self.labelled = bool(cfg.get("labels", True))  # data.labels=false: an unlabelled graph (task=link)
        self.communities = int(cfg.num_classes)  # the label classes: generated whether stored or not
        self.num_classes = self.communities if self.labelled else 0
        if self.num_nodes < 2 or self.communities < 2 or self.feat_dim < 1:
            raise DataError(
                "synthetic graph needs num_nodes >= 2, num_classes >= 2, feat_dim >= 1",
                "fix data.num_nodes / num_classes / feat_dim",
            )
        if not 0.0 <= cfg.homophily <= 1.0:
            raise DataError(
                f"data.homophily={cfg.homophily} must be in [0, 1]", "use e.g. data.homophily=0.75"
            )
        if cfg.avg_degree <= 0:
            raise DataError(
                f"data.avg_degree={cfg.avg_degree} must be positive", "use e.g. data.avg_degree=20"
            )
        if cfg.power_law_exponent <= 2.0:
            raise DataError("data.power_law_exponent must be > 2 (finite mean degree)", "use e.g. 2.5")
        self.seed = int(cfg.seed)
        self.chunk_edges = int(cfg.chunk_edges)
        self._labels = (
            self._rng(_LABEL_STREAM).integers(0, self.communities, size=self.num_nodes).astype(np.int32)
        )

    def _rng(self, stream: int, index: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, stream, index])

    def labels_of(self, lo: int, hi: int) -> np.ndarray:
        return self._labels[lo:hi].astype(np.int64)

    def node_blocks(self, block_rows: int = 65536) -> Iterator[NodeBlock]:
        means = self._rng(_MEAN_STREAM).standard_normal((self.communities, self.feat_dim)).astype(np.float32)
        for b, lo in enumerate(range(0, self.num_nodes, block_rows)):
            hi = min(lo + block_rows, self.num_nodes)
            label = self.labels_of(lo, hi)
            stored = label if self.labelled else np.full(hi - lo, -1, dtype=np.int64)
            noise = self._rng(_NODE_STREAM, b).standard_normal((hi - lo, self.feat_dim), dtype=np.float32)
            yield NodeBlock(lo, noise + np.float32(self.cfg.feature_signal) * means[label], stored, None)

    def _propensity(self) -> np.ndarray:
        u = self._rng(_DEGREE_STREAM).random(self.num_nodes)
        theta = (1.0 - u) ** (-1.0 / (self.cfg.power_law_exponent - 1.0))
        # Cap hubs at sqrt(N) times the minimum so duplicate edges stay rare on small graphs.
        return np.minimum(theta, max(10.0, np.sqrt(self.num_nodes)))

    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        theta = self._propensity()
        order = np.argsort(self._labels, kind="stable")
        cum = np.cumsum(theta[order])
        del theta
        bounds = np.searchsorted(self._labels[order], np.arange(self.communities + 1))
        class_lo = np.concatenate([[0.0], cum])[bounds[:-1]]
        class_mass = cum[bounds[1:] - 1] - class_lo
        total = cum[-1]
        # Each generated pair is stored in both directions (make_undirected), hence the halving.
        num_pairs = int(round(self.num_nodes * self.cfg.avg_degree / 2))
        for k, lo in enumerate(range(0, num_pairs, self.chunk_edges)):
            m = min(self.chunk_edges, num_pairs - lo)
            rng = self._rng(_EDGE_STREAM, k)
            src = order[
                np.minimum(np.searchsorted(cum, rng.random(m) * total, side="right"), self.num_nodes - 1)
            ]
            same = rng.random(m) < self.cfg.homophily
            c = self._labels[src].astype(np.int64)
            target = np.where(same, class_lo[c] + rng.random(m) * class_mass[c], rng.random(m) * total)
            dst = order[np.minimum(np.searchsorted(cum, target, side="right"), self.num_nodes - 1)]
            yield src.astype(np.int64), dst.astype(np.int64)

    def describe(self) -> dict:
        keys = (
            "num_nodes",
            "avg_degree",
            "feat_dim",
            "num_classes",
            "homophily",
            "power_law_exponent",
            "feature_signal",
            "seed",
        )
        return {k: (float(self.cfg[k]) if isinstance(self.cfg[k], float) else self.cfg[k]) for k in keys}
