"""Out-of-core CSC adjacency (in-edges per destination) in mmap-able .npy files.

Two streaming passes over the shards: count in-degrees into `indptr`, then scatter each shard's
(dst, src)-sorted sources into its slice of `indices`. Heap use is one shard's edge arrays.

`indptr` is int64 (edge counts outgrow int32 long before node counts do). `indices` is int32 when the
graph has fewer than 2**31 nodes and edges (half the bytes to map, cache or hold in RAM), else int64;
meta.json's `csc.index_dtype` records which, and a CSC built before that (int64, with or without the
key) is read as it is. Both limits, not the node count alone: a DGL graph over int32 indices needs an
int32 indptr too (sampling/graph.py), so past 2**31 edges int32 indices could only be used widened, a
full copy; int64 ones are used in place.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from gnnscale.errors import GraphDirError
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.meta import CSC_FILES, write_meta
from gnnscale.utils.atomic import fsync_dir, sha256_file
from gnnscale.utils.diskspace import ensure_space
from gnnscale.utils.faults import fault_point

CSC_DIR = "csc"
_READ_CHUNK = 64 << 20  # bytes per read() of a resident load: large sequential requests, no page faults


def index_dtype(num_nodes: int, num_edges: int) -> np.dtype:
    """The dtype build-csr gives `indices` (and so what a sampler holds per edge)."""
    return np.dtype(np.int32 if max(num_nodes, num_edges) < 2**31 else np.int64)


def recorded_index_dtype(meta: dict) -> np.dtype:
    """meta.json's csc.index_dtype; a CSC built before it was recorded is int64."""
    name = str((meta.get("csc") or {}).get("index_dtype", "int64"))
    if name not in ("int32", "int64"):
        raise GraphDirError(
            f"meta.json records csc.index_dtype={name!r}, not int32 or int64", "re-run `gnnscale build-csr`"
        )
    return np.dtype(name)


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
    num_edges = sum(int(s["num_edges"]) for s in shards)  # checked against each shard in pass 1
    dtype = index_dtype(n, num_edges)
    # mapped writes on a full disk are SIGBUS, not ENOSPC: refuse first (exit 2, how much is needed)
    ensure_space(graph.path, 8 * (n + 1) + dtype.itemsize * num_edges + 4096)
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
    indices = np.lib.format.open_memmap(staging / "indices.npy", mode="w+", dtype=dtype, shape=(total,))
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
        "index_dtype": dtype.name,
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
    return load_csc(graph, resident=False)


def load_csc(graph: GraphDir, resident: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, indices int32 or int64 as meta.json records), checked against meta.json.

    resident=False: read-only memory maps (pages read on first touch, one fault at a time).
    resident=True: both arrays read into anonymous memory with large sequential reads, so a sampler over
    them never faults, whatever the page cache keeps."""
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
    expected = {"indptr.npy": np.dtype(np.int64), "indices.npy": recorded_index_dtype(graph.meta)}
    indptr, indices = (_load_npy(graph, folder / f, expected[f], resident) for f in expected)
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


def npy_dtype(path: Path) -> np.dtype:
    """The dtype in a .npy file's header (nothing else is read)."""
    with open(path, "rb") as fh:
        return _npy_header(fh)[2]


def _npy_header(fh) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype), leaving fh at the first data byte."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    return np.lib.format.read_array_header_2_0(fh)


def _load_npy(graph: GraphDir, path: Path, expected: np.dtype, resident: bool) -> np.ndarray:
    """One CSC array, its dtype checked against meta.json before any of its data is read."""
    fix = f"re-run `gnnscale build-csr graph_dir={graph.path}`"
    try:
        with open(path, "rb", buffering=0) as fh:  # unbuffered: the data is read straight into the array
            shape, _, dtype = _npy_header(fh)
            if dtype != expected:
                what = "csc.index_dtype" if path.name == "indices.npy" else "an int64 indptr"
                raise GraphDirError(f"{path} holds {dtype} but meta.json records {expected} ({what})", fix)
            if not resident:
                return np.load(path, mmap_mode="r")
            out = np.empty(shape, dtype=dtype)  # 1-D: the memory order is the file's
            _read_into(fh, out)
            return out
    except (OSError, ValueError) as exc:
        raise GraphDirError(f"cannot read {path}: {str(exc).splitlines()[0]}", fix) from None


def _read_into(fh, out: np.ndarray) -> None:
    """Fill `out` from the file's current offset, _READ_CHUNK bytes per read: a few large requests the
    kernel reads ahead of, instead of a page fault per 4 KiB."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        got = fh.readinto(view[done : done + _READ_CHUNK])
        if not got:
            raise ValueError(f"the file ends after {done:,} of {len(view):,} data bytes")
        done += got
