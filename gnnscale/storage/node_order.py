"""shard.reorder: a locality-preserving node order chosen at shard time, and the map back to the user's IDs.

Why: out of core, a sampled batch touches the feature rows and CSC slices of its nodes; with the
source's order those are scattered over the whole file, so nearly every row gathered costs its own page
(and read-around). Relabelling so that the nodes sampling hits most (degree) or neighbours (rcm) sit
together packs a batch's rows into fewer pages.

graph_dir keeps the map (DESIGN §4): node_order/new_to_old.npy (row i of the graph_dir is the user's node
new_to_old[i]) and old_to_new.npy (its inverse), both int64 and mmap-able, recorded with their sha256 in
meta.json's `node_order`. Everything a user sees (infer outputs, recommend IDs, node-ID inputs) is
mapped through them; everything inside gnnscale (shards, CSC, partitions, layer caches) uses the new IDs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnscale.errors import ConfigError, GraphDirError

METHODS = ("none", "degree", "rcm")
ORDER_DIR = "node_order"
NEW_TO_OLD = "new_to_old.npy"
OLD_TO_NEW = "old_to_new.npy"


def check_method(method: str) -> str:
    if method not in METHODS:
        hint = f"use one of {'|'.join(METHODS)}"
        if method == "metis":
            hint += " (metis ordering is not implemented; partition.method=metis partitions an existing graph_dir)"
        raise ConfigError(f"shard.reorder={method!r} is not a node order", hint)
    return method


def degree_order(in_degree: np.ndarray) -> np.ndarray:
    """new_to_old: in-degree descending, ties by original id (stable sort on the negated degree).

    The highest in-degree nodes are the ones neighbour sampling draws most: put first, their features
    and CSC slices share a few hot pages (and the hot-feature cache's rows are one contiguous block)."""
    return np.argsort(-np.asarray(in_degree, dtype=np.int64), kind="stable").astype(np.int64)


def rcm_order(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, symmetric: bool) -> np.ndarray:
    """new_to_old by reverse Cuthill-McKee (bandwidth-reducing BFS: neighbours get nearby IDs).

    Needs the whole adjacency in memory: scipy takes an int32 CSR, so about 4 bytes per stored edge plus
    4 per node (the 5M-node / 199M-edge graph: ~0.8 GB), and for a directed graph scipy symmetrises A + Aᵀ
    first (about 3x that). Fine on a 24 GB machine for that graph; beyond ~2^31 edges use degree."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    if len(indices) >= 2**31:
        raise ConfigError(
            f"shard.reorder=rcm needs an int32 adjacency; this graph has {len(indices):,} stored edges",
            "use shard.reorder=degree for graphs this large",
        )
    mat = sp.csr_matrix(
        (np.ones(len(indices), dtype=np.int8), indices.astype(np.int32), indptr.astype(np.int32)),
        shape=(num_nodes, num_nodes),
    )
    return np.asarray(reverse_cuthill_mckee(mat, symmetric_mode=symmetric), dtype=np.int64)


def inverse(new_to_old: np.ndarray) -> np.ndarray:
    old_to_new = np.empty_like(new_to_old)
    old_to_new[new_to_old] = np.arange(len(new_to_old), dtype=np.int64)
    return old_to_new


def check_permutation(new_to_old: np.ndarray, num_nodes: int) -> None:
    """A bug guard before anything is relabelled: every node exactly once."""
    if len(new_to_old) != num_nodes or not np.array_equal(
        np.bincount(new_to_old, minlength=num_nodes), np.ones(num_nodes, dtype=np.int64)
    ):
        raise AssertionError("node order is not a permutation of the nodes")


class NodeOrder:
    """The map between the user's node IDs (old) and graph_dir's (new); identity for an unordered graph."""

    def __init__(self, method: str, new_to_old: np.ndarray | None, old_to_new: np.ndarray | None):
        self.method = method
        self.new_to_old = new_to_old
        self.old_to_new = old_to_new

    @property
    def identity(self) -> bool:
        return self.new_to_old is None

    def to_graph(self, user_ids: np.ndarray) -> np.ndarray:
        """User IDs (already range-checked) -> graph_dir IDs."""
        ids = np.asarray(user_ids, dtype=np.int64)
        return ids if self.identity else np.asarray(self.old_to_new[ids])

    def to_user(self, graph_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(graph_ids, dtype=np.int64)
        return ids if self.identity else np.asarray(self.new_to_old[ids])

    def describe_rows(self) -> str:
        """emb_info's node_order line for an output whose row i is user node i."""
        if self.identity:
            return "row i is global node id i of graph_dir"
        return f"row i is the user's node id i (graph_dir is reordered by {self.method}; mapped back)"


def load_node_order(graph_dir: str | Path, meta: dict) -> NodeOrder:
    rec = meta.get("node_order")
    if not rec or rec.get("method", "none") == "none":
        return NodeOrder("none", None, None)
    folder = Path(graph_dir) / rec.get("dir", ORDER_DIR)
    try:
        n2o = np.load(folder / NEW_TO_OLD, mmap_mode="r")
        o2n = np.load(folder / OLD_TO_NEW, mmap_mode="r")
    except FileNotFoundError as exc:
        raise GraphDirError(
            f"graph_dir '{graph_dir}' is reordered but {exc.filename} is missing",
            "re-run `gnnscale shard` for this graph_dir",
        ) from None
    n = int(meta["num_nodes"])
    if n2o.shape != (n,) or o2n.shape != (n,):
        raise GraphDirError(
            f"node order files in {folder} do not have {n:,} rows",
            "re-run `gnnscale shard` for this graph_dir",
        )
    return NodeOrder(rec["method"], n2o, o2n)


def order_files(meta: dict) -> list[tuple[str, str | None]]:
    """(path inside graph_dir, sha256) of the node order files meta.json records (for verify)."""
    rec = meta.get("node_order")
    if not rec or rec.get("method", "none") == "none":
        return []
    folder = rec.get("dir", ORDER_DIR)
    sums = rec.get("sha256") or {}
    return [(f"{folder}/{name}", sums.get(name)) for name in (NEW_TO_OLD, OLD_TO_NEW)]
