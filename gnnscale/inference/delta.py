"""Graph changes for incremental re-inference: changes.npz in, a cumulative delta over the graph_dir out.

changes.npz (every key optional, at least one change):
  feat_nodes [k] int, feat [k, feat_dim]   new feature rows of nodes whose features changed
  add_src, add_dst [m] int                 edges added (src -> dst)
  remove_src, remove_dst [r] int           edges removed
  mirror  scalar bool                      also apply each edge's reverse; default: the graph is undirected

Node ids are the user's: those of the source graph, mapped to the graph_dir's own on a graph_dir sharded
with shard.reorder. The delta (run_dir/graph_delta.npz) is always relative to the stored graph_dir, in its
ids, so updates chain: each update run composes its changes onto its base run's delta.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import DataError
from gnnscale.inference.blocks import Adjacency
from gnnscale.storage.csc import build_csc, rows_edges
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.shard_writer import (
    SPLIT_NONE,
    SPLIT_TEST,
    SPLIT_TRAIN,
    SPLIT_VAL,
    EdgePolicy,
    ShardWriter,
)
from gnnscale.utils.atomic import atomic_path

CHANGE_KEYS = ("feat_nodes", "feat", "add_src", "add_dst", "remove_src", "remove_dst", "mirror")
_EMPTY = np.empty(0, dtype=np.int64)


@dataclass
class Changes:
    feat_nodes: np.ndarray = field(default_factory=lambda: _EMPTY)
    feat: np.ndarray | None = None
    add_src: np.ndarray = field(default_factory=lambda: _EMPTY)
    add_dst: np.ndarray = field(default_factory=lambda: _EMPTY)
    remove_src: np.ndarray = field(default_factory=lambda: _EMPTY)
    remove_dst: np.ndarray = field(default_factory=lambda: _EMPTY)


def _ids(data, key: str, n: int, path: Path) -> np.ndarray:
    if key not in data:
        return _EMPTY
    a = np.asarray(data[key])
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise DataError(
            f"{path}: '{key}' must be a 1-D integer array, got {a.dtype} {a.shape}", "store node ids as int64"
        )
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= n):
        raise DataError(
            f"{path}: '{key}' holds node id {int(a.min() if a.min() < 0 else a.max())} outside [0, {n})",
            "node ids are the source graph's, 0 .. num_nodes - 1",
        )
    return a


def read_changes(path: str | Path, graph: GraphDir) -> Changes:
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"changes file '{path}' does not exist",
            "pass --update a .npz with feat_nodes/feat, add_src/add_dst, remove_src/remove_dst",
        )
    try:
        data = dict(np.load(path, allow_pickle=False))
    except Exception as exc:
        raise DataError(
            f"cannot read changes file {path}: {str(exc).splitlines()[0]}", "write it with numpy.savez"
        ) from None
    unknown = sorted(set(data) - set(CHANGE_KEYS))
    if unknown:
        raise DataError(
            f"{path} has unknown key(s) {', '.join(unknown)}", f"valid keys: {', '.join(CHANGE_KEYS)}"
        )
    n, f = graph.num_nodes, int(graph.meta["feat_dim"])
    order = graph.node_order  # the user's ids -> the graph_dir's (the identity unless shard.reorder)

    def ids(key: str) -> np.ndarray:
        return order.to_graph(_ids(data, key, n, path))

    ch = Changes(
        feat_nodes=ids("feat_nodes"),
        add_src=ids("add_src"),
        add_dst=ids("add_dst"),
        remove_src=ids("remove_src"),
        remove_dst=ids("remove_dst"),
    )
    for a, b in (("add_src", "add_dst"), ("remove_src", "remove_dst")):
        if len(getattr(ch, a)) != len(getattr(ch, b)):
            raise DataError(
                f"{path}: {a} and {b} have different lengths", "give one source and one destination per edge"
            )
    if len(ch.feat_nodes):
        feat = np.asarray(data.get("feat", np.empty((0, f))))
        if feat.shape != (len(ch.feat_nodes), f):
            raise DataError(
                f"{path}: 'feat' has shape {feat.shape}, expected ({len(ch.feat_nodes)}, {f})",
                "one new feature row per entry of feat_nodes",
            )
        if not np.isfinite(feat).all():
            raise DataError(f"{path}: 'feat' holds NaN or inf", "clean the new feature rows")
        if len(np.unique(ch.feat_nodes)) != len(ch.feat_nodes):
            raise DataError(f"{path}: 'feat_nodes' lists a node twice", "give each changed node once")
        ch.feat = feat.astype(np.float32)
    elif "feat" in data and np.asarray(data["feat"]).size:
        raise DataError(
            f"{path}: 'feat' is given without 'feat_nodes'", "add feat_nodes (the node id of each row)"
        )
    mirror = (
        bool(np.asarray(data["mirror"])) if "mirror" in data else not bool(graph.meta.get("directed", False))
    )
    if mirror:
        ch.add_src, ch.add_dst = (
            np.concatenate([ch.add_src, ch.add_dst]),
            np.concatenate([ch.add_dst, ch.add_src]),
        )
        ch.remove_src, ch.remove_dst = (
            np.concatenate([ch.remove_src, ch.remove_dst]),
            np.concatenate([ch.remove_dst, ch.remove_src]),
        )
    if not (len(ch.feat_nodes) or len(ch.add_src) or len(ch.remove_src)):
        raise DataError(
            f"{path} lists no change", "give feat_nodes/feat, add_src/add_dst or remove_src/remove_dst"
        )
    return ch


def _unique_pairs(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    key = np.unique(dst * n + src)
    return key % n, key // n


@dataclass
class GraphDelta:
    """The graph_dir plus changes: replaced feature rows, removed CSC positions, added edges."""

    feat_nodes: np.ndarray = field(default_factory=lambda: _EMPTY)
    feat_rows: np.ndarray = field(default_factory=lambda: np.empty((0, 0), dtype=np.float32))
    removed_pos: np.ndarray = field(default_factory=lambda: _EMPTY)
    add_src: np.ndarray = field(default_factory=lambda: _EMPTY)
    add_dst: np.ndarray = field(default_factory=lambda: _EMPTY)

    @classmethod
    def load(cls, path: Path) -> "GraphDelta":
        if not path.is_file():
            return cls()
        d = np.load(path, allow_pickle=False)
        return cls(d["feat_nodes"], d["feat_rows"], d["removed_pos"], d["add_src"], d["add_dst"])

    def save(self, path: Path) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(
                fh,
                feat_nodes=self.feat_nodes,
                feat_rows=self.feat_rows,
                removed_pos=self.removed_pos,
                add_src=self.add_src,
                add_dst=self.add_dst,
            )

    def adjacency(self, indptr, indices) -> Adjacency:
        return Adjacency(indptr, indices, self.removed_pos, self.add_src, self.add_dst)

    def summary(self) -> dict:
        return {
            "feature_rows_replaced": int(len(self.feat_nodes)),
            "edges_removed": int(len(self.removed_pos)),
            "edges_added": int(len(self.add_src)),
        }

    def apply(self, ch: Changes, graph: GraphDir, indptr, indices) -> tuple["GraphDelta", dict]:
        """This delta with `ch` composed on top, and what actually changed (for the affected sets)."""
        n = graph.num_nodes
        policy = graph.meta.get("edge_policy", {})
        keep_loops = policy.get("self_loops", "keep") == "keep"
        dedup = policy.get("duplicate_edges", "remove") == "remove"
        report = {"self_loops_skipped": 0, "duplicates_skipped": 0}

        # Features: later changes win.
        feat_nodes, feat_rows = self.feat_nodes, self.feat_rows
        if len(ch.feat_nodes):
            keep = ~np.isin(feat_nodes, ch.feat_nodes)
            nodes = np.concatenate([feat_nodes[keep], ch.feat_nodes])
            rows = np.concatenate([feat_rows[keep].reshape(-1, ch.feat.shape[1]), ch.feat])
            order = np.argsort(nodes)
            feat_nodes, feat_rows = nodes[order], rows[order]

        if not (len(self.removed_pos) or len(self.add_src) or len(ch.remove_src)):
            # Additions onto the stored graph alone (a first update): the loop below, vectorised.
            as_, ad = _unique_pairs(ch.add_src, ch.add_dst, n) if dedup else (ch.add_src, ch.add_dst)
            keep = np.ones(len(as_), dtype=bool)
            if not keep_loops:
                keep &= as_ != ad
                report["self_loops_skipped"] = int((~keep).sum())
            if dedup and len(as_):
                pos, owner = rows_edges(indptr, np.unique(ad))
                rows = np.unique(ad)
                stored = np.sort(rows[owner] * n + np.asarray(indices[pos], dtype=np.int64))
                q = ad * n + as_
                exists = np.searchsorted(stored, q, "right") > np.searchsorted(stored, q, "left")
                report["duplicates_skipped"] = int((keep & exists).sum())
                keep &= ~exists
            add_src, add_dst = as_[keep].astype(np.int64), ad[keep].astype(np.int64)
            report["edges_removed"] = 0
            report["edges_added"] = int(keep.sum())
            report["feature_rows_changed"] = int(len(ch.feat_nodes))
            report["changed_feat_nodes"] = ch.feat_nodes
            report["changed_src"], report["changed_dst"] = add_src, add_dst
            delta = GraphDelta(feat_nodes, feat_rows.astype(np.float32), _EMPTY, add_src, add_dst)
            return delta, report

        removed = set(self.removed_pos.tolist())
        added = {}  # (dst, src) -> count, the delta's added edges
        for s, d in zip(self.add_src.tolist(), self.add_dst.tolist(), strict=True):
            added[(d, s)] = added.get((d, s), 0) + 1
        changed_src, changed_dst = [], []

        def base_positions(src, dst):
            """CSC positions of each (src, dst) in the stored graph (rows are sorted by src)."""
            if len(src) == 0:
                return []
            rows = np.unique(dst)
            pos, owner = rows_edges(indptr, rows)
            keys = rows[owner] * n + np.asarray(indices[pos], dtype=np.int64)
            q = dst * n + src
            lo, hi = np.searchsorted(keys, q, "left"), np.searchsorted(keys, q, "right")
            return [pos[a:b].tolist() for a, b in zip(lo, hi, strict=True)]

        rs, rd = _unique_pairs(ch.remove_src, ch.remove_dst, n)
        missing = []
        for s, d, found in zip(rs.tolist(), rd.tolist(), base_positions(rs, rd), strict=True):
            live = [p for p in found if p not in removed]
            if (d, s) in added:
                del added[(d, s)]
                removed.update(live)
            elif live:
                removed.update(live)
            else:
                missing.append((s, d))
                continue
            changed_src.append(s)
            changed_dst.append(d)
        if missing:
            s, d = missing[0]
            raise DataError(
                f"{len(missing)} edge(s) to remove are not in the graph (first: {s} -> {d})",
                "list only existing edges in remove_src/remove_dst",
            )
        report["edges_removed"] = len(changed_src)

        as_, ad = _unique_pairs(ch.add_src, ch.add_dst, n) if dedup else (ch.add_src, ch.add_dst)
        n_added = 0
        for s, d, found in zip(as_.tolist(), ad.tolist(), base_positions(as_, ad), strict=True):
            if s == d and not keep_loops:
                report["self_loops_skipped"] += 1  # the graph's policy drops self-loops; so does a rebuild
                continue
            gone = [p for p in found if p in removed]
            exists = len(found) > len(gone) or (d, s) in added
            if gone and not exists:
                removed.discard(gone[0])  # re-adding an edge removed earlier restores it
            elif exists and dedup:
                report["duplicates_skipped"] += 1
                continue
            else:
                added[(d, s)] = added.get((d, s), 0) + 1
            n_added += 1
            changed_src.append(s)
            changed_dst.append(d)
        report["edges_added"] = n_added

        pairs = [(d, s) for (d, s), c in added.items() for _ in range(c)]
        add_dst = np.array([p[0] for p in pairs], dtype=np.int64)
        add_src = np.array([p[1] for p in pairs], dtype=np.int64)
        delta = GraphDelta(
            feat_nodes,
            feat_rows.astype(np.float32),
            np.array(sorted(removed), dtype=np.int64),
            add_src,
            add_dst,
        )
        report["feature_rows_changed"] = int(len(ch.feat_nodes))
        report["changed_feat_nodes"] = ch.feat_nodes
        report["changed_src"] = np.array(changed_src, dtype=np.int64)
        report["changed_dst"] = np.array(changed_dst, dtype=np.int64)
        return delta, report


class PatchedFeatures:
    """Feature rows of the graph_dir with the delta's replaced rows on top."""

    def __init__(self, base, delta: GraphDelta):
        self.base = base
        self.nodes = torch.from_numpy(delta.feat_nodes)
        self.rows = torch.from_numpy(delta.feat_rows)

    def copy_into(self, out) -> None:
        """Every node's (patched) feature row into `out`: [N, F] float32 rows with write_range / write."""
        from gnnscale.inference.layerwise import copy_shard_features

        copy_shard_features(self.base.graph, out)
        if len(self.nodes):
            out.write(self.nodes.numpy(), self.rows)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.base.gather(ids)
        if len(self.nodes) and len(ids):
            at = torch.searchsorted(self.nodes, ids).clamp_(max=len(self.nodes) - 1)
            hit = self.nodes[at] == ids
            if hit.any():
                out = out.to(torch.float32)
                out[hit] = self.rows[at[hit]]
        return out


def write_updated_graph(
    graph: GraphDir,
    delta: GraphDelta,
    out_dir: str | Path,
    overwrite: bool = False,
    chunk_rows: int = 1 << 16,
) -> Path:
    """The graph_dir with the delta applied, as a new graph_dir (shards + CSC): what a full recomputation reads."""
    from gnnscale.storage.csc import open_csc

    indptr, indices = open_csc(graph)
    meta = graph.meta
    n, nps = (
        graph.num_nodes,
        int(meta.get("nodes_per_shard") or (meta["shards"][0]["node_end"] - meta["shards"][0]["node_start"])),
    )
    # The edge set is written exactly as it is; the original policy is kept in meta.json for later updates.
    writer = ShardWriter(
        out_dir,
        name=meta["name"],
        num_nodes=n,
        feat_dim=int(meta["feat_dim"]),
        num_classes=int(meta["num_classes"]),
        nodes_per_shard=nps,
        policy=EdgePolicy(make_undirected=False, self_loops="keep", duplicate_edges="keep"),
        feat_dtype="float32" if len(delta.feat_nodes) else meta["feat_dtype"],
        overwrite=overwrite,
    )
    if not graph.node_order.identity:  # rows stay in graph_dir order: the map to the user's ids goes along
        writer.keep_node_order(graph.path, meta["node_order"])
    try:
        feats = PatchedFeatures(FeatureStore(graph), delta)
        labels = graph.labels().numpy()
        split = np.full(n, SPLIT_NONE, dtype=np.int8)
        for name, code in (("train", SPLIT_TRAIN), ("val", SPLIT_VAL), ("test", SPLIT_TEST)):
            split[graph.mask(name).numpy()] = code
        adj = delta.adjacency(indptr, indices)
        for lo in range(0, n, chunk_rows):
            hi = min(lo + chunk_rows, n)
            rows = np.arange(lo, hi, dtype=np.int64)
            writer.add_nodes(lo, feats.gather(torch.from_numpy(rows)).numpy(), labels[lo:hi], split[lo:hi])
            ip, src = adj.in_edges(rows)
            writer.add_edges(src, np.repeat(rows, np.diff(ip)))
        extra = {k: meta[k] for k in ("directed", "edge_policy", "source") if k in meta}
        extra["derived_from"] = {"graph_dir": str(graph.path), **delta.summary()}
        writer.finish(use_source_split=True, extra=extra)
    except BaseException:
        writer.abort()
        raise
    build_csc(GraphDir(out_dir), validate=False)
    return Path(out_dir)
