"""Edge splits for `task=link`: graph_dir/edge_split/<name>/ (the one owner of that format).

A split holds out val / test edges and keeps the rest for training; every later stage (train, infer,
bench) reads the same files, recorded in meta.json under `edge_splits`:

  val.npy, test.npy     [2, P] int64 (src, dst): the held-out positives, one direction per edge
  csc/indptr.npy, csc/indices.npy   the message-passing CSC: the graph's CSC without val / test edges
                        (both directions of an undirected edge), so no model can see them; indices
                        int32 when the graph allows (storage/csc.py's index_dtype), as the graph's own
  train_eids.npy        [P] the training positives as edge ids of that CSC (one direction per edge)
  reverse_eids.npy      [E] each message-passing edge's reverse edge id (-1: none, directed graphs), so a
                        batch excludes both directions of its target edges from its own neighbourhoods

All mmap-able .npy, written in a staging folder renamed into place; the split is seeded (numpy's
default_rng(seed) over the graph's edges in CSC order), so the same seed and fractions give the same
split in any process. An undirected graph's edge (u, v) and (v, u) always land in the same part.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnscale.errors import ConfigError, DataError
from gnnscale.storage.csc import index_dtype, open_csc
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.meta import record_edge_split
from gnnscale.utils.atomic import atomic_path, fsync_dir

SPLIT_DIR = "edge_split"
FILES = ("val.npy", "test.npy", "train_eids.npy", "reverse_eids.npy", "csc/indptr.npy", "csc/indices.npy")


@dataclass
class EdgeSplit:
    name: str
    path: Path
    num_nodes: int
    directed: bool
    val: np.ndarray  # [2, P] (src, dst)
    test: np.ndarray
    train_eids: np.ndarray  # positives: edge ids of the message-passing CSC
    reverse_eids: np.ndarray  # [E_mp] reverse edge id, -1 = none
    indptr: np.ndarray  # the message-passing CSC
    indices: np.ndarray

    @property
    def num_train(self) -> int:
        return len(self.train_eids)

    def edge_dst(self) -> np.ndarray:
        """The destination of every message-passing edge (CSC rows expanded)."""
        return np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    for key, value in (("task.val_fraction", val_fraction), ("task.test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value} is outside [0, 1)", f"use a share of the edges, e.g. {key}=0.1")
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError(
            f"task.val_fraction + task.test_fraction = {val_fraction + test_fraction:g} leaves no training edges",
            "make them add up to less than 1, e.g. task.val_fraction=0.05 task.test_fraction=0.1",
        )


def split_name(seed: int, val_fraction: float, test_fraction: float, split_file: str | None) -> str:
    if split_file:
        digest = hashlib.sha256(Path(split_file).read_bytes()).hexdigest()[:12]
        return f"file-{digest}"
    return f"seed{int(seed)}-val{val_fraction:g}-test{test_fraction:g}"


def ensure_edge_split(
    graph: GraphDir, seed: int, val_fraction: float, test_fraction: float, split_file: str | None = None
) -> EdgeSplit:
    """The split for these settings: read when graph_dir has a current one, else made and recorded."""
    check_fractions(float(val_fraction), float(test_fraction))
    if split_file and not Path(split_file).is_file():
        raise DataError(f"task.split_file '{split_file}' does not exist", "check task.split_file=PATH")
    name = split_name(seed, float(val_fraction), float(test_fraction), split_file)
    open_csc(graph)  # GraphDirError "run build-csr first" when absent or stale
    source = graph.meta["csc"].get("sha256")
    recorded = graph.meta.get("edge_splits", {}).get(name)
    folder = graph.path / SPLIT_DIR / name
    if not (recorded and recorded.get("source_csc") == source and folder.is_dir()):
        info = _make(graph, folder, int(seed), float(val_fraction), float(test_fraction), split_file)
        info["source_csc"] = source
        graph.meta = record_edge_split(graph.path, name, info)
    return open_edge_split(graph, name)


def open_edge_split(graph: GraphDir, name: str) -> EdgeSplit:
    info = graph.meta.get("edge_splits", {}).get(name)
    folder = graph.path / SPLIT_DIR / name
    if info is None or not folder.is_dir():
        raise DataError(
            f"'{graph.path}' has no edge split '{name}'", "run `gnnscale train task=link` to make it"
        )
    arrays = {f: np.load(folder / f, mmap_mode="r") for f in FILES}
    split = EdgeSplit(
        name,
        folder,
        graph.num_nodes,
        bool(graph.meta["directed"]),
        arrays["val.npy"],
        arrays["test.npy"],
        arrays["train_eids.npy"],
        arrays["reverse_eids.npy"],
        arrays["csc/indptr.npy"],
        arrays["csc/indices.npy"],
    )
    if len(split.indptr) != graph.num_nodes + 1 or int(split.indptr[-1]) != len(split.indices):
        raise DataError(
            f"edge split '{folder}' does not match the graph", "delete that folder and train again"
        )
    if split.num_train == 0:
        raise DataError(
            f"edge split '{name}' leaves no edges for training (the graph has {graph.meta['num_edges']} edges)",
            "use a graph with edges, or smaller task.val_fraction / task.test_fraction",
        )
    return split


def _make(graph: GraphDir, folder: Path, seed, val_fraction, test_fraction, split_file) -> dict:
    indptr, indices = open_csc(graph)
    n = graph.num_nodes
    src = np.asarray(indices)  # as stored (int32 or int64): the products below are taken in int64
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    keys = dst * n + src  # ascending: build-csr sorts each destination's sources
    undirected = not bool(graph.meta["directed"])
    if undirected:
        back = np.multiply(src, n, dtype=np.int64) + dst  # each edge's reverse as a key
        rev = np.minimum(np.searchsorted(keys, back), len(keys) - 1)
        if len(keys) and not bool((keys[rev] == back).all()):
            raise DataError(
                f"'{graph.path}' says it is undirected but an edge lacks its reverse",
                "re-run `gnnscale shard` (data.make_undirected=true) and `gnnscale build-csr`",
            )
        del back
        canonical = np.flatnonzero(src <= dst)  # one direction per edge
    else:
        rev = None
        canonical = np.arange(len(keys), dtype=np.int64)
    if split_file:
        val_eids, test_eids = _from_file(split_file, keys, n)
        held = np.concatenate([val_eids, test_eids])
        if undirected:
            val_eids, test_eids = np.maximum(val_eids, rev[val_eids]), np.maximum(test_eids, rev[test_eids])
    else:
        order = np.random.default_rng(seed).permutation(len(canonical))
        n_test = int(round(test_fraction * len(canonical)))
        n_val = int(round(val_fraction * len(canonical)))
        test_eids = np.sort(canonical[order[:n_test]])
        val_eids = np.sort(canonical[order[n_test : n_test + n_val]])
        held = np.concatenate([val_eids, test_eids])
    keep = np.ones(len(keys), dtype=bool)
    keep[held] = False
    if undirected:
        keep[rev[held]] = False
    new_id = np.cumsum(keep) - 1
    train_canonical = canonical[keep[canonical]]
    if len(train_canonical) == 0:
        raise DataError(
            f"the edge split leaves no edges for training ({len(canonical)} edges, val {len(val_eids)}, "
            f"test {len(test_eids)})",
            "use a graph with edges, or smaller task.val_fraction / task.test_fraction",
        )
    mp_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst[keep], minlength=n), out=mp_indptr[1:])
    reverse = new_id[rev[keep]] if undirected else np.full(int(keep.sum()), -1, dtype=np.int64)
    mp_indices = src[keep].astype(index_dtype(n, int(keep.sum())), copy=False)
    out = {
        "val.npy": np.stack([src[val_eids].astype(np.int64), dst[val_eids]]),
        "test.npy": np.stack([src[test_eids].astype(np.int64), dst[test_eids]]),
        "train_eids.npy": new_id[train_canonical].astype(np.int64),
        "reverse_eids.npy": reverse.astype(np.int64),
        "csc/indptr.npy": mp_indptr,
        "csc/indices.npy": mp_indices,
    }
    staging = folder.parent / f".{folder.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    (staging / "csc").mkdir(parents=True)
    for f, array in out.items():
        with atomic_path(staging / f) as tmp, open(tmp, "wb") as fh:
            np.save(fh, np.ascontiguousarray(array))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    fsync_dir(folder.parent)
    return {
        "dir": f"{SPLIT_DIR}/{folder.name}",
        "seed": seed,
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "split_file": str(split_file) if split_file else None,
        "counts": {"train": len(train_canonical), "val": len(val_eids), "test": len(test_eids)},
        "message_passing_edges": int(keep.sum()),
    }


def _from_file(split_file: str, keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A user's split: an .npz with `val` and `test` (src, dst) pairs, [P, 2] or [2, P]; every pair an edge."""
    try:
        data = np.load(split_file, allow_pickle=False)
        parts = [np.asarray(data[k], dtype=np.int64) for k in ("val", "test")]
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(
            f"cannot read task.split_file '{split_file}': {exc}",
            "save it with numpy.savez(path, val=[[src, dst], ...], test=[[src, dst], ...])",
        ) from None
    eids = []
    for what, pairs in zip(("val", "test"), parts, strict=True):
        if pairs.ndim != 2 or 2 not in pairs.shape:
            raise DataError(
                f"task.split_file's {what} has shape {pairs.shape}", "store [P, 2] (src, dst) pairs"
            )
        pairs = pairs if pairs.shape[0] == 2 and pairs.shape[1] != 2 else pairs.T
        if len(pairs[0]) and (pairs.min() < 0 or pairs.max() >= n):
            raise DataError(
                f"task.split_file's {what} names a node outside [0, {n})", "use the graph's node ids"
            )
        want = pairs[1] * n + pairs[0]
        pos = np.minimum(np.searchsorted(keys, want), max(len(keys) - 1, 0))
        missing = ~(keys[pos] == want) if len(keys) else np.ones(len(want), bool)
        if missing.any():
            i = int(np.argmax(missing))
            raise DataError(
                f"task.split_file's {what} pair ({int(pairs[0][i])}, {int(pairs[1][i])}) is not an edge of the graph",
                "list only edges of the graph",
            )
        eids.append(pos.astype(np.int64))
    return eids[0], eids[1]
