"""The graph METIS partitions and the report measures: the CSC as a simple undirected graph.

METIS wants every undirected edge in both directions, no self-loops and no duplicates (DGL aborts the
process on METIS's "input error"). A graph_dir sharded with make_undirected, self_loops=remove and
duplicate_edges=remove already stores exactly that, so its mmap'd CSC is used as it is; any other is
rebuilt here (about 40 bytes per edge while it is built, 16 per undirected edge kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from gnnscale.storage.csc import open_csc


@dataclass
class Adjacency:
    """A symmetric CSC without self-loops or duplicates: each undirected edge is stored twice."""

    num_nodes: int
    indptr: np.ndarray
    indices: np.ndarray
    rebuilt: bool  # False: the graph_dir's own mmap'd CSC

    @property
    def num_edges(self) -> int:
        """Undirected edges."""
        return len(self.indices) // 2


def is_simple_symmetric(meta: dict) -> bool:
    """Does meta.json's edge policy promise a symmetric CSC without self-loops or duplicates?"""
    policy = meta.get("edge_policy") or {}
    return (
        meta.get("directed") is False
        and bool(policy.get("make_undirected"))
        and policy.get("self_loops") == "remove"
        and policy.get("duplicate_edges") == "remove"
    )


def edge_blocks(indptr: np.ndarray, indices: np.ndarray, block_edges: int = 1 << 23) -> Iterator:
    """(src, dst) arrays of the CSC's edges, a range of whole destination columns at a time."""
    n = len(indptr) - 1
    lo = 0
    while lo < n:
        hi = int(np.searchsorted(indptr, int(indptr[lo]) + block_edges, side="right")) - 1
        hi = min(max(hi, lo + 1), n)
        a, b = int(indptr[lo]), int(indptr[hi])
        dst = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(np.asarray(indptr[lo : hi + 1])))
        yield np.asarray(indices[a:b]), dst
        lo = hi


def undirected_keys(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Every undirected edge {u, v}, u < v, once, as the sorted key u * n + v."""
    n = len(indptr) - 1
    parts = []
    for src, dst in edge_blocks(indptr, indices):
        keep = src != dst
        src, dst = src[keep], dst[keep]
        parts.append(np.unique(np.minimum(src, dst) * n + np.maximum(src, dst)))
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def symmetric_from_keys(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the symmetric CSC holding each key's edge in both directions."""
    u, v = keys // n, keys % n
    both = np.concatenate([v * n + u, u * n + v])  # dst * n + src for u->v, then v->u
    del u, v
    both.sort()
    indices = both % n
    counts = np.bincount(both // n, minlength=n)
    del both
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, indices


def adjacency(graph) -> Adjacency:
    """The graph_dir's CSC as a simple undirected graph (GraphDirError "run build-csr first" without one)."""
    indptr, indices = open_csc(graph)
    if is_simple_symmetric(graph.meta):
        return Adjacency(graph.num_nodes, indptr, indices, rebuilt=False)
    keys = undirected_keys(indptr, indices)
    ip, ix = symmetric_from_keys(keys, graph.num_nodes)
    return Adjacency(graph.num_nodes, ip, ix, rebuilt=True)
