"""Edge-prediction batches (`task=link`): positive edges, sampled negatives, and a neighbourhood that
cannot see the edges it is asked to predict.

Training (`LinkLoader`): a batch is `batch_size` training edges (shuffled by torch's RNG, which the
trainer reseeds per epoch), `num_negatives` corrupted destinations per edge, and the neighbourhood of
every endpoint drawn by the formation's own block sampler with `exclude_eids` = the batch's edges and
their reverses. This is what DGL's `as_edge_prediction_sampler(exclude="reverse_id")` does; it is done
here over gnnscale's samplers (their deterministic block relabelling and the mmap'd CSC-only graph,
which DGL's edge DataLoader would convert to COO) so seeded runs repeat and resume exactly.
Cluster-GCN (`ClusterLinkLoader`): a batch is a cluster subgraph; `target_fraction` of its edges are
the targets and are removed (both directions) from the subgraph every layer runs on; negatives are
nodes of the same subgraph (the only ones with embeddings).

Evaluation (`LinkEvalLoader`): each val / test positive (u, v) is ranked against (u, n) for `eval_negatives`
nodes n drawn once per batch from a generator seeded by (seed, split, batch) — the same negatives in every
epoch and process (OGB's protocol: raw, no filtering) — or all nodes when eval_negatives is 0 or at least
the node count. Against all nodes the ranking is filtered (`KnownEdges`, the standard protocol since
Bordes et al., 2013): u itself and u's other known edges — the training (message-passing) edges, the val
edges, and for test also the test edges — are not negatives, so ranking another true partner above v
costs nothing. Val is filtered without the test edges, which model selection must not see.

Negative samplers never return the positive pair itself: a draw equal to the positive's destination is
redrawn (and, past a few rounds, moved to the next node id).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gnnscale.errors import ConfigError
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.two_hop import TwoHopNegatives
from gnnscale.storage.csc import rows_edges

LINK_FORMATIONS = ("neighbor", "labor", "cluster_gcn")
POSITIVES = ("edges", "random_walk")
NEGATIVE_SAMPLERS = ("uniform", "degree")


def check_link_sampler(kind: str) -> None:
    if kind not in LINK_FORMATIONS:
        raise ConfigError(
            f"task=link does not support sampler={kind}",
            f"choose one of sampler={'|'.join(LINK_FORMATIONS)}",
        )


class NegativeSampler:
    """Destinations for corrupted pairs (u, n): uniform over the nodes, or by degree^0.75 (word2vec, PinSAGE);
    with `two_hop` (sampling/two_hop.py), each negative is with probability `hard` a friend of a friend of u
    instead. Draws from torch's global RNG (reseeded per epoch by the trainer)."""

    def __init__(
        self,
        kind: str,
        num_nodes: int,
        degree: np.ndarray | None = None,
        *,
        hard: float = 0.0,
        two_hop: TwoHopNegatives | None = None,
    ):
        if kind not in NEGATIVE_SAMPLERS:
            raise ConfigError(
                f"task.negative_sampler={kind!r} is not known",
                f"choose one of {', '.join(NEGATIVE_SAMPLERS)}",
            )
        self.kind, self.n = kind, int(num_nodes)
        self.weights = None
        if kind == "degree":
            self.weights = torch.from_numpy(np.asarray(degree, dtype=np.float64) ** 0.75)
            if float(self.weights.sum()) <= 0:
                self.weights = None  # no edges: uniform
        self.hard, self.two_hop = float(hard), two_hop

    def draw(self, count: int) -> torch.Tensor:
        if self.weights is None:
            return torch.randint(0, self.n, (count,), dtype=torch.int64)
        return torch.multinomial(self.weights, count, replacement=True)

    def sample(self, dst: torch.Tensor, k: int, src: torch.Tensor | None = None) -> torch.Tensor:
        """k negatives per positive (src[i], dst[i]), [len(dst) * k], positive i's at [i*k, (i+1)*k); never
        dst[i] itself."""
        want = dst.repeat_interleave(k)
        neg = self.draw(len(want))
        if self.two_hop is not None and self.hard > 0 and src is not None:
            slot = torch.rand(len(want)) < self.hard
            far = self.two_hop.draw(src.repeat_interleave(k)[slot])
            found = far >= 0  # elsewhere (no friend of a friend) the uniform draw stays
            neg[slot.nonzero(as_tuple=True)[0][found]] = far[found]
        return avoid(neg, want, self.n, self.draw)


def avoid(neg: torch.Tensor, positive: torch.Tensor, n: int, draw, rounds: int = 4) -> torch.Tensor:
    """neg with every entry equal to `positive` (same position) redrawn; after `rounds`, shifted by one."""
    if n < 2:
        raise ConfigError("a graph with fewer than 2 nodes has no negative pairs", "use a larger graph")
    for _ in range(rounds):
        bad = neg == positive
        if not bool(bad.any()):
            return neg
        neg[bad] = draw(int(bad.sum()))
    bad = neg == positive
    neg[bad] = (neg[bad] + 1) % n
    return neg


def _block_batch(g, sampler, u, v, neg, *, k: int, exclude=None) -> Batch:
    """Positives (u, v) and their k negatives each, over the block sampler's neighbourhood of every endpoint."""
    seeds, inverse = torch.unique(torch.cat([u, v, neg]), return_inverse=True)
    input_nodes, _, blocks = sampler.sample_blocks(g, seeds, exclude_eids=exclude)
    b = len(u)
    lu, lv, ln = inverse[:b], inverse[b : 2 * b], inverse[2 * b :]
    pos, negp = torch.stack([lu, lv]), torch.stack([lu.repeat_interleave(k), ln])
    return Batch(torch.as_tensor(input_nodes), seeds, blocks=blocks, pos_pairs=pos, neg_pairs=negp)


class LinkLoader:
    """One epoch of edge batches over a block sampler (neighbor, labor)."""

    def __init__(
        self, g, split, sampler, batch_size: int, negatives: NegativeSampler, *, k: int, shuffle=True
    ):
        self.g, self.sampler, self.batch_size = g, sampler, int(batch_size)
        self.negatives, self.k, self.shuffle = negatives, int(k), shuffle
        self.eids = torch.from_numpy(np.asarray(split.train_eids))
        self.reverse = torch.from_numpy(np.asarray(split.reverse_eids))
        self.src = torch.from_numpy(np.asarray(split.indices))  # int32 or int64, as the split stores it
        self.dst = torch.from_numpy(split.edge_dst())

    def __len__(self) -> int:
        return math.ceil(len(self.eids) / self.batch_size)

    def __iter__(self):
        # Drawn now, in the caller's thread, right after its per-epoch reseed.
        order = torch.randperm(len(self.eids)) if self.shuffle else torch.arange(len(self.eids))
        for lo in range(0, len(order), self.batch_size):
            yield self.batch(self.eids[order[lo : lo + self.batch_size]])

    def batch(self, eids: torch.Tensor) -> Batch:
        u, v = self.src[eids].to(torch.int64), self.dst[eids]
        neg = self.negatives.sample(v, self.k, u)
        rev = self.reverse[eids]
        exclude = torch.cat([eids, rev[rev >= 0]])  # the targets and their reverses: invisible to the batch
        return _block_batch(self.g, self.sampler, u, v, neg, k=self.k, exclude=exclude)


class WalkLinkLoader:
    """Unsupervised GraphSAGE (Hamilton et al., 2017): positives are (u, v) with v met on a short random walk
    from u (`walk_length` steps, one position drawn per walk), negatives from the negative sampler; no labels
    and no target edges (a walk's pairs are co-occurrences, not edges to predict). Walks are DGL's
    (`dgl.sampling.random_walk`, its RNG reseeded per epoch by the trainer) over the message-passing graph's
    in-edges read as out-edges (the same arrays: for an undirected graph, the same graph)."""

    def __init__(
        self, g, split, sampler, batch_size: int, negatives: NegativeSampler, *, k: int, walk_length: int
    ):
        from gnnscale.sampling.graph import adj_to_dgl

        if int(walk_length) < 1:
            raise ConfigError(
                f"task.walk_length={walk_length} must be at least 1", "use e.g. task.walk_length=5"
            )
        self.g, self.sampler, self.batch_size = g, sampler, int(batch_size)
        self.negatives, self.k, self.length = negatives, int(k), int(walk_length)
        indptr, indices = np.asarray(split.indptr), np.asarray(split.indices)
        self.walk_g = adj_to_dgl("csr", indptr.copy(), indices.copy(), split.num_nodes)
        self.starts = torch.from_numpy(np.flatnonzero(np.diff(indptr) > 0))  # nodes with a neighbour

    def __len__(self) -> int:
        return math.ceil(len(self.starts) / self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.starts))  # drawn right after the per-epoch reseed
        for lo in range(0, len(order), self.batch_size):
            yield self.batch(self.starts[order[lo : lo + self.batch_size]])

    def batch(self, u: torch.Tensor) -> Batch:
        import dgl

        traces, _ = dgl.sampling.random_walk(self.walk_g, u.to(self.walk_g.idtype), length=self.length)
        pick = torch.randint(1, self.length + 1, (len(u),))
        v = traces[torch.arange(len(u)), pick].to(torch.int64)
        ok = (v >= 0) & (v != u)  # a walk stuck at a dead end, or back at its start: no pair
        u, v = u[ok], v[ok]
        return _block_batch(self.g, self.sampler, u, v, self.negatives.sample(v, self.k, u), k=self.k)


class ClusterLinkLoader:
    """Cluster-GCN for edges: each cluster batch's subgraph, its target edges removed from it."""

    def __init__(self, g, split, sampler, k: int, target_fraction: float, shuffle=True):
        self.k, self.fraction = int(k), float(target_fraction)
        if not 0.0 < self.fraction < 1.0:
            raise ConfigError(
                f"task.target_fraction={target_fraction} is outside (0, 1)",
                "use e.g. task.target_fraction=0.3",
            )
        self.directed = split.directed
        self.inner = sampler.loader(g, torch.arange(g.num_nodes()), shuffle=shuffle)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        groups = self.inner.groups()  # drawn right after the per-epoch reseed (numpy's global RNG)
        return (self.batch(c) for c in groups)

    def batch(self, clusters) -> Batch:
        import dgl

        sub = self.inner.csc.build(clusters)
        n = len(sub.nodes)
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(sub.indptr))
        src = np.asarray(sub.indices, dtype=np.int64)
        canonical = (src <= dst) if not self.directed else np.ones(len(src), bool)
        target = canonical & (torch.rand(len(src)).numpy() < self.fraction)
        if not target.any() and canonical.any():
            target[np.flatnonzero(canonical)[0]] = True  # every batch has at least one target
        drop = np.zeros(len(src), bool)
        drop[target] = True
        if not self.directed:  # and each target's reverse
            keys = dst * n + src
            rev = np.searchsorted(keys, src[target] * n + dst[target])
            drop[rev[rev < len(keys)]] = True
        keep = ~drop
        graph = dgl.graph((torch.from_numpy(src[keep]), torch.from_numpy(dst[keep])), num_nodes=n)
        u, v = torch.from_numpy(src[target]), torch.from_numpy(dst[target])
        neg = NegativeSampler("uniform", n).sample(v, self.k)  # nodes of this subgraph
        pos = torch.stack([u, v])
        negp = torch.stack([u.repeat_interleave(self.k), neg])
        nodes = torch.from_numpy(sub.nodes)
        return Batch(nodes, nodes, subgraph=graph, pos_pairs=pos, neg_pairs=negp)


class KnownEdges:
    """The filter of filtered ranking: every known edge (u, x), grouped by source u (a CSR over the pairs)."""

    def __init__(self, num_nodes: int, src: np.ndarray, dst: np.ndarray):
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        order = np.argsort(src, kind="stable")
        self.dst = dst[order]
        self.ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=num_nodes))]).astype(np.int64)

    @classmethod
    def of_split(cls, split, parts: tuple[str, ...]) -> "KnownEdges":
        """The message-passing (training) edges plus the held-out pairs of `parts` ("val", "test"), with
        their reverses on an undirected graph (the message-passing CSC already holds both directions)."""
        src, dst = [np.asarray(split.indices, dtype=np.int64)], [split.edge_dst()]
        for part in parts:
            pairs = np.asarray(getattr(split, part), dtype=np.int64)
            src.append(pairs[0])
            dst.append(pairs[1])
            if not split.directed:
                src.append(pairs[1])
                dst.append(pairs[0])
        return cls(split.num_nodes, np.concatenate(src), np.concatenate(dst))

    def of(self, sources: torch.Tensor) -> torch.Tensor:
        """[2, K] (i, x): x is sources[i] itself or a known partner of it (the target among them)."""
        src = sources.to(torch.int64).numpy()
        pos, owner = rows_edges(self.ptr, src)
        rows = np.concatenate([owner, np.arange(len(src))])
        return torch.from_numpy(np.stack([rows, np.concatenate([self.dst[pos], src])]))


class LinkEvalLoader:
    """Val / test pairs in batches, each with its shared, seeded negatives (all nodes: filtered by `known`)."""

    def __init__(
        self,
        g,
        pairs: np.ndarray,
        sampler,
        batch_size: int,
        num_negatives: int,
        seed: int,
        code: int,
        known: KnownEdges | None = None,
    ):
        self.g, self.sampler, self.batch_size = g, sampler, max(1, int(batch_size))
        self.pairs = torch.from_numpy(np.ascontiguousarray(pairs, dtype=np.int64))
        self.n = g.num_nodes()
        self.e = int(num_negatives)
        self.seed, self.code = int(seed), int(code)
        self.known = known if self.all_nodes else None

    @property
    def all_nodes(self) -> bool:
        return self.e <= 0 or self.e >= self.n

    def __len__(self) -> int:
        return math.ceil(self.pairs.shape[1] / self.batch_size)

    def negatives(self, index: int) -> torch.Tensor:
        if self.all_nodes:
            return torch.arange(self.n)
        rng = np.random.default_rng([self.seed, self.code, index])
        return torch.from_numpy(np.sort(rng.choice(self.n, self.e, replace=False)).astype(np.int64))

    def __iter__(self):
        for i, lo in enumerate(range(0, self.pairs.shape[1], self.batch_size)):
            pos = self.pairs[:, lo : lo + self.batch_size]
            neg = self.negatives(i)
            b = pos.shape[1]
            seeds, inverse = torch.unique(torch.cat([pos[0], pos[1], neg]), return_inverse=True)
            input_nodes, _, blocks = self.sampler.sample_blocks(self.g, seeds)
            yield Batch(
                torch.as_tensor(input_nodes),
                seeds,
                blocks=blocks,
                pos_pairs=torch.stack([inverse[:b], inverse[b : 2 * b]]),
                neg_dst=inverse[2 * b :],
                # all nodes: column j of the scores is node j (negatives() is arange(n))
                neg_known=None if self.known is None else self.known.of(pos[0]),
            )
