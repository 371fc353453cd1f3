"""Streaming shard writer: node blocks in order and edges in any order in, DESIGN §4 shards out.

Sources never hold the whole graph: node rows go straight into memory-mapped staging arrays and
edges are bucketed by destination shard into spill files, so peak heap is one chunk plus one shard.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import DataError, GraphDirError
from gnnscale.storage.meta import FORMAT_VERSION, META_FILE, shard_file_name, write_meta
from gnnscale.storage.node_order import (
    NEW_TO_OLD,
    OLD_TO_NEW,
    ORDER_DIR,
    check_method,
    check_permutation,
    degree_order,
    inverse,
    rcm_order,
)
from gnnscale.utils.atomic import atomic_path, fsync_dir, sha256_file
from gnnscale.utils.diskspace import ensure_space

SPLIT_NONE, SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST = -1, 0, 1, 2


@dataclass
class EdgePolicy:
    make_undirected: bool = True
    self_loops: str = "remove"  # keep | remove | add
    duplicate_edges: str = "remove"  # keep | remove

    def __post_init__(self) -> None:
        if self.self_loops not in ("keep", "remove", "add"):
            raise DataError(f"data.self_loops={self.self_loops!r} is not valid", "use keep, remove or add")
        if self.duplicate_edges not in ("keep", "remove"):
            raise DataError(
                f"data.duplicate_edges={self.duplicate_edges!r} is not valid", "use keep or remove"
            )


def staging_dir_for(graph_dir: Path) -> Path:
    return graph_dir.parent / f".{graph_dir.name}.partial"


def hash_uniform(ids: np.ndarray, seed: int) -> np.ndarray:
    """A deterministic uniform [0, 1) per node id (splitmix64), so a random split can be streamed."""
    x = ids.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % (1 << 64))
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def random_split(ids: np.ndarray, labelled: np.ndarray, fractions, seed: int) -> np.ndarray:
    fractions = list(fractions)
    if len(fractions) != 3 or min(fractions) < 0 or sum(fractions) > 1.0 + 1e-9:
        raise DataError(
            f"data.split_fractions={fractions} is not valid",
            "give three non-negative fractions summing to at most 1",
        )
    u = hash_uniform(ids, seed)
    split = np.full(len(ids), SPLIT_NONE, dtype=np.int8)
    a, b, c = np.cumsum(fractions)
    split[u < a] = SPLIT_TRAIN
    split[(u >= a) & (u < b)] = SPLIT_VAL
    split[(u >= b) & (u < c)] = SPLIT_TEST
    split[~labelled] = SPLIT_NONE
    return split


class ShardWriter:
    """Write a graph_dir atomically: everything goes to a staging folder renamed into place at the end."""

    def __init__(
        self,
        graph_dir: str | Path,
        *,
        name: str,
        num_nodes: int,
        feat_dim: int,
        num_classes: int | None,
        nodes_per_shard: int,
        policy: EdgePolicy,
        feat_dtype: str = "float32",
        overwrite: bool = False,
        reorder: str = "none",
    ):
        self.graph_dir = Path(graph_dir)
        self.reorder = check_method(reorder)
        self._new_to_old: np.ndarray | None = None  # set by _relabel: row i of graph_dir = source node [i]
        self._kept_order: tuple[Path, dict] | None = None  # keep_node_order: (graph_dir, its record)
        if num_nodes <= 0:
            raise DataError(f"the graph has {num_nodes} nodes", "check the input files")
        if nodes_per_shard <= 0:
            raise DataError(
                f"shard.nodes_per_shard={nodes_per_shard} must be positive",
                "set shard.nodes_per_shard=100000",
            )
        if self.graph_dir.exists():
            if not overwrite:
                raise GraphDirError(
                    f"graph_dir '{self.graph_dir}' already exists",
                    "pass overwrite=true to replace it or choose another graph_dir=",
                )
            if not self.graph_dir.is_dir() or (
                any(self.graph_dir.iterdir()) and not (self.graph_dir / META_FILE).exists()
            ):
                # overwrite=true replaces a graph_dir, never an unrelated folder that happens to be named
                raise GraphDirError(
                    f"'{self.graph_dir}' exists and is not a graph_dir",
                    "choose another graph_dir= (overwrite only replaces graph_dirs)",
                )
        self.name, self.num_nodes, self.feat_dim = name, int(num_nodes), int(feat_dim)
        self.num_classes = num_classes
        self.nodes_per_shard = int(nodes_per_shard)
        self.policy = policy
        self.feat_dtype = feat_dtype
        self.num_shards = (self.num_nodes + self.nodes_per_shard - 1) // self.nodes_per_shard
        self.staging = staging_dir_for(self.graph_dir)
        if self.staging.exists():
            shutil.rmtree(self.staging)  # leftovers of an interrupted run are never reused
        # the node rows are staged in mapped arrays (a full disk would be SIGBUS) and then written again as
        # shards: refuse up front when the disk cannot hold both (exit 2 with about how much is needed)
        ensure_space(
            self.graph_dir.parent, 2 * self.num_nodes * (self.feat_dim * np.dtype(feat_dtype).itemsize + 9)
        )
        (self.staging / "_spill").mkdir(parents=True)
        sp = self.staging / "_spill"
        self._feat = np.lib.format.open_memmap(
            sp / "feat.npy", mode="w+", dtype=feat_dtype, shape=(self.num_nodes, self.feat_dim)
        )
        self._label = np.lib.format.open_memmap(
            sp / "label.npy", mode="w+", dtype=np.int64, shape=(self.num_nodes,)
        )
        self._split = np.lib.format.open_memmap(
            sp / "split.npy", mode="w+", dtype=np.int8, shape=(self.num_nodes,)
        )
        self._covered = 0
        self._edge_files = [open(sp / f"edges_{i:05d}.bin", "wb") for i in range(self.num_shards)]
        self._edges_in = 0
        self._max_label = -1

    # ------------------------------------------------------------------ input
    def add_nodes(self, start: int, feat: np.ndarray, label: np.ndarray, split: np.ndarray | None) -> None:
        """Rows [start, start+len) in order. split: int8 0/1/2/-1, or None for 'decide later'."""
        n = len(feat)
        if start != self._covered:
            raise DataError(
                f"node block starts at {start}, expected {self._covered}",
                "sources must emit node rows in order",
            )
        if start + n > self.num_nodes:
            raise DataError(
                f"feature rows exceed the node count ({start + n} > {self.num_nodes})",
                "features must have one row per node",
            )
        feat = np.asarray(feat)
        if feat.ndim != 2 or feat.shape[1] != self.feat_dim:
            raise DataError(
                f"feature block has shape {feat.shape}, expected (*, {self.feat_dim})",
                "all feature rows need the same width",
            )
        if not np.isfinite(feat).all():
            bad = start + int(np.argwhere(~np.isfinite(feat))[0][0])
            raise DataError(
                f"features contain NaN or inf (first at node {bad})",
                "clean or impute the feature file before sharding",
            )
        label = np.asarray(label, dtype=np.int64)
        if len(label) != n:
            raise DataError(
                f"{len(label)} labels for {n} feature rows at node {start}", "labels need one entry per node"
            )
        if n and label.min() < -1:
            raise DataError(
                f"label {int(label.min())} is out of range",
                "use -1 for unlabelled nodes and 0..C-1 for classes",
            )
        if n and self.num_classes is not None and label.max() >= self.num_classes:
            raise DataError(
                f"label {int(label.max())} is out of range for {self.num_classes} classes",
                "fix the labels or data.num_classes",
            )
        self._feat[start : start + n] = feat
        self._label[start : start + n] = label
        self._split[start : start + n] = SPLIT_NONE if split is None else np.asarray(split, dtype=np.int8)
        self._max_label = max(self._max_label, int(label.max()) if n else -1)
        self._covered += n

    def add_edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        if len(src) != len(dst):
            raise DataError(
                f"{len(src)} sources but {len(dst)} destinations", "every edge needs both endpoints"
            )
        if len(src) == 0:
            return
        lo, hi = min(src.min(), dst.min()), max(src.max(), dst.max())
        if lo < 0 or hi >= self.num_nodes:
            bad = lo if lo < 0 else hi
            raise DataError(
                f"edge endpoint {int(bad)} is out of range for {self.num_nodes} nodes",
                "node ids must be 0..N-1; check the edge file against the features/labels",
            )
        self._edges_in += len(src)
        if self.policy.make_undirected:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        self._bucket(src, dst, self._edge_files)

    def _bucket(self, src: np.ndarray, dst: np.ndarray, files) -> None:
        """Append each edge to the spill file of its destination's shard."""
        shard = dst // self.nodes_per_shard
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(self.num_shards + 1))
        pairs = np.empty((len(src), 2), dtype=np.int64)
        pairs[:, 0], pairs[:, 1] = src[order], dst[order]
        for i in np.nonzero(np.diff(bounds))[0]:
            files[i].write(pairs[bounds[i] : bounds[i + 1]].tobytes())

    # ------------------------------------------------------------------ output
    def finish(
        self,
        *,
        split_fractions=(0.6, 0.2, 0.2),
        seed: int = 0,
        use_source_split: bool = True,
        extra: dict | None = None,
        progress=None,
    ) -> dict:
        if self._covered != self.num_nodes:
            raise DataError(
                f"features cover {self._covered} of {self.num_nodes} nodes",
                "feature rows must equal the node count",
            )
        for fh in self._edge_files:
            fh.close()
        num_classes = self.num_classes if self.num_classes is not None else self._max_label + 1
        if num_classes < 0 or (num_classes == 0 and self.num_classes is None):  # 0 given: unlabelled
            raise DataError(
                "no node has a label",
                "give a label file (or -1 for unlabelled nodes, with at least one labelled)",
            )
        has_source_split = bool((self._split != SPLIT_NONE).any())
        split_origin = "source" if (has_source_split and use_source_split) else "random"
        shards, total_edges, counts = [], 0, np.zeros(3, dtype=np.int64)
        t0 = time.time()
        node_order = self._relabel() if self.reorder != "none" else self._copy_kept_order()
        for i in range(self.num_shards):
            lo, hi = i * self.nodes_per_shard, min((i + 1) * self.nodes_per_shard, self.num_nodes)
            # the source's ids of this shard's rows: labels, features and the (source or hashed) split
            # follow their node, so a reordered graph_dir splits exactly the same nodes
            ids = np.arange(lo, hi, dtype=np.int64) if self._new_to_old is None else self._new_to_old[lo:hi]
            label = _rows(self._label, lo, hi, self._new_to_old)
            split = (
                _rows(self._split, lo, hi, self._new_to_old)
                if split_origin == "source"
                else random_split(ids, label >= 0, split_fractions, seed)
            )
            src, dst = self._shard_edges(i, lo, hi, apply_policy=self._new_to_old is None)
            for k in range(3):
                counts[k] += int((split == k).sum())
            tensors = {
                "feat": torch.from_numpy(_rows(self._feat, lo, hi, self._new_to_old)),
                "label": torch.from_numpy(label),
                "train_mask": torch.from_numpy(split == SPLIT_TRAIN),
                "val_mask": torch.from_numpy(split == SPLIT_VAL),
                "test_mask": torch.from_numpy(split == SPLIT_TEST),
                "src": torch.from_numpy(src),
                "dst": torch.from_numpy(dst),
            }
            path = self.staging / shard_file_name(i)
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:
                torch.save(
                    tensors, fh
                )  # a file object keeps the temp name out of the archive: same graph, same bytes
            del tensors
            shards.append(
                {
                    "file": path.name,
                    "node_start": lo,
                    "node_end": hi,
                    "num_edges": int(len(src)),
                    "sha256": sha256_file(path),
                }
            )
            total_edges += len(src)
            os.unlink(self.staging / "_spill" / f"edges_{i:05d}.bin")
            if progress is not None:
                progress(i + 1, self.num_shards)
        del self._feat, self._label, self._split
        shutil.rmtree(self.staging / "_spill")
        meta = {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": int(total_edges),
            "feat_dim": self.feat_dim,
            "feat_dtype": self.feat_dtype,
            "num_classes": int(num_classes),
            "directed": not self.policy.make_undirected,
            "splits": {
                "train": int(counts[0]),
                "val": int(counts[1]),
                "test": int(counts[2]),
                "origin": split_origin,
            },
            "edge_policy": {
                "make_undirected": self.policy.make_undirected,
                "self_loops": self.policy.self_loops,
                "duplicate_edges": self.policy.duplicate_edges,
            },
            "input_edges": int(self._edges_in),
            "nodes_per_shard": self.nodes_per_shard,
            "node_order": node_order,
            "shards": shards,
            "shard_time_s": round(time.time() - t0, 3),
        }
        meta.update(extra or {})
        write_meta(self.staging, meta)
        self._publish()
        return meta

    def _shard_edges(
        self, i: int, lo: int, hi: int, apply_policy: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """This shard's edges sorted by (dst, src), with the self-loop and duplicate policy applied
        (apply_policy=False: _relabel applied it already, only sort)."""
        raw = np.fromfile(self.staging / "_spill" / f"edges_{i:05d}.bin", dtype=np.int64).reshape(-1, 2)
        src, dst = raw[:, 0], raw[:, 1]
        if not apply_policy:
            key = (dst - lo) * self.num_nodes + src
            del raw, src, dst
            key.sort()
            return key % self.num_nodes, key // self.num_nodes + lo
        if self.policy.self_loops in ("remove", "add"):
            keep = src != dst
            src, dst = src[keep], dst[keep]
        if self.policy.self_loops == "add":
            loops = np.arange(lo, hi, dtype=np.int64)
            src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
        # One int64 key per edge sorts (dst, src) lexicographically in a single pass.
        key = (dst - lo) * self.num_nodes + src
        del raw, src, dst
        key = np.unique(key) if self.policy.duplicate_edges == "remove" else np.sort(key)
        return key % self.num_nodes, key // self.num_nodes + lo

    def keep_node_order(self, graph_dir: Path, record: dict) -> None:
        """Rows given in an existing reordered graph_dir's order (a derived graph, written with
        reorder="none"): carry its map to the user's ids, files and meta record."""
        self._kept_order = (Path(graph_dir), dict(record))

    def _copy_kept_order(self) -> dict:
        if self._kept_order is None:
            return {"method": "none"}
        graph_dir, record = self._kept_order
        folder = record.get("dir", ORDER_DIR)
        shutil.copytree(graph_dir / folder, self.staging / folder)
        return record

    def _relabel(self) -> dict:
        """Choose the node order and rewrite the edge spill files in the new IDs; returns meta's node_order.

        Out of core like the rest of the writer: one pass over the spill buckets (source IDs) applies the
        edge policy once and counts each node's exact in-degree (and, for rcm only, keeps the adjacency);
        a second pass maps both endpoints and re-buckets by the new destination shard. Heap: two int64
        maps (16 bytes per node) plus one bucket; rcm adds its in-memory adjacency (see rcm_order).
        The node rows stay in the staging arrays and are gathered in the new order when shards are written.
        """
        t0 = time.time()
        sp, n = self.staging / "_spill", self.num_nodes
        in_degree = np.zeros(n, dtype=np.int64)
        adjacency = []
        for i in range(self.num_shards):
            lo, hi = i * self.nodes_per_shard, min((i + 1) * self.nodes_per_shard, n)
            src, dst = self._shard_edges(i, lo, hi)
            in_degree[lo:hi] = np.bincount(dst - lo, minlength=hi - lo)
            if self.reorder == "rcm":
                adjacency.append(src.astype(np.int32))  # rows = destinations, sorted by (dst, src): a CSR
            np.stack([src, dst], axis=1).tofile(sp / f"edges_{i:05d}.bin")  # cleaned: the policy ran once
            del src, dst
        if self.reorder == "degree":
            new_to_old = degree_order(in_degree)
        else:
            indptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(in_degree, out=indptr[1:])
            indices = np.concatenate(adjacency) if adjacency else np.zeros(0, dtype=np.int32)
            del adjacency
            new_to_old = rcm_order(indptr, indices, n, symmetric=self.policy.make_undirected)
            del indices
        check_permutation(new_to_old, n)
        old_to_new = inverse(new_to_old)
        moved = [open(sp / f"relabelled_{i:05d}.bin", "wb") for i in range(self.num_shards)]
        try:
            for i in range(self.num_shards):
                path = sp / f"edges_{i:05d}.bin"
                raw = np.fromfile(path, dtype=np.int64).reshape(-1, 2)
                self._bucket(old_to_new[raw[:, 0]], old_to_new[raw[:, 1]], moved)
                del raw
                os.unlink(path)
        finally:
            for fh in moved:
                fh.close()
        for i in range(self.num_shards):
            os.replace(sp / f"relabelled_{i:05d}.bin", sp / f"edges_{i:05d}.bin")
        self._new_to_old = new_to_old
        folder = self.staging / ORDER_DIR
        folder.mkdir()
        sums = {}
        for name, arr in ((NEW_TO_OLD, new_to_old), (OLD_TO_NEW, old_to_new)):
            with atomic_path(folder / name) as tmp, open(tmp, "wb") as fh:
                np.save(fh, arr)
            sums[name] = sha256_file(folder / name)
        return {
            "method": self.reorder,
            "dir": ORDER_DIR,
            "sha256": sums,
            "time_s": round(time.time() - t0, 3),
        }

    def _publish(self) -> None:
        fsync_dir(self.staging)
        if self.graph_dir.exists():
            trash = self.graph_dir.parent / f".{self.graph_dir.name}.old"
            if trash.exists():
                shutil.rmtree(trash)
            os.replace(self.graph_dir, trash)
            os.replace(self.staging, self.graph_dir)
            shutil.rmtree(trash)
        else:
            os.replace(self.staging, self.graph_dir)
        fsync_dir(self.graph_dir.parent)

    def abort(self) -> None:
        for fh in self._edge_files:
            if not fh.closed:
                fh.close()
        if self.staging.exists():
            shutil.rmtree(self.staging, ignore_errors=True)


def _rows(arr: np.ndarray, lo: int, hi: int, new_to_old: np.ndarray | None) -> np.ndarray:
    """Rows [lo, hi) of the graph_dir as a fresh array: a slice of the staging array, or for a reordered
    graph its source rows new_to_old[lo:hi], gathered in file order (sequential reads, fewer seeks)."""
    if new_to_old is None:
        return np.array(arr[lo:hi])
    ids = new_to_old[lo:hi]
    order = np.argsort(ids, kind="stable")
    out = np.empty((len(ids),) + arr.shape[1:], dtype=arr.dtype)
    out[order] = arr[ids[order]]
    return out


__all__ = [
    "ShardWriter",
    "EdgePolicy",
    "META_FILE",
    "random_split",
    "SPLIT_NONE",
    "SPLIT_TRAIN",
    "SPLIT_VAL",
    "SPLIT_TEST",
]
