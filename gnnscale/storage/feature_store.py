"""Gather feature rows for any batch of global node IDs across shards without loading whole shards."""

from __future__ import annotations

import torch

from gnnscale.storage.graph_dir import GraphDir, load_shard_file


class FeatureStore:
    """Row gathers over the shards' mmap'd `feat` tensors (or one in-memory copy for small graphs).

    Only the pages holding the requested rows are read; the output row order equals the ID order,
    which is what keeps sampled block IDs and feature rows aligned.
    """

    def __init__(self, graph: GraphDir, in_memory: bool = False):
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.feat_dim = int(graph.meta["feat_dim"])
        self.dtype = getattr(torch, graph.meta["feat_dtype"])
        self._starts = torch.from_numpy(graph.node_starts)
        self.in_memory = in_memory
        if in_memory:
            self._full, self._feats = self._load(graph), []
        else:
            self._feats = [graph.shard(i)["feat"] for i in range(graph.num_shards)]
            self._full = self._feats[0] if len(self._feats) == 1 else None

    def _load(self, graph: GraphDir) -> torch.Tensor:
        """The whole feature matrix in RAM, copied shard by shard through a mapping that is dropped
        right after: the file pages it touched then leave this process's RSS (torch.cat over the
        graph's own mappings would hold every feature twice, once anonymous and once as page cache)."""
        full = torch.empty((self.num_nodes, self.feat_dim), dtype=self.dtype)
        for info in graph.meta["shards"]:
            part = load_shard_file(graph.path / info["file"])
            full[info["node_start"] : info["node_end"]] = part["feat"]
            del part
        return full

    def all_finite(self, chunk: int = 1 << 16) -> bool:
        """No NaN or inf in the in-memory matrix, checked by chunk (a full bool mask costs N x F bytes)."""
        if self._full is None:
            return True
        return all(
            bool(torch.isfinite(self._full[lo : lo + chunk]).all()) for lo in range(0, self.num_nodes, chunk)
        )

    def __len__(self) -> int:
        return self.num_nodes

    def gather(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.int64)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.num_nodes):
            raise IndexError(f"node id out of range [0, {self.num_nodes})")
        if self._full is not None:
            return torch.index_select(self._full, 0, ids, out=out) if out is not None else self._full[ids]
        if out is None:
            out = torch.empty((len(ids), self.feat_dim), dtype=self.dtype)
        shard = torch.searchsorted(self._starts, ids, right=True) - 1
        order = torch.argsort(shard)
        counts = torch.bincount(shard, minlength=len(self._feats)).tolist()
        pos = 0
        for i, c in enumerate(counts):
            if c == 0:
                continue
            rows = order[pos : pos + c]
            out[rows] = self._feats[i][ids[rows] - self._starts[i]]
            pos += c
        return out

    __getitem__ = gather
