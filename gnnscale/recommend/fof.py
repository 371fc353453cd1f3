"""Friends of friends ranked by common neighbours: what a social graph's own structure proposes, and what a
team without a GNN already ships. `recommend` joins them to the embedding search's candidates before the
trained decoder re-ranks (recommend/rerank.py), and reports this ranking's recall beside the model's.

Common neighbours here are those PairStructure counts (rows of the CSC: in-neighbours, i.e. neighbours of
an undirected graph): cn(u, v) = (A Aᵀ)[u, v], one sparse product per chunk of query rows. Why by hand:
faiss has no graph operations and DGL's sampler does not count shared neighbours.
"""

from __future__ import annotations

import numpy as np

PATHS_PER_CHUNK = 1 << 23  # 2-hop paths per sparse product: its memory, ~24 B a path, stays near 200 MB


class FriendsOfFriends:
    """Each query's `f` non-neighbours with the most common neighbours (ties: the lower id first)."""

    def __init__(self, structure, nbrs, order=None):
        """structure: tasks.pair_features.PairStructure of the graph recommended on; nbrs: the
        recommend.neighbours.Neighbours that say what to leave out; order: the graph_dir's NodeOrder
        (queries and results are the user's ids, the CSC is in the graph's)."""
        self.adj = structure.adj
        self.adj_t = structure.adj.T.tocsr()
        self.nbrs = nbrs
        self.order = None if order is None or order.identity else order
        # 2-hop paths from each row: sum over its neighbours w of how many rows list w
        listed = np.bincount(self.adj.indices, minlength=self.adj.shape[0]).astype(np.float64)
        self.paths = np.asarray(self.adj @ listed, dtype=np.int64)

    def top(self, nodes: np.ndarray, f: int) -> tuple[np.ndarray, np.ndarray]:
        """ids int64 [rows, f] (user ids, -1 = none left) and their common-neighbour counts float32
        [rows, f] (NaN where empty), best first."""
        nodes = np.asarray(nodes, dtype=np.int64)
        out_i = np.full((len(nodes), f), -1, dtype=np.int64)
        out_c = np.full((len(nodes), f), np.nan, dtype=np.float32)
        if f <= 0 or len(nodes) == 0:
            return out_i, out_c
        rows = nodes if self.order is None else self.order.to_graph(nodes)
        lo = 0
        while lo < len(rows):
            budget = np.cumsum(self.paths[rows[lo:]])
            hi = lo + max(1, int(np.searchsorted(budget, PATHS_PER_CHUNK, side="right")))
            self._chunk(nodes[lo:hi], rows[lo:hi], f, out_i[lo:hi], out_c[lo:hi])
            lo = hi
        return out_i, out_c

    def _chunk(self, nodes, rows, f: int, out_i, out_c) -> None:
        counts = (self.adj[rows] @ self.adj_t).tocoo()
        r, c, cn = counts.row.astype(np.int64), counts.col.astype(np.int64), counts.data
        if self.order is not None:
            c = self.order.to_user(c)
        keep = ~self.nbrs.excluded_pairs(nodes, r, c)
        r, c, cn = r[keep], c[keep], cn[keep]
        by = np.lexsort((c, -cn, r))  # per row: most common neighbours first, then the lower id
        r, c, cn = r[by], c[by], cn[by]
        first = np.searchsorted(r, r)  # each entry's row start (r is sorted)
        rank = np.arange(len(r)) - first
        top = rank < f
        out_i[r[top], rank[top]] = c[top]
        out_c[r[top], rank[top]] = cn[top]
