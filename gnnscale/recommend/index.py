"""The faiss index recommend searches: which kind, its build (streamed from the mmap), its search knob,
and a streamed exact scan that approximate results are checked against."""

from __future__ import annotations

import math
import time

import faiss
import numpy as np

from gnnscale.errors import DataError

ADD_CHUNK = 1 << 16  # rows per index.add / exact-scan step: bounds the float32 copy of the embeddings


def choose_kind(index: str, num_nodes: int, exact_below: int) -> tuple[str, str]:
    """(kind, why): auto = exact search below exact_below nodes, IVF at or above."""
    if index != "auto":
        return index, f"recommend.index={index}"
    if num_nodes < exact_below:
        return "exact", f"{num_nodes:,} nodes < recommend.exact_below={exact_below:,}"
    return "ivf", f"{num_nodes:,} nodes >= recommend.exact_below={exact_below:,}"


def vectors(emb: np.ndarray, rows, metric: str) -> np.ndarray:
    """float32 rows of the embeddings (a slice or ids), L2-normalised for cosine; NaN / inf refused."""
    # a private, writable copy: a slice of the read-only mmap would be normalised in place otherwise
    x = np.require(emb[rows], dtype=np.float32, requirements=["C", "W", "O"])
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))[0]
        first = (rows.start or 0) + bad if isinstance(rows, slice) else int(np.asarray(rows)[bad])
        raise DataError(
            f"the embeddings hold NaN or inf (node {first})",
            "re-run `gnnscale infer` (a diverged model writes NaN) or pass other embeddings",
        )
    if metric == "cosine":
        faiss.normalize_L2(x)
    return x


def default_nlist(num_nodes: int) -> int:
    """4 sqrt(n) lists, at most n / 39 (faiss's k-means wants >= 39 training points per centroid)."""
    return max(1, min(int(4 * math.sqrt(num_nodes)), num_nodes // 39))


def index_bytes(kind: str, num_nodes: int, dim: int, opts) -> int:
    """What the index will hold in RAM: the float32 vectors plus IVF ids / HNSW links."""
    extra = {"exact": 0, "ivf": 4 + 8, "hnsw": 4 + 2 * int(opts.hnsw_m) * 4 + 8}[kind]
    return num_nodes * (dim * 4 + extra)


def max_norm(emb: np.ndarray) -> float:
    """The largest row norm, streamed from the mmap."""
    top = 0.0
    for lo in range(0, emb.shape[0], ADD_CHUNK):
        x = np.asarray(emb[lo : lo + ADD_CHUNK], dtype=np.float32)
        top = max(top, float(np.sqrt(np.einsum("ij,ij->i", x, x).max())))
    return top


class Index:
    """A faiss index and how queries reach it.

    For inner-product search an approximate index holds [x, sqrt(M^2 - |x|^2)] (M = the largest norm) and
    a query gets a 0 in that column: every score q.x is unchanged, but every stored row now has norm M,
    so the largest inner product is also the nearest neighbour, which IVF cells and HNSW links partition
    well; on raw vectors of unequal norms they miss most of the true top-K (why by hand: faiss has no
    built-in MIPS-to-nearest-neighbour transform).
    """

    def __init__(self, index, lift: float | None):
        self.faiss, self.lift = index, lift

    def rows(self, x: np.ndarray) -> np.ndarray:
        if self.lift is None:
            return x
        extra = np.sqrt(np.maximum(self.lift**2 - np.einsum("ij,ij->i", x, x), 0.0))
        return np.hstack([x, extra[:, None].astype(np.float32)])

    def search(self, xq: np.ndarray, kq: int) -> tuple[np.ndarray, np.ndarray]:
        if self.lift is not None:
            xq = np.hstack([xq, np.zeros((len(xq), 1), dtype=np.float32)])
        return self.faiss.search(xq, kq)


def build_index(
    kind: str, emb: np.ndarray, metric: str, opts, seed: int, progress=None
) -> tuple[Index, dict]:
    """The index over every row of emb, added a chunk at a time from the mmap."""
    n, d = emb.shape
    info: dict = {"kind": kind}
    lift = max_norm(emb) if kind != "exact" and metric == "ip" else None
    dim = d if lift is None else d + 1
    if lift is not None:
        info["mips_transform"] = f"rows lifted to norm {lift:.4g} in {dim} dims"
    if kind == "exact":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, int(opts.hnsw_m), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(opts.ef_construction)
        info.update(hnsw_m=int(opts.hnsw_m), ef_construction=int(opts.ef_construction))
    else:
        nlist = int(opts.nlist) or default_nlist(n)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = int(seed)
        train = min(n, 64 * nlist)  # faiss's k-means subsamples to 256 points per centroid anyway
        rows = np.sort(np.random.default_rng(seed).choice(n, size=train, replace=False))
        t0 = time.time()
        index.train(Index(None, lift).rows(vectors(emb, rows, metric)))
        info.update(nlist=nlist, train_points=train, train_s=round(time.time() - t0, 3))
    out = Index(index, lift)
    if progress is not None:
        progress(0, n)
    for lo in range(0, n, ADD_CHUNK):
        index.add(out.rows(vectors(emb, slice(lo, min(lo + ADD_CHUNK, n)), metric)))
        if progress is not None:
            progress(min(lo + ADD_CHUNK, n), n)
    return out, info


KNOBS = {"ivf": "nprobe", "hnsw": "ef_search"}


def set_knob(index: Index, kind: str, value: int) -> None:
    if kind == "ivf":
        index.faiss.nprobe = int(value)
    elif kind == "hnsw":
        index.faiss.hnsw.efSearch = int(value)


def knob_ladder(kind: str, index, k: int) -> list[int]:
    """The values tuning tries, cheapest first: powers of 2 up to every list (IVF) or 4096 (HNSW)."""
    if kind == "ivf":
        top, v = int(index.faiss.nlist), 1
    else:
        top, v = max(4096, k), 16
    out = []
    while v < top:
        out.append(v)
        v *= 2
    return out + [top]


def default_knob(kind: str, index, opts) -> int:
    if kind == "ivf":
        return int(opts.nprobe) or max(1, min(int(index.faiss.nlist), 16))
    return int(opts.ef_search) or 128


class ExactScan:
    """Exact top-kq over the embeddings streamed from the mmap, merged by faiss's ResultHeap (no second
    in-RAM copy of the vectors): the reference an approximate index's recall is measured against."""

    def __init__(self, emb: np.ndarray, metric: str, chunk: int = ADD_CHUNK):
        self.emb, self.metric, self.chunk = emb, metric, chunk

    def search(self, xq: np.ndarray, kq: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.emb.shape[0]
        heap = faiss.ResultHeap(len(xq), kq, keep_max=True)
        for lo in range(0, n, self.chunk):
            hi = min(lo + self.chunk, n)
            xb = vectors(self.emb, slice(lo, hi), self.metric)
            dist, ids = faiss.knn(xq, xb, min(kq, hi - lo), metric=faiss.METRIC_INNER_PRODUCT)
            heap.add_result(dist, ids + lo)
        heap.finalize()
        return heap.D, heap.I
