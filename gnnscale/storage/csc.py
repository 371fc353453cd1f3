"""Out-of-core CSC adjacency (in-edges per destination) in mmap-able .npy files.

Two streaming passes over the shards: count in-degrees into `indptr`, then scatter each shard's
(dst, src)-sorted sources into its slice of `indices`. Heap use is one shard's edge arrays.
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np

from gnnscale.errors import GraphDirError
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.meta import CSC_FILES, write_meta
from gnnscale.utils.atomic import fsync_dir, sha256_file
from gnnscale.utils.diskspace import ensure_space
from gnnscale.utils.faults import fault_point

CSC_DIR = "csc"


def rows_edges(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edge positions of the given rows in CSC order, and each position's row index in `rows` (the one
    expansion of CSR/CSC rows into their edges: inference blocks, recommend's neighbour sets, known edges)."""
    starts = np.asarray(indptr[rows], dtype=np.int64)
    lens = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    total = int(lens.sum())
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), lens)
    offs = np.cumsum(lens) - lens
    pos = np.arange(total, dtype=np.int64) - offs[owner] + starts[owner]
    return pos, owner


def _check_shard_edges(i: int, src: np.ndarray, dst: np.ndarray, lo: int, hi: int, n: int) -> None:
    if len(dst) == 0:
        return
    if dst.min() < lo or dst.max() >= hi:
        raise GraphDirError(
            f"shard {i} holds an edge whose destination is outside its nodes [{lo}, {hi})",
            "re-run `gnnscale shard`",
        )
    if src.min() < 0 or src.max() >= n:
        raise GraphDirError(f"shard {i} holds an edge source outside [0, {n})", "re-run `gnnscale shard`")


def build_csc(graph: GraphDir, validate: bool = True, progress=None) -> dict:
    n, shards = graph.num_nodes, graph.meta["shards"]
    out = graph.path / CSC_DIR
    staging = graph.path / f".{CSC_DIR}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    # mapped writes on a full disk are SIGBUS, not ENOSPC: refuse first (exit 2, how much is needed)
    ensure_space(graph.path, 8 * (n + 1 + sum(int(s["num_edges"]) for s in shards)) + 4096)
    staging.mkdir()
    t0 = time.time()
    indptr = np.lib.format.open_memmap(staging / "indptr.npy", mode="w+", dtype=np.int64, shape=(n + 1,))
    indptr[0] = 0
    # Pass 1: in-degree counts; shards own contiguous destination ranges, so indptr fills in order.
    total = 0
    for i, info in enumerate(shards):
        lo, hi = info["node_start"], info["node_end"]
        dst = graph.shard(i)["dst"].numpy()
        if len(dst) != info["num_edges"]:
            raise GraphDirError(
                f"shard {i} has {len(dst)} edges, meta.json says {info['num_edges']}",
                "re-run `gnnscale shard`",
            )
        deg = np.bincount(dst - lo, minlength=hi - lo) if len(dst) else np.zeros(hi - lo, dtype=np.int64)
        if len(deg) != hi - lo:
            raise GraphDirError(
                f"shard {i} holds an edge whose destination is outside its nodes [{lo}, {hi})",
                "re-run `gnnscale shard`",
            )
        indptr[lo + 1 : hi + 1] = np.cumsum(deg) + total
        total += len(dst)
        if progress is not None:
            progress(i + 0.5, len(shards))
    indices = np.lib.format.open_memmap(staging / "indices.npy", mode="w+", dtype=np.int64, shape=(total,))
    # Pass 2: scatter sources; shards written by gnnscale are already (dst, src)-sorted.
    resorted = 0
    for i, info in enumerate(shards):
        lo, hi = info["node_start"], info["node_end"]
        part = graph.shard(i)
        src, dst = part["src"].numpy(), part["dst"].numpy()
        if validate:
            _check_shard_edges(i, src, dst, lo, hi, n)
        a, b = int(indptr[lo]), int(indptr[hi])
        if len(dst) and not _is_sorted(dst, src, lo, n):
            key = np.sort((dst - lo) * n + src)
            src = key % n
            resorted += 1
        indices[a:b] = src
        fault_point("csc.shard")
        if progress is not None:
            progress(i + 1, len(shards))
    indices.flush()
    indptr.flush()
    del indices, indptr
    for f in CSC_FILES:
        with open(staging / f, "rb+") as fh:
            os.fsync(fh.fileno())
    sums = {f: sha256_file(staging / f) for f in CSC_FILES}  # what every reader checks (storage/verify.py)
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    fsync_dir(graph.path)
    elapsed = time.time() - t0
    info = {
        "dir": CSC_DIR,
        "num_edges": int(total),
        "index_dtype": "int64",
        "sorted": True,
        "build_time_s": round(elapsed, 3),
        "shards_resorted": resorted,
        "shard_sha256": [s["sha256"] for s in shards],
        "sha256": sums,
    }
    meta = dict(graph.meta)
    meta["csc"] = info
    write_meta(graph.path, meta)
    graph.meta = meta
    return info


def _is_sorted(dst: np.ndarray, src: np.ndarray, lo: int, n: int) -> bool:
    key = (dst - lo) * n + src
    return bool(np.all(key[1:] >= key[:-1]))


def open_csc(graph: GraphDir) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) as read-only memory maps."""
    info = graph.meta.get("csc")
    folder = graph.path / CSC_DIR
    if info is None or not folder.is_dir():
        raise GraphDirError(
            f"'{graph.path}' has no CSC adjacency", f"run `gnnscale build-csr graph_dir={graph.path}` first"
        )
    if info.get("shard_sha256") != [s["sha256"] for s in graph.meta["shards"]]:
        raise GraphDirError(
            f"the CSC in '{graph.path}' was built from other shards",
            f"re-run `gnnscale build-csr graph_dir={graph.path}`",
        )
    indptr = np.load(folder / "indptr.npy", mmap_mode="r")
    indices = np.load(folder / "indices.npy", mmap_mode="r")
    if (
        len(indptr) != graph.num_nodes + 1
        or len(indices) != info["num_edges"]
        or int(indptr[-1]) != len(indices)
    ):
        raise GraphDirError(
            f"the CSC in '{graph.path}' does not match meta.json",
            f"re-run `gnnscale build-csr graph_dir={graph.path}`",
        )
    return indptr, indices
