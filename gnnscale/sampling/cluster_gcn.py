"""`sampler=cluster_gcn`: Cluster-GCN (Chiang et al., 2019) — batches of whole graph clusters.

The clusters are a partition of the graph_dir (storage/partitions.py: `gnnscale partition`, METIS or
random, `num_parts` parts); the trainer makes it when missing (`needs_partition`, then `prepare` reads it).
Each epoch the clusters are shuffled (numpy's global RNG, reseeded per epoch by the trainer) and joined
`clusters_per_batch` at a time; a batch is the subgraph induced by their nodes — every edge between two of
them, including the edges between different clusters of the batch, which is what Cluster-GCN's stochastic
multiple clustering adds back. Every layer runs on that subgraph; the loss is on the training nodes inside.
Training hands it on as blocks holding only the rows the loss reads, when that is exact for the model
(sampling/prune.py: GraphSAGE and the MLP; GraphConv keeps the subgraph).

An epoch has ceil(num_parts / clusters_per_batch) batches and uses every cluster exactly once. Each batch
leads with a cluster that holds a training node (a batch without one would have no loss): the leads are a
random draw from those clusters, the remaining clusters are shuffled into the remaining places. When every
cluster holds training nodes this is exactly a uniformly random grouping; when fewer than that many
clusters hold training nodes (few labels, many small parts), there is one batch per such cluster instead
and the other clusters are spread evenly over them.

Speed: the subgraph is cut from a cluster-ordered copy of the CSC's sources (ClusterCsc, made once per run:
4 bytes per edge), where the in-edges of a cluster are one contiguous slice, so a batch's in-edges are
clusters_per_batch slices; an N-sized id map keeps the sources inside the batch and renumbers them. On the
500k-node / 10M-edge benchmark graph (500 parts, 20 per batch: 20k nodes, 365k in-edges, 60k kept) a batch
takes ~3 ms, against ~20 ms for DGL's ClusterGCNSampler (`DGLGraph.subgraph` plus its feature slicing).
A batch's nodes are its clusters' nodes cluster after cluster (ascending ids within each), so the feature
gather reads clusters_per_batch ascending runs. Sampling runs in the training process (num_workers is not
used).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.induced import Induced, seed_mask, seed_rows

METHODS = ("metis", "random")


class ClusterGcnSampler:
    """Batches of `clusters_per_batch` clusters of a node partition, each the induced subgraph of their nodes.

    num_parts 0 = ceil(num_nodes / nodes_per_part) parts, or with that 0 too, storage.partitions'
    default_num_parts (about one part per 1,000 nodes)."""

    per_batch_subgraphs = True  # build_loader may hand them on as blocks over what the loss reads

    def __init__(
        self, num_parts: int = 0, method: str = "metis", clusters_per_batch: int = 20, nodes_per_part: int = 0
    ):
        self.num_parts = int(num_parts)
        self.nodes_per_part = int(nodes_per_part)
        self.method = str(method)
        self.clusters_per_batch = int(clusters_per_batch)
        self.assignment: np.ndarray | None = None
        self._order: np.ndarray | None = None  # node ids grouped by cluster, ascending within each
        self._offsets: np.ndarray | None = None  # cluster c is _order[_offsets[c]:_offsets[c + 1]]
        self._csc: ClusterCsc | None = None
        self._csc_of = None  # the DGL graph _csc was made from

    # ------------------------------------------------------------ partition
    def needs_partition(self, num_nodes: int) -> tuple[str, int]:
        """(method, num_parts) of the partition this sampler reads: the trainer makes it if missing."""
        from gnnscale.storage.partitions import default_num_parts

        if self.num_parts:
            parts = self.num_parts
        elif self.nodes_per_part:
            parts = max(1, math.ceil(num_nodes / self.nodes_per_part))
        else:
            parts = default_num_parts(num_nodes)
        if parts > num_nodes:
            raise ConfigError(
                f"sampler.num_parts={parts} exceeds the graph's {num_nodes:,} nodes",
                "use fewer parts, e.g. sampler.num_parts=0 (about one per 1,000 nodes)",
            )
        return self.method, parts

    def prepare(self, ctx) -> None:
        """Read the partition from the graph_dir (made by `gnnscale partition` or the trainer)."""
        from gnnscale.storage.partitions import read_assignment

        method, parts = self.needs_partition(ctx.graph.num_nodes)
        assignment = read_assignment(ctx.graph, method, parts)
        if assignment is None:
            raise DataError(
                f"'{ctx.graph.path}' has no current {method} partition into {parts} parts",
                f"make it with `gnnscale partition graph_dir={ctx.graph.path} partition.method={method} "
                f"partition.num_parts={parts}` (gnnscale train makes it itself)",
            )
        self.use_assignment(assignment, parts)

    def use_assignment(self, assignment: np.ndarray, num_parts: int | None = None) -> None:
        """Take a partition: the cluster id of every node (0..num_parts-1; empty clusters are allowed)."""
        assignment = np.asarray(assignment)
        parts = int(num_parts) if num_parts is not None else int(assignment.max()) + 1
        if len(assignment) and (int(assignment.min()) < 0 or int(assignment.max()) >= parts):
            raise DataError(
                f"the partition holds part ids outside [0, {parts})", "re-run `gnnscale partition`"
            )
        self.assignment = assignment
        self._order = np.argsort(assignment, kind="stable").astype(np.int64)
        self._offsets = np.zeros(parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(assignment, minlength=parts), out=self._offsets[1:])
        self._csc = self._csc_of = None  # made for the previous partition

    @property
    def num_clusters(self) -> int:
        return 0 if self._offsets is None else len(self._offsets) - 1

    # ------------------------------------------------------------ batches
    def loader(self, g, seeds, batch_size=None, shuffle=True, num_workers=0, drop_last=False):
        """This epoch's batches over `seeds` (the training nodes); batch_size, num_workers and drop_last
        do not apply (clusters_per_batch sets the batch, sampling runs in this process)."""
        if self.assignment is None:
            raise DataError("cluster_gcn has no partition yet", "call prepare(ctx) or use_assignment() first")
        if len(self.assignment) != g.num_nodes():
            raise DataError(
                f"the partition covers {len(self.assignment):,} nodes, the graph has {g.num_nodes():,}",
                "re-run `gnnscale partition`",
            )
        if self._csc is None or self._csc_of is not g:
            indptr, indices, _ = g.adj_tensors("csc")
            self._csc = ClusterCsc(indptr.numpy(), indices.numpy(), self._order, self._offsets)
            self._csc_of = g
        return ClusterLoader(self, self._csc, seed_mask(g.num_nodes(), seeds), bool(shuffle))


class ClusterCsc:
    """The graph's CSC with its nodes in cluster order (a copy of the sources, 4 bytes per edge on graphs
    under 2^31 nodes): the in-edges of a cluster's nodes are one contiguous slice, so a batch's in-edges are
    clusters_per_batch slices rather than a gather per edge. Not thread-safe (one scratch id map)."""

    def __init__(self, indptr, indices, order: np.ndarray, offsets: np.ndarray, chunk_edges: int = 1 << 24):
        n = len(order)
        self.order, self.offsets = order, offsets
        self.deg = (indptr[1:] - indptr[:-1])[order]  # in-degree of each node, cluster order
        self.indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.deg, out=self.indptr[1:])
        dtype = np.int32 if n < 2**31 else np.int64
        self.indices = np.empty(int(self.indptr[-1]), dtype=dtype)
        lo = 0
        while lo < n:  # copy the sources node range by node range: O(chunk_edges) scratch
            hi = int(np.searchsorted(self.indptr, self.indptr[lo] + chunk_edges, side="right")) - 1
            hi = min(max(hi, lo + 1), n)
            starts, counts = indptr[order[lo:hi]], self.deg[lo:hi]
            ends = np.cumsum(counts)
            pos = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(starts - (ends - counts), counts)
            self.indices[self.indptr[lo] : self.indptr[hi]] = indices[pos]
            lo = hi
        self.edge_start = self.indptr[offsets]  # cluster c's in-edges: indices[edge_start[c]:edge_start[c+1]]
        self._map = np.full(n, -1, dtype=dtype)

    def nodes(self, clusters) -> np.ndarray:
        """The nodes of these clusters, cluster after cluster (ascending ids within each)."""
        o, off = self.order, self.offsets
        return np.concatenate([o[off[c] : off[c + 1]] for c in clusters])

    def build(self, clusters) -> Induced:
        """The subgraph induced by these clusters' nodes (local ids in self.nodes(clusters) order)."""
        off, es = self.offsets, self.edge_start
        nodes = self.nodes(clusters)
        counts = np.concatenate([self.deg[off[c] : off[c + 1]] for c in clusters])
        src = np.concatenate([self.indices[es[c] : es[c + 1]] for c in clusters])
        n, local = len(nodes), self._map
        local[nodes] = np.arange(n, dtype=local.dtype)
        try:
            src = local[src]
        finally:
            local[nodes] = -1  # leave the map clean for the next batch
        keep = src >= 0
        kept = np.cumsum(keep, dtype=np.int64 if len(src) >= 2**31 else np.int32)
        indptr = np.zeros(n + 1, dtype=np.int64)
        ends = np.cumsum(counts)
        has = ends > 0  # kept edges among each node's in-edges and those before: kept[ends - 1]
        indptr[1:][has] = kept[ends[has] - 1]
        return Induced(nodes, indptr, src[np.flatnonzero(keep)].astype(np.int64), None)


class ClusterLoader:
    """One epoch of Cluster-GCN batches; the grouping is drawn when iteration starts."""

    def __init__(self, sampler: ClusterGcnSampler, csc: ClusterCsc, is_seed: np.ndarray, shuffle: bool):
        self.sampler, self.csc, self.is_seed, self.shuffle = sampler, csc, is_seed, shuffle
        k = sampler.num_clusters
        seeded = np.bincount(sampler.assignment[is_seed], minlength=k) > 0 if k else np.zeros(0, bool)
        self.seeded = np.flatnonzero(seeded)  # clusters holding a training node
        self.unseeded = np.flatnonzero(~seeded)
        self.num_batches = min(math.ceil(k / sampler.clusters_per_batch), len(self.seeded))

    def __len__(self) -> int:
        return self.num_batches

    def groups(self) -> list[np.ndarray]:
        """This epoch's clusters, batch by batch (draws from numpy's global RNG when shuffling)."""
        b, per = self.num_batches, self.sampler.clusters_per_batch
        if b == 0:
            return []
        k = self.sampler.num_clusters
        seeded = np.random.permutation(self.seeded) if self.shuffle else self.seeded
        rest = np.concatenate([seeded[b:], self.unseeded])
        if self.shuffle:
            rest = np.random.permutation(rest)
        if b == math.ceil(k / per):
            sizes = np.full(b, per)
            sizes[-1] = k - per * (b - 1)
        else:  # fewer seeded clusters than batches of `per`: spread the clusters evenly over them
            sizes = np.full(b, k // b)
            sizes[: k % b] += 1
        bounds = np.concatenate([[0], np.cumsum(sizes - 1)])
        return [np.concatenate([seeded[i : i + 1], rest[bounds[i] : bounds[i + 1]]]) for i in range(b)]

    def __iter__(self):
        groups = self.groups()  # drawn now, in the caller's thread, right after its per-epoch reseed
        return (self.batch(c) for c in groups)

    def batch(self, clusters: np.ndarray) -> Batch:
        sub = self.csc.build(clusters)
        seeds, rows = seed_rows(sub.nodes, self.is_seed)
        return Batch(torch.from_numpy(sub.nodes), seeds, subgraph=sub.to_dgl(), output_rows=rows)


def build(cfg, num_layers: int, fanouts=None) -> ClusterGcnSampler:
    """Factory (sampling.SAMPLERS): checks the options; the partition is read by prepare()."""
    if int(cfg.num_parts) < 0:
        raise ConfigError(
            f"sampler.num_parts={cfg.num_parts} is negative",
            "use a part count, or 0 for about one per 1,000 nodes",
        )
    if int(cfg.get("nodes_per_part", 0)) < 0:
        raise ConfigError(
            f"sampler.nodes_per_part={cfg.nodes_per_part} is negative",
            "use a cluster size, e.g. sampler.nodes_per_part=100, or 0 for the default",
        )
    if cfg.method not in METHODS:
        raise ConfigError(
            f"sampler.method={cfg.method!r} is not known", f"choose one of {', '.join(METHODS)}"
        )
    if int(cfg.clusters_per_batch) < 1:
        raise ConfigError(
            f"sampler.clusters_per_batch={cfg.clusters_per_batch} must be at least 1",
            "use e.g. sampler.clusters_per_batch=20",
        )
    return ClusterGcnSampler(
        int(cfg.num_parts), str(cfg.method), int(cfg.clusters_per_batch), int(cfg.get("nodes_per_part", 0))
    )
