"""How good a partition is: edge cut over the undirected edges, per-part sizes, balance."""

from __future__ import annotations

import numpy as np

from gnnscale.partition.graph import Adjacency, edge_blocks


def _balance(counts: np.ndarray) -> float | None:
    """Largest part / mean part (1.0 = perfect); None when there is nothing to balance."""
    mean = counts.mean() if len(counts) else 0
    return round(float(counts.max() / mean), 4) if mean > 0 else None


def quality(adj: Adjacency, assignment: np.ndarray, num_parts: int, train_mask: np.ndarray) -> dict:
    """Edge cut and per-part nodes / internal edges / training nodes, streamed over the CSC."""
    part = np.asarray(assignment)
    cut = 0
    internal = np.zeros(num_parts, dtype=np.int64)
    for src, dst in edge_blocks(adj.indptr, adj.indices):
        ps, pd = part[src], part[dst]
        same = ps == pd
        cut += int(len(same) - np.count_nonzero(same))
        internal += np.bincount(pd[same], minlength=num_parts)
    cut //= 2  # each undirected edge was seen from both ends
    internal //= 2
    nodes = np.bincount(part, minlength=num_parts)
    train = np.bincount(part[np.asarray(train_mask, dtype=bool)], minlength=num_parts)
    return {
        "num_nodes": adj.num_nodes,
        "undirected_edges": adj.num_edges,
        "edge_cut": cut,
        "edge_cut_ratio": round(cut / adj.num_edges, 6) if adj.num_edges else 0.0,
        "node_balance": _balance(nodes),
        "train_balance": _balance(train),
        "empty_parts": int(np.count_nonzero(nodes == 0)),
        "train_nodes": int(train.sum()),
        "nodes_per_part": nodes.tolist(),
        "edges_per_part": internal.tolist(),
        "train_nodes_per_part": train.tolist(),
    }
