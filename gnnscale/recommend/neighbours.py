"""Who is already linked to a node, in either direction: the candidates recommend must leave out.

The CSC lists in-neighbours. An undirected graph_dir stores every edge both ways, so that is all; a
directed one also needs out-neighbours, i.e. the transposed adjacency, built out of core here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from gnnscale.storage.csc import rows_edges

_EDGE_CHUNK = 1 << 22  # edges per step of the transpose (bounded heap)


def transpose(indptr: np.ndarray, indices: np.ndarray, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The out-edge adjacency (CSR) as .npy memory maps in `folder`: a two-pass counting sort, a chunk of
    edges at a time (why by hand: faiss has no graph operations, scipy's tocsr holds every edge in RAM)."""
    n, e = len(indptr) - 1, len(indices)
    folder.mkdir(parents=True, exist_ok=True)
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    for a in range(0, e, _EDGE_CHUNK):
        out_ptr[1:] += np.bincount(np.asarray(indices[a : a + _EDGE_CHUNK]), minlength=n)
    np.cumsum(out_ptr, out=out_ptr)
    out_idx = np.lib.format.open_memmap(folder / "indices.npy", mode="w+", dtype=np.int64, shape=(e,))
    cursor = out_ptr[:-1].copy()
    for a in range(0, e, _EDGE_CHUNK):
        b = min(a + _EDGE_CHUNK, e)
        src = np.asarray(indices[a:b], dtype=np.int64)
        dst = np.searchsorted(indptr, np.arange(a, b, dtype=np.int64), side="right") - 1
        order = np.argsort(src, kind="stable")  # stable: each out-row stays in destination order
        s, d = src[order], dst[order]
        first = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        run = np.diff(np.r_[first, len(s)])
        out_idx[cursor[s] + np.arange(len(s)) - np.repeat(first, run)] = d
        cursor[s[first]] += run
    out_idx.flush()
    del out_idx
    return out_ptr, np.load(folder / "indices.npy", mmap_mode="r")


class Neighbours:
    """Neighbour sets of query chunks as sorted (row, node) keys, and per-node degrees (both directions)."""

    def __init__(
        self, indptr: np.ndarray, indices: np.ndarray, directed: bool, scratch: Path, order=None, extra=()
    ):
        """extra: more (indptr, indices) in the graph's ids whose links are left out too (an edge split's
        validation edges, both directions)."""
        self.num_nodes = len(indptr) - 1
        self.scratch = scratch
        # Queries and candidates are the user's ids (embedding rows); a reordered graph_dir's CSC is in its
        # own: map queries in and neighbours back out (storage/node_order.py). None: the same ids.
        self.order = None if order is None or order.identity else order
        self.adjs = [(indptr, indices)]
        if directed:
            self.adjs.append(transpose(indptr, indices, scratch))
        self.adjs += list(extra)

    def degree(self, nodes: np.ndarray) -> np.ndarray:
        """In- plus out-degree (an upper bound on the neighbour set's size; equal to it when undirected)."""
        if self.order is not None:
            nodes = self.order.to_graph(nodes)
        return sum(np.asarray(p[nodes + 1], dtype=np.int64) - np.asarray(p[nodes]) for p, _ in self.adjs)

    def keys(self, nodes: np.ndarray) -> np.ndarray:
        """Sorted row * num_nodes + neighbour over the query rows `nodes` (row = position in `nodes`)."""
        parts = []
        rows = nodes if self.order is None else self.order.to_graph(nodes)
        for indptr, indices in self.adjs:
            pos, owner = rows_edges(indptr, rows)
            nbr = np.asarray(indices[pos], dtype=np.int64)
            if self.order is not None:
                nbr = self.order.to_user(nbr)
            parts.append(owner * self.num_nodes + nbr)
        return np.sort(np.concatenate(parts))

    def excluded(self, nodes: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """Bool [rows, c]: candidate cand[i, j] is nodes[i] itself or one of its neighbours."""
        rows = np.broadcast_to(np.arange(len(nodes), dtype=np.int64)[:, None], cand.shape)
        return self.excluded_pairs(nodes, rows, cand)

    def excluded_pairs(self, nodes: np.ndarray, rows: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """Bool, cand's shape: candidate cand[j] of query row rows[j] is nodes[rows[j]] or its neighbour."""
        keys = self.keys(nodes)
        probe = rows * self.num_nodes + cand
        at = np.minimum(np.searchsorted(keys, probe), max(len(keys) - 1, 0))
        hit = keys[at] == probe if len(keys) else np.zeros(cand.shape, dtype=bool)
        return hit | (cand == nodes[rows])

    def close(self) -> None:
        self.adjs = self.adjs[:1]  # drops the transposed adjacency's memory map before its file goes
        shutil.rmtree(self.scratch, ignore_errors=True)
