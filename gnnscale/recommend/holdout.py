"""What a recommendation team tracks: of each node's held-out partners (an edge split's test edges, which
the embeddings never saw), how many its top-K list finds (recall@K) and how high (NDCG@K) — for the model's
list and, beside it, for friends of friends ranked by common neighbours (recommend/fof.py).

The split's validation edges are real links the model did not see either; they are left out of every list
(neither a hit nor a miss), as filtered ranking does. Partners count in both directions, as the
neighbours `recommend` leaves out do. Only queries with at least one held-out partner are averaged.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def pair_csc(pairs: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the pairs [2, P] in both directions: a CSC the Neighbours class reads."""
    src, dst = np.asarray(pairs[0], dtype=np.int64), np.asarray(pairs[1], dtype=np.int64)
    a = sp.csr_matrix(
        (np.ones(2 * len(src), np.int8), (np.r_[dst, src], np.r_[src, dst])), shape=(num_nodes, num_nodes)
    )
    a.sum_duplicates()
    return a.indptr.astype(np.int64), a.indices.astype(np.int64)


class HeldOut:
    """Held-out partners as sorted keys query * N + partner (user ids), and running recall / NDCG sums
    for each ranked list by name."""

    def __init__(self, test: np.ndarray, num_nodes: int, order=None):
        src, dst = np.asarray(test[0], dtype=np.int64), np.asarray(test[1], dtype=np.int64)
        if order is not None and not order.identity:  # the split is in the graph's ids
            src, dst = order.to_user(src), order.to_user(dst)
        self.n = int(num_nodes)
        self.keys = np.unique(np.r_[src * self.n + dst, dst * self.n + src])
        self.sums: dict[str, list[float]] = {}

    def partners(self, nodes: np.ndarray) -> np.ndarray:
        """How many held-out partners each query has."""
        lo = np.searchsorted(self.keys, nodes * self.n)
        return np.searchsorted(self.keys, (nodes + 1) * self.n) - lo

    def add(self, name: str, nodes: np.ndarray, ranked: np.ndarray) -> None:
        """Score one chunk's lists ranked [rows, K] (user ids, -1 = empty) of the queries `nodes`."""
        nodes = np.asarray(nodes, dtype=np.int64)
        have = self.partners(nodes)
        rows = np.flatnonzero(have > 0)
        acc = self.sums.setdefault(name, [0.0, 0.0, 0])
        if not len(rows):
            return
        probe = nodes[rows, None] * self.n + ranked[rows]
        at = np.minimum(np.searchsorted(self.keys, probe), len(self.keys) - 1)
        hit = (self.keys[at] == probe) & (ranked[rows] >= 0)
        k = ranked.shape[1]
        gain = 1.0 / np.log2(np.arange(k) + 2.0)
        ideal = np.cumsum(gain)[np.minimum(have[rows], k) - 1]
        acc[0] += float((hit.sum(1) / have[rows]).sum())
        acc[1] += float(((hit * gain).sum(1) / ideal).sum())
        acc[2] += len(rows)

    def result(self, k: int) -> dict:
        """{name: {recall@K, ndcg@K, queries}} over the queries that had held-out partners."""
        return {
            name: {
                f"recall_at_{k}": round(r / max(q, 1), 4),
                f"ndcg_at_{k}": round(g / max(q, 1), 4),
                "queries": int(q),
            }
            for name, (r, g, q) in self.sums.items()
        }
