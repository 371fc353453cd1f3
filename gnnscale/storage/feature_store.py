"""Gather feature rows for any batch of global node IDs across shards without loading whole shards.

A hot-feature cache (`FeatureStore.cache_hottest`) keeps the rows of the highest in-degree nodes, the
ones neighbour sampling draws most, in anonymous memory; a gather takes those rows from it and only the
rest from the memory-mapped shards, and counts hits and misses.

With `degree_indptr=` (model.degree_feature) every gathered row ends in one more column, log1p of the node's
in-degree in the graph the model passes messages over: mean aggregation averages a node's degree
away, and on graphs where degree drives who links to whom it is the strongest single signal.
"""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.storage.graph_dir import GraphDir, load_shard_file
from gnnscale.utils.mmap_advice import advise_tensor

CACHE_FILL_ROWS = 1 << 16  # rows copied into the cache per step while it is filled
# Rows reach `out` through a temporary (index_select, then index_copy_); chunking bounds it at this
# size instead of a whole batch's rows (hundreds of MB for a large evaluation batch).
COPY_CHUNK_BYTES = 16 << 20


def hottest_nodes(indptr: np.ndarray, k: int) -> torch.Tensor:
    """The k nodes of highest in-degree (CSC indptr differences), ties to the lower id, sorted by id.
    Neighbour sampling draws a node once per sampled in-edge of a neighbour; the synthetic and most real
    graphs are stored symmetric, so in-degree is also how often a node is drawn as a source."""
    deg = torch.from_numpy(np.diff(np.asarray(indptr)))
    k = max(0, min(int(k), len(deg)))
    order = torch.sort(deg, descending=True, stable=True).indices[:k]
    return torch.sort(order).values


def degree_column(indptr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """log1p(in-degree) per node, from CSC indptr differences (one value per node: 4 x N bytes in fp32)."""
    deg = np.diff(np.asarray(indptr)).astype(np.float32)
    return torch.from_numpy(np.log1p(deg)).to(dtype)


class FeatureStore:
    """Row gathers over the shards' mmap'd `feat` tensors (or one in-memory copy for small graphs).

    Only the pages holding the requested rows are read; the output row order equals the ID order,
    which is what keeps sampled block IDs and feature rows aligned.
    """

    def __init__(self, graph: GraphDir, in_memory: bool = False, degree_indptr: np.ndarray | None = None):
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.dtype = getattr(torch, graph.meta["feat_dtype"])
        self.stored_dim = int(graph.meta["feat_dim"])  # the columns the shards hold
        self.degree_indptr = degree_indptr  # a CSC indptr: its differences make the degree column
        self._logdeg = None if degree_indptr is None else degree_column(degree_indptr, self.dtype)
        self.feat_dim = self.stored_dim + (self._logdeg is not None)
        self._starts = torch.from_numpy(graph.node_starts)
        self.in_memory = in_memory
        self._slot: torch.Tensor | None = None  # node -> row of self._hot, -1 = not cached
        self._hot: torch.Tensor | None = None
        self.hits = self.misses = 0  # rows served by the cache / read from the shards (cache on only)
        if in_memory:
            self._full, self._feats = self._load(graph), []
        else:
            self._feats = [graph.shard(i)["feat"] for i in range(graph.num_shards)]
            one = len(self._feats) == 1 and self._logdeg is None  # a single shard is the whole matrix
            self._full = self._feats[0] if one else None
        self.access = "normal"  # the madvise advice of the mapped shards (kernel default: read-around)

    def reopened(self, in_memory: bool) -> FeatureStore:
        """The same features (and degree column) held in RAM or memory-mapped."""
        return FeatureStore(self.graph, in_memory=in_memory, degree_indptr=self.degree_indptr)

    def advise(self, how: str, keep: bool = True) -> None:
        """madvise the memory-mapped feature tensors: random (row gathers from files larger than the
        page cache left for them: a fault reads its own page, not megabytes around it) | sequential |
        normal. keep=False: for a moment (the advice in `access` stays what the store returns to)."""
        for feat in self._feats:
            advise_tensor(feat, how)
        if keep:
            self.access = how

    def _load(self, graph: GraphDir) -> torch.Tensor:
        """The whole feature matrix in RAM, copied shard by shard through a mapping that is dropped
        right after: the file pages it touched then leave this process's RSS (torch.cat over the
        graph's own mappings would hold every feature twice, once anonymous and once as page cache)."""
        full = torch.empty((self.num_nodes, self.feat_dim), dtype=self.dtype)
        for info in graph.meta["shards"]:
            part = load_shard_file(graph.path / info["file"])
            full[info["node_start"] : info["node_end"], : self.stored_dim] = part["feat"]
            del part
        if self._logdeg is not None:
            full[:, -1] = self._logdeg
        return full

    @property
    def cache_rows(self) -> int:
        return 0 if self._hot is None else int(self._hot.shape[0])

    @property
    def cache_bytes(self) -> int:
        """The cache's anonymous memory: its rows and the node -> slot map."""
        if self._hot is None:
            return 0
        return self._hot.numel() * self._hot.element_size() + self._slot.numel() * 4

    @staticmethod
    def cache_cost(num_nodes: int, row_bytes: int, rows: int) -> int:
        """What cache_hottest(rows) will hold (cache_bytes before it is built)."""
        return rows * row_bytes + num_nodes * 4 if rows > 0 else 0

    def cache_hottest(self, rows: int, indptr: np.ndarray) -> int:
        """Hold the features of the `rows` highest in-degree nodes in RAM (read once, in id order, so
        the shards are read front to back); returns the rows cached. Memory-mapped features only."""
        if self.in_memory:
            raise ValueError("the features are in RAM already: a hot-feature cache has nothing to save")
        self._hot = self._slot = None
        ids = hottest_nodes(indptr, rows)
        hot = torch.empty((len(ids), self.feat_dim), dtype=self.dtype)
        self.advise("sequential", keep=False)  # one pass in id order: let the kernel read ahead
        try:
            for lo in range(0, len(ids), CACHE_FILL_ROWS):
                self.gather(ids[lo : lo + CACHE_FILL_ROWS], out=hot[lo : lo + CACHE_FILL_ROWS])
        finally:
            self.advise(self.access)
        # One int32 slot per node (4 bytes x N) splits a batch with one O(batch) lookup; a sorted id
        # array + searchsorted would cost O(batch x log k) scattered probes on every gather.
        slot = torch.full((self.num_nodes,), -1, dtype=torch.int32)
        slot[ids] = torch.arange(len(ids), dtype=torch.int32)
        self._hot, self._slot = hot, slot
        self.hits = self.misses = 0
        return len(ids)

    @property
    def hot_slot(self) -> torch.Tensor | None:
        """node -> row of the hot-feature cache (-1: not cached), or None without a cache."""
        return self._slot

    def cache_counts(self) -> tuple[int, int]:
        """(hits, misses) so far: rows served from the cache, rows read from the shards."""
        return self.hits, self.misses

    def all_finite(self, chunk_bytes: int = 8 << 20) -> bool:
        """No NaN or inf in the in-memory matrix, checked by chunk: isfinite's temporaries are a few times
        the chunk, so chunks are sized in bytes (a fixed row count grows them with the feature width)."""
        if self._full is None:
            return True
        chunk = max(1, chunk_bytes // max(self.feat_dim * self.dtype.itemsize, 1))
        return all(
            bool(torch.isfinite(self._full[lo : lo + chunk]).all()) for lo in range(0, self.num_nodes, chunk)
        )

    def __len__(self) -> int:
        return self.num_nodes

    def gather(
        self, ids: torch.Tensor, out: torch.Tensor | None = None, staged: tuple | None = None
    ) -> torch.Tensor:
        """Rows of `ids` in that order. staged=(positions, source, index): rows read ahead
        (training/sweep.py), source[index[k]] the row of ids[positions[k]]; with the hot cache's they must
        cover every row."""
        ids = torch.as_tensor(ids, dtype=torch.int64)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.num_nodes):
            raise IndexError(f"node id out of range [0, {self.num_nodes})")
        if self._full is not None and self._slot is None and staged is None:
            return torch.index_select(self._full, 0, ids, out=out) if out is not None else self._full[ids]
        if out is None:
            out = torch.empty((len(ids), self.feat_dim), dtype=self.dtype)
        at = None  # positions of `out` still to fill (None = all of them)
        if self._logdeg is not None:  # the column first: the cache below overwrites its hits' rows whole
            out[:, -1] = self._logdeg[ids]
        stored = out if self._logdeg is None else out[:, : self.stored_dim]
        if self._slot is not None and len(ids):
            slot = self._slot[ids]
            hit = slot >= 0
            cached = hit.nonzero().squeeze(1)
            self._copy_rows(self._hot, slot[cached].to(torch.int64), out, cached)
            at = (~hit).nonzero().squeeze(1)
            ids = ids[at]
            self.hits += len(cached)  # one writer: the thread gathering (GIL-atomic enough for counts)
            self.misses += len(at)
        if staged is not None:
            positions, source, index = staged
            if len(positions) != len(ids):  # rows left uncovered would be garbage
                raise RuntimeError(f"the rows read ahead cover {len(positions)} of {len(ids)} rows")
            if len(positions) == len(out) and stored.is_contiguous():  # every row: one select, no scatter
                order = torch.empty_like(index)
                order[positions] = index
                torch.index_select(source, 0, order, out=stored)
            else:
                self._copy_rows(source, index, stored, positions)
            return out
        shard = torch.searchsorted(self._starts, ids, right=True) - 1
        order = torch.argsort(shard)
        counts = torch.bincount(shard, minlength=len(self._feats)).tolist()
        pos = 0
        for i, c in enumerate(counts):
            if c == 0:
                continue
            rows = order[pos : pos + c]
            self._copy_rows(
                self._feats[i], ids[rows] - self._starts[i], stored, rows if at is None else at[rows]
            )
            pos += c
        return out

    @staticmethod
    def _copy_rows(
        src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor
    ) -> None:
        """dst[dst_rows] = src[src_rows], COPY_CHUNK_BYTES of rows at a time."""
        step = max(1, COPY_CHUNK_BYTES // max(src.shape[1] * src.element_size(), 1))
        for lo in range(0, len(src_rows), step):
            # index_select + index_copy_: several times faster than advanced indexing on CPU.
            part = torch.index_select(src, 0, src_rows[lo : lo + step])
            dst.index_copy_(0, dst_rows[lo : lo + step], part)

    __getitem__ = gather
