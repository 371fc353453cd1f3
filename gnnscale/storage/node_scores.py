"""graph_dir artifacts the biased samplers read beside the CSC: node scores and per-edge weights.

- `scores/pagerank-<damping>-<iters>.npy`: float64 [N], PageRank over the graph's edges (src -> dst, the
  direction messages flow), computed once by `cached_pagerank` and reused by every later run. A graph_dir
  is rewritten whole by `gnnscale shard`, and build-csr over the same shards yields the same CSC, so a
  cached vector never goes stale.
- `csc/edata_<key>.npy`: float [E], one non-negative weight per CSC edge, aligned with csc/indices.npy
  (edge e is indices[e] -> its CSC row). gnnscale's own sources carry no per-edge data (the shards hold
  src / dst only, and weight columns of edge lists and npz matrices are dropped), so this file is the
  user's to provide (`write_edge_data`); `gnnscale build-csr` replaces csc/ and so removes it.

Numpy and scipy only (no DGL): storage stays free of the sampling library.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gnnscale.errors import GraphDirError
from gnnscale.storage.csc import CSC_DIR, open_csc
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.utils.atomic import atomic_path

SCORES_DIR = "scores"
CHUNK_EDGES = 1 << 22  # edges per step of a pass over the CSC (bounds the heap on big graphs)
EDGE_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def in_degree(indptr: np.ndarray) -> np.ndarray:
    """In-degree of every node, from the CSC row pointers."""
    return np.diff(np.asarray(indptr)).astype(np.int64)


def _row_chunks(indptr: np.ndarray, chunk_edges: int) -> list[tuple[int, int]]:
    """Node ranges [lo, hi) of about chunk_edges in-edges each (a node with more stays whole)."""
    n, e = len(indptr) - 1, int(indptr[-1])
    cuts = np.searchsorted(indptr, np.arange(chunk_edges, e, chunk_edges), side="right") - 1
    bounds = np.unique(np.concatenate([[0], cuts, [n]]))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def pagerank(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_nodes: int,
    damping: float = 0.85,
    iters: int = 50,
    chunk_edges: int = CHUNK_EDGES,
) -> np.ndarray:
    """PageRank of every node by `iters` power iterations over the CSC (mmap'd arrays welcome).

    x <- d * (A D^-1 x + (sum of x over dangling nodes) / N) + (1 - d) / N, from x = 1/N, where A[v, u] = 1
    for each edge u -> v (CSC row v lists its sources u) and D holds out-degrees; a dangling node (no
    out-edges) spreads its score over every node. The result sums to 1. The CSC is read a chunk of
    destination rows at a time, so the heap holds O(N) vectors plus one chunk of edges.
    """
    import scipy.sparse as sp

    n = int(num_nodes)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    e = int(indptr[-1])
    out_deg = np.zeros(n, dtype=np.int64)
    for a in range(0, e, chunk_edges):
        out_deg += np.bincount(indices[a : a + chunk_edges], minlength=n)
    dangling = out_deg == 0
    inv_out = np.zeros(n, dtype=np.float64)
    np.divide(1.0, out_deg, out=inv_out, where=~dangling)
    chunks = _row_chunks(indptr, chunk_edges)

    def rows(lo: int, hi: int):
        a, b = int(indptr[lo]), int(indptr[hi])
        ip = np.asarray(indptr[lo : hi + 1], dtype=np.int64) - a
        return sp.csr_matrix((np.ones(b - a), np.asarray(indices[a:b]), ip), shape=(hi - lo, n))

    held = [rows(lo, hi) for lo, hi in chunks] if len(chunks) == 1 else None  # small graphs: build once
    x = np.full(n, 1.0 / n)
    y = np.empty(n)
    for _ in range(int(iters)):
        w = x * inv_out
        for k, (lo, hi) in enumerate(chunks):
            y[lo:hi] = (held[k] if held is not None else rows(lo, hi)) @ w
        y *= damping
        y += damping * float(x[dangling].sum()) / n + (1.0 - damping) / n
        x, y = y, x
    return x


def pagerank_file(graph_path: str | Path, damping: float, iters: int) -> Path:
    return Path(graph_path) / SCORES_DIR / f"pagerank-{float(damping):g}-{int(iters)}.npy"


def _read_scores(path: Path, n: int) -> np.ndarray | None:
    """The cached vector, or None when it is absent or unusable (it is then computed again)."""
    if not path.is_file():
        return None
    try:
        x = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if x.shape != (n,) or x.dtype != np.float64 or not np.isfinite(x).all():
        return None
    return np.asarray(x)


def write_scores(path: Path, scores: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(scores, dtype=np.float64))


def cached_pagerank(
    graph: GraphDir, damping: float, iters: int, fallback_dir: str | Path | None = None
) -> tuple[np.ndarray, Path | None]:
    """(PageRank vector, its file): read from graph_dir/scores/ (or fallback_dir) when cached there, else
    computed and written to graph_dir/scores/; a graph_dir we may not write to caches it in fallback_dir.
    The file is None when neither could be written (the vector is still returned)."""
    n = graph.num_nodes
    places = [pagerank_file(graph.path, damping, iters)]
    if fallback_dir is not None:
        places.append(Path(fallback_dir) / places[0].name)
    for path in places:
        x = _read_scores(path, n)
        if x is not None:
            return x, path
    indptr, indices = open_csc(graph)
    x = pagerank(indptr, indices, n, damping, iters)
    for path in places:
        try:
            write_scores(path, x)
            return x, path
        except OSError:
            continue
    return x, None


# ---------------------------------------------------------------- per-edge weights
def edge_data_file(graph_path: str | Path, key: str) -> Path:
    return Path(graph_path) / CSC_DIR / f"edata_{key}.npy"


def write_edge_data(graph: GraphDir, key: str, values: np.ndarray) -> Path:
    """Save one weight per CSC edge (aligned with csc/indices.npy) as csc/edata_<key>.npy, atomically."""
    path = edge_data_file(graph.path, key)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(values))
    return path


def open_edge_data(graph: GraphDir, key: str) -> np.ndarray:
    """csc/edata_<key>.npy as a read-only memory map, checked: 1-D, one float per CSC edge, finite, >= 0.
    GraphDirError with the file to provide when it is absent or unusable."""
    _, indices = open_csc(graph)
    e = len(indices)
    path = edge_data_file(graph.path, key)
    provide = (
        f"save {e} non-negative floats, one per CSC edge in csc/indices.npy order, to {path} "
        "(gnnscale.storage.node_scores.write_edge_data)"
    )
    if not path.is_file():
        raise GraphDirError(f"'{graph.path}' has no edge weights {key!r} ({path} is absent)", provide)
    try:
        w = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise GraphDirError(f"cannot read {path}: {str(exc).splitlines()[0]}", provide) from None
    if w.ndim != 1 or len(w) != e:
        raise GraphDirError(f"{path} has shape {tuple(w.shape)}, the CSC has {e} edges", provide)
    if w.dtype not in (np.float32, np.float64):
        raise GraphDirError(f"{path} holds {w.dtype}, not float32 or float64", provide)
    for a in range(0, e, CHUNK_EDGES):
        part = w[a : a + CHUNK_EDGES]
        if not np.isfinite(part).all() or bool((part < 0).any()):
            raise GraphDirError(f"{path} holds a negative or non-finite weight", provide)
    return w
