"""What the plan knows about a graph: sizes from meta.json and in-degree statistics from the CSC indptr.

Degrees are counted into a histogram of degree values (one bincount per chunk of the mmap'd indptr),
so a 5M-node graph costs one pass over 40 MB and an array as long as the largest degree; every
statistic below (mean, median, p99, Gini, the top 1 %'s edge share, what a fanout keeps) is read off
that histogram without sorting the nodes.

Skew. Importance sampling pays when a few hubs hold much of the graph's edges, so a node's uniformly
drawn neighbours miss them. A graph is called skewed when both
  p99 / median in-degree >= SKEW_P99_OVER_MEDIAN (the top 1 % of nodes have 20x the typical degree), and
  the in-degree Gini >= SKEW_GINI (the edge mass is concentrated, not just a few outliers).
Measured on gnnscale's synthetic generator (avg degree 20, `data.power_law_exponent`):
  exponent 2.5 (the default): p99/median 11.8 (20k nodes), 12.2 (200k), 13.3 (500k), 13.3 (2M);
                              Gini 0.48, 0.50, 0.51, 0.51
  exponent 2.3:               p99/median 16.8 (20k), 17.6 (200k); Gini 0.54, 0.58
  exponent 2.2:               p99/median 21.1 (20k); Gini 0.58
  exponent 2.1:               p99/median 27.3 (20k), 31.7 (200k); Gini 0.62, 0.68
  Cora 6.3 / 0.41 (even); het_tolokers 27.6 / 0.69 (skewed).
p99/median is steady across sizes for a given exponent (Gini creeps up with the number of nodes, and
the top 1 %'s edge share follows the generator's hub cap, sqrt(N)); the thresholds sit between the
default's largest reading and the heavy tails' smallest, about 1.5x from each for p99/median.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnnscale.errors import ConfigError
from gnnscale.storage.csc import index_dtype, open_csc, recorded_index_dtype
from gnnscale.storage.graph_dir import GraphDir

SKEW_P99_OVER_MEDIAN = 20.0
SKEW_GINI = 0.55
_CHUNK = 1 << 22  # indptr entries read per step (32 MB of int64)


@dataclass(frozen=True)
class DegreeStats:
    mean: float
    median: float
    p99: float
    max: int
    isolated: int  # nodes without in-edges
    gini: float  # 0 = every node has the same in-degree, 1 = one node has them all
    p99_over_median: float
    top1pct_edge_share: float  # share of all edges that point into the top 1 % of nodes by degree
    skewed: bool
    hist: dict  # log-binned: {"degree": bin lower edges (powers of 2, 0 first), "nodes": counts}
    # Nodes per in-degree value (index = degree); kept for kept_fraction, left out of as_dict.
    counts: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.zeros(1, np.int64))

    def kept_fraction(self, fanout: int) -> float:
        """The share of in-edges a layer with this fanout keeps (-1: all): sum min(d, f) / sum d."""
        degree = np.arange(len(self.counts), dtype=np.float64)
        total = float((degree * self.counts).sum())
        if fanout < 0 or total == 0:
            return 1.0
        return float((np.minimum(degree, fanout) * self.counts).sum() / total)

    def as_dict(self) -> dict:
        return {
            "mean": round(self.mean, 3),
            "median": self.median,
            "p99": self.p99,
            "max": self.max,
            "isolated": self.isolated,
            "gini": round(self.gini, 4),
            "p99_over_median": round(self.p99_over_median, 2),
            "top1pct_edge_share": round(self.top1pct_edge_share, 4),
            "skewed": self.skewed,
            "skew_rule": (
                f"skewed when p99/median in-degree >= {SKEW_P99_OVER_MEDIAN:g} and Gini >= {SKEW_GINI:g}"
            ),
            "hist": self.hist,
        }


@dataclass(frozen=True)
class GraphStats:
    name: str
    num_nodes: int
    num_edges: int
    feat_dim: int
    feat_itemsize: int
    num_classes: int
    num_train: int
    degrees: DegreeStats | None  # None for a described graph (no CSC to count)
    source: str  # "graph_dir" | "description"
    graph_dir: str | None = None
    index_itemsize: int | None = None  # bytes per CSC index (meta.json's); None: what build-csr would write

    @property
    def avg_degree(self) -> float:
        return self.num_edges / max(self.num_nodes, 1)

    @property
    def feature_bytes(self) -> int:
        return self.num_nodes * self.feat_dim * self.feat_itemsize

    @property
    def index_bytes(self) -> int:
        """Bytes per node and edge id of the sampler's graph: int32 when build-csr writes int32 indices."""
        return self.index_itemsize or index_dtype(self.num_nodes, self.num_edges).itemsize

    @property
    def csc_bytes(self) -> int:
        """indptr and indices as sampling holds them: the DGL graph over int32 indices keeps an int32 copy
        of indptr (sampling/graph.py), over int64 ones the int64 file."""
        return (self.num_nodes + 1 + self.num_edges) * self.index_bytes

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "graph_dir": self.graph_dir,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "avg_degree": round(self.avg_degree, 3),
            "feat_dim": self.feat_dim,
            "feat_itemsize": self.feat_itemsize,
            "num_classes": self.num_classes,
            "num_train": self.num_train,
            "train_fraction": round(self.num_train / max(self.num_nodes, 1), 4),
            "feature_bytes": self.feature_bytes,
            "csc_bytes": self.csc_bytes,
            "degrees": None if self.degrees is None else self.degrees.as_dict(),
        }


def degree_counts(indptr: np.ndarray) -> np.ndarray:
    """Nodes per in-degree value from a (mmap'd) CSC indptr, one chunk at a time."""
    counts = np.zeros(1, dtype=np.int64)
    n = len(indptr) - 1
    for lo in range(0, n, _CHUNK):
        deg = np.diff(np.asarray(indptr[lo : min(lo + _CHUNK, n) + 1]))
        part = np.bincount(deg)
        if len(part) > len(counts):
            part[: len(counts)] += counts
            counts = part
        else:
            counts[: len(part)] += part
    return counts


def _quantile(cum: np.ndarray, n: int, q: float) -> float:
    """The q-quantile of the degrees whose cumulative node counts per degree value are `cum`."""
    return float(np.searchsorted(cum, q * (n - 1), side="right"))


def degree_stats(counts: np.ndarray) -> DegreeStats:
    counts = np.asarray(counts, dtype=np.int64)
    degree = np.arange(len(counts), dtype=np.float64)
    n = int(counts.sum())
    mass = degree * counts
    edges = float(mass.sum())
    cum = np.cumsum(counts)
    median, p99 = _quantile(cum, n, 0.5), _quantile(cum, n, 0.99)
    # Gini of the sorted degrees x_1 <= ... <= x_n: 2 sum(i x_i) / (n sum x) - (n + 1) / n; the nodes
    # of degree value v hold the ranks a+1 .. a+c (a = nodes below v, c = their count).
    below = (cum - counts).astype(np.float64)
    rank_sum = counts * below + counts * (counts + 1) / 2.0
    gini = 2.0 * float((degree * rank_sum).sum()) / (n * edges) - (n + 1) / n if edges else 0.0
    top = _top_share(counts, degree, max(1, n // 100), edges)
    ratio = p99 / max(median, 1.0)
    return DegreeStats(
        mean=edges / max(n, 1),
        median=median,
        p99=p99,
        max=int(len(counts) - 1 if edges else 0),
        isolated=int(counts[0]),
        gini=gini,
        p99_over_median=ratio,
        top1pct_edge_share=top,
        skewed=bool(ratio >= SKEW_P99_OVER_MEDIAN and gini >= SKEW_GINI),
        hist=_log_hist(counts),
        counts=counts,
    )


def _top_share(counts: np.ndarray, degree: np.ndarray, k: int, edges: float) -> float:
    """The share of edges held by the k highest-degree nodes."""
    if edges == 0:
        return 0.0
    from_top = np.cumsum(counts[::-1])
    full = int(np.searchsorted(from_top, k))  # degree values (from the top) entirely inside the top k
    mass = float((degree[::-1][:full] * counts[::-1][:full]).sum())
    taken = int(from_top[full - 1]) if full else 0
    if full < len(counts):
        mass += (k - taken) * degree[::-1][full]
    return mass / edges


def _log_hist(counts: np.ndarray) -> dict:
    """Nodes per degree bin [0], [1], [2, 4), [4, 8), ...: the log-log degree plot's points."""
    edges = [0, 1] + [2**i for i in range(1, max(2, int(np.ceil(np.log2(max(len(counts), 2)))) + 1))]
    edges = sorted(set(edges))
    out_deg, out_nodes = [], []
    for lo, hi in zip(edges, [*edges[1:], len(counts)], strict=True):
        c = int(counts[lo:hi].sum()) if lo < len(counts) else 0
        if c:
            out_deg.append(lo)
            out_nodes.append(c)
    return {"degree": out_deg, "nodes": out_nodes, "bins": "[d, 2d): powers of 2, 0 and 1 alone"}


def graph_stats(graph_dir: str | Path) -> GraphStats:
    """Sizes from meta.json, degrees from the CSC (GraphDirError with "run build-csr first" when absent)."""
    graph = GraphDir(graph_dir)
    meta = graph.meta
    indptr, _ = open_csc(graph)
    counts = degree_counts(indptr)
    return GraphStats(
        name=str(meta.get("name", Path(graph_dir).name)),
        num_nodes=graph.num_nodes,
        num_edges=int(meta["csc"]["num_edges"]),
        feat_dim=int(meta["feat_dim"]),
        feat_itemsize=int(np.dtype(str(meta.get("feat_dtype", "float32"))).itemsize),
        num_classes=int(meta["num_classes"]),
        num_train=int(meta.get("splits", {}).get("train", 0)),
        degrees=degree_stats(counts),
        source="graph_dir",
        graph_dir=str(graph_dir),
        index_itemsize=recorded_index_dtype(meta).itemsize,
    )


def described_stats(opts) -> GraphStats:
    """A graph described by profile.num_nodes / avg_degree / feat_dim / num_classes / train_fraction
    (no files: no degree distribution, so nothing is said about skew)."""
    n = float(opts.num_nodes)
    if n < 2 or n != int(n):
        raise ConfigError(
            f"profile.num_nodes={opts.num_nodes} is not a node count",
            "give a whole number of at least 2, e.g. profile.num_nodes=1e9",
        )
    if float(opts.avg_degree) <= 0:
        raise ConfigError(
            f"profile.avg_degree={opts.avg_degree} must be positive for a described graph",
            "give the average in-degree, e.g. profile.avg_degree=50",
        )
    if int(opts.feat_dim) < 1 or int(opts.num_classes) < 2:
        raise ConfigError(
            f"profile.feat_dim={opts.feat_dim} / profile.num_classes={opts.num_classes} are not usable",
            "use profile.feat_dim >= 1 and profile.num_classes >= 2",
        )
    if not 0.0 < float(opts.train_fraction) <= 1.0:
        raise ConfigError(f"profile.train_fraction={opts.train_fraction} must be in (0, 1]", "use e.g. 0.6")
    n = int(n)
    return GraphStats(
        name="described",
        num_nodes=n,
        num_edges=int(round(n * float(opts.avg_degree))),
        feat_dim=int(opts.feat_dim),
        feat_itemsize=4,
        num_classes=int(opts.num_classes),
        num_train=int(round(n * float(opts.train_fraction))),
        degrees=None,
        source="description",
    )
