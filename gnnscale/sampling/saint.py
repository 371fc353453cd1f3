"""`sampler=saint`: GraphSAINT (Zeng et al., ICLR 2020) — random subgraphs with unbiased normalisation.

Each batch is the subgraph induced by a random node set (sampling/induced.py), drawn in one of three modes:

- node: `budget` draws (with replacement) of nodes with probability ∝ `node_prob`: colnorm (default) =
  ||Ã[:, u]||², the squared column norm of the in-degree-normalised adjacency, Σ_{u→v} 1/deg_in(v)² — the
  paper's node sampler (a node without out-edges gets the smallest positive value, so every node can be
  drawn); degree = the in-degree (at least 1), as DGL's SAINTSampler; uniform.
- edge: `budget` draws of edges u→v with probability ∝ 1/deg_out(u) + 1/deg_in(v) (degrees at least 1);
  the node set is their endpoints.
- walk: `budget` roots drawn uniformly from all nodes, each walking `walk_length` steps to a uniformly
  drawn in-neighbour (a walk stops at a node without one); the node set is every node visited.

The seeds of a batch are the training nodes among its nodes (a draw without any is drawn again). Draws
come from numpy's global RNG, reseeded per epoch by the trainer. An epoch has `batches_per_epoch` batches;
0 = ceil(training nodes / expected training nodes per subgraph), so the epoch covers them about once.

Normalisation (`normalize`, the paper's section 3.2; DGL's SAINTSampler has none). `prepare` pre-samples
P subgraphs with its own RNG (seeded by the run's seed, independent of the epochs' draws) and counts how
often each node (C_v) and each edge (C_uv) appears in them. P = `num_presample`, or with 0 GraphSAINT's
own rule: as many as it takes for the subgraphs to hold 50 times as many nodes as the graph (every node
drawn 50 times on average; the sampling work of about 50 epochs, without the model's). The estimates need
that many: 1/α_uv of a rarely co-sampled edge is badly estimated from a handful of draws, and the error
turns into bias (the harder graph below, walk mode, 2,000 roots: 50 subgraphs left a 13% median relative
bias in the aggregated neighbour mean, the rule's 233 about 5%, 1,000 under 4%, near the measurement's own
noise). With p_v = C_v / P the probability that v is in a subgraph:

- loss: seed v's loss is weighted w_v = p̄ / p_v, p̄ = the mean of p over the training nodes. The node
  task averages per-seed losses over the batch's seeds, so E[Σ_{v∈S∩T} w_v L_v] / E|S∩T|
  = (p̄ Σ_T L_v) / (|T| p̄) = the mean training loss: every training node counts equally, however often
  it is sampled.
- aggregation: α_uv = C_uv / C_v estimates P(u in the subgraph | v in it). Subgraph edge u→v gets the
  weight  EDGE_WEIGHT[u→v] = d_sub(v) / (deg_full(v) · α_uv)  (models/__init__.py EDGE_WEIGHT).
  SAGEConv's mean divides the weighted sum by the subgraph in-degree d_sub(v), so node v receives
  Σ_{u∈N_sub(v)} h_u / (deg_full(v) α_uv), whose expectation given v is sampled is
  (1 / deg_full(v)) Σ_{u∈N(v)} h_u: the full graph's neighbour mean. (With GraphConv or SAGEConv's gcn
  aggregator, whose normalisations differ, it is the same rescaling of each message, not exactly unbiased.)

Nodes or edges never seen in pre-sampling count 1 (p_v = 1/P, α_uv = 1/C_v). `normalize=false` turns both
off (plain induced subgraphs, as DGL's SAINTSampler). The counts are cached in the run's sampler folder
(saint_norm.npz, keyed by mode, budget, walk_length, node_prob, num_presample, seed and the graph), so a
resumed run reuses them.

The normalised aggregation is unbiased but not always better: the plain subgraph mean is itself a (ratio)
estimate of the neighbour mean, slightly biased but with a third to half the spread. Measured (best
validation loss over 30 epochs, +exp=saint, 20k-node synthetic graphs with power-law degrees, exponent
2.1, seeds 0-1): with the default features and homophily (98% accuracy) normalising lowers it a little in
walk and edge mode (0.059 vs 0.061, 0.061 vs 0.063) and raises it in node mode (0.080 vs 0.064); with
faint features and homophily 0.5 (data.feature_signal=0.1 data.homophily=0.5) it raises it in every mode
(walk 1.25 vs 1.06, edge 1.21 vs 1.11, node 1.58 vs 1.04). On Cora the two are even (test accuracy 0.819
vs 0.817).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.models import EDGE_WEIGHT
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.induced import Induced, InducedBuilder, seed_mask, seed_rows

MODES = ("node", "edge", "walk")
NODE_PROBS = ("colnorm", "degree", "uniform")  # node mode: what a node's draw probability is ∝ to
CACHE_FILE = "saint_norm.npz"
COVERAGE = 50  # num_presample 0: pre-sample until the subgraphs hold this many times the graph's nodes
_MAX_DRAWS = 100  # draws of one batch before giving up on finding a training node
_PRESAMPLE_STREAM = 0x5A1  # the pre-sampling RNG: default_rng([seed, this])


class SaintSampler:
    per_batch_subgraphs = True  # build_loader may hand them on as blocks over what the loss reads

    def __init__(
        self,
        mode: str = "node",
        budget: int = 6000,
        walk_length: int = 2,
        num_presample: int = 0,
        normalize: bool = True,
        batches_per_epoch: int = 0,
        node_prob: str = "colnorm",
    ):
        self.mode, self.budget, self.walk_length = mode, int(budget), int(walk_length)
        self.num_presample, self.normalize = int(num_presample), bool(normalize)
        self.batches_per_epoch = int(batches_per_epoch)
        self.node_prob = str(node_prob)
        self._of = None  # the DGL graph the tables below were made for
        self.builder: InducedBuilder | None = None
        self.node_counts: np.ndarray | None = None  # C_v over the pre-sampled subgraphs
        self.edge_counts: np.ndarray | None = None  # C_uv, by the full graph's CSC edge position
        self.loss_weight: np.ndarray | None = None  # w_v per node (float32)
        self.edge_scale: np.ndarray | None = None  # 1 / (deg_full(v) α_uv) per full-graph edge (float32)
        self.presampled = 0  # P: the subgraphs the counts come from
        self.expected_seeds = 0.0  # training nodes per subgraph, on average over the pre-sampled ones

    # ------------------------------------------------------------ drawing node sets
    def _setup(self, g) -> None:
        if self._of is g:
            return
        self.builder = b = InducedBuilder.of(g)
        self.n = b.n
        self.deg_in = b.in_degrees()
        self._cdf = None
        if self.mode in ("node", "edge") and len(b.indices) == 0:
            raise DataError(f"sampler.mode={self.mode} needs edges and the graph has none", "use mode=walk")
        if self.mode == "node":
            self._cdf = np.cumsum(self._node_weights(b))
        elif self.mode == "edge":
            deg_out = np.maximum(np.bincount(b.indices, minlength=self.n), 1).astype(np.float64)
            inv_in = 1.0 / np.maximum(self.deg_in, 1).astype(np.float64)
            self._cdf = np.cumsum(1.0 / deg_out[b.indices] + np.repeat(inv_in, self.deg_in))
        self._of = g

    def _node_weights(self, b: InducedBuilder) -> np.ndarray:
        if self.node_prob == "uniform":
            return np.ones(self.n)
        if self.node_prob == "degree":
            return np.maximum(self.deg_in, 1).astype(np.float64)
        inv2 = 1.0 / np.maximum(self.deg_in, 1).astype(np.float64) ** 2
        colnorm = np.bincount(b.indices, weights=np.repeat(inv2, self.deg_in), minlength=self.n)
        colnorm[colnorm == 0] = colnorm[colnorm > 0].min()
        return colnorm

    def _pick(self, rng, k: int) -> np.ndarray:
        """k draws from the mode's distribution over nodes (node) or CSC edge positions (edge)."""
        cdf = self._cdf
        return np.minimum(np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right"), len(cdf) - 1)

    def draw(self, rng) -> np.ndarray:
        """One node set, ascending; rng: a numpy Generator or the np.random module."""
        b = self.builder
        if self.mode == "node":
            return np.unique(self._pick(rng, self.budget))
        if self.mode == "edge":
            e = self._pick(rng, self.budget)
            dst = np.searchsorted(b.indptr, e, side="right") - 1
            return np.unique(np.concatenate([b.indices[e], dst]))
        cur = np.minimum((rng.random(self.budget) * self.n).astype(np.int64), self.n - 1)
        visited = [cur]
        for _ in range(self.walk_length):
            deg = self.deg_in[cur]
            step = np.minimum((rng.random(len(cur)) * deg).astype(np.int64), np.maximum(deg - 1, 0))
            moved = deg > 0
            nxt = cur.copy()
            nxt[moved] = b.indices[b.indptr[cur[moved]] + step[moved]]
            visited.append(nxt)
            cur = nxt
        return np.unique(np.concatenate(visited))

    def sample(self, rng, is_seed: np.ndarray) -> tuple[Induced, torch.Tensor, torch.Tensor]:
        """(subgraph with its full-graph edge ids, seeds, output_rows): a draw holding a training node."""
        for _ in range(_MAX_DRAWS):
            nodes = self.draw(rng)
            seeds, rows = seed_rows(nodes, is_seed)
            if len(seeds):
                return self.builder.build(nodes, with_edge_ids=True), seeds, rows
        raise ConfigError(
            f"{_MAX_DRAWS} GraphSAINT subgraphs in a row held no training node",
            "raise sampler.budget (or sampler.walk_length in walk mode)",
        )

    # ------------------------------------------------------------ normalisation
    def prepare(self, ctx) -> None:
        """Pre-sample (or read from ctx.cache_dir) the node and edge counts; derive the coefficients."""
        self._setup(ctx.g)
        is_seed = seed_mask(self.n, ctx.train_ids)
        if not self.normalize and self.batches_per_epoch > 0:
            return
        key = self._cache_key(ctx.seed, is_seed)
        path = Path(ctx.cache_dir) / CACHE_FILE if ctx.cache_dir is not None else None
        counts = _read_counts(path, key) if path is not None else None
        if counts is None:
            counts = self.presample(np.random.default_rng([int(ctx.seed), _PRESAMPLE_STREAM]), is_seed)
            if path is not None:
                _write_counts(path, key, *counts)
        self.use_counts(*counts, is_seed)

    def presample(self, rng, is_seed: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(C_v, C_uv, P): appearances of every node and edge in P pre-sampled subgraphs, P = num_presample
        or, with 0, enough subgraphs to hold COVERAGE times the graph's nodes."""
        node_counts = np.zeros(self.n, dtype=np.int32)
        edge_counts = np.zeros(len(self.builder.indices), dtype=np.int32)
        drawn = held = 0  # subgraphs drawn, nodes they held

        def more() -> bool:
            return drawn < self.num_presample if self.num_presample else held < COVERAGE * self.n

        while more():
            sub, _, _ = self.sample(rng, is_seed)
            node_counts[sub.nodes] += 1  # each node and edge once per subgraph: no repeated indices
            edge_counts[sub.edge_ids] += 1
            drawn, held = drawn + 1, held + len(sub.nodes)
        return node_counts, edge_counts, drawn

    def use_counts(
        self, node_counts: np.ndarray, edge_counts: np.ndarray, presampled: int, is_seed: np.ndarray
    ) -> None:
        """The coefficients from the counts over `presampled` subgraphs (see the module docstring)."""
        self.node_counts, self.edge_counts, self.presampled = node_counts, edge_counts, int(presampled)
        self.expected_seeds = float(node_counts[is_seed].sum()) / self.presampled
        cv = np.maximum(node_counts, 1).astype(np.float64)
        p = cv / self.presampled
        self.loss_weight = (p[is_seed].mean() / p).astype(np.float32)
        deg = np.maximum(self.deg_in, 1).astype(np.float64)
        # 1 / (deg_full(v) α_uv) = C_v / (deg_full(v) C_uv), for each edge u->v (grouped by v in the CSC)
        per_dst = np.repeat(cv / deg, self.deg_in)
        self.edge_scale = (per_dst / np.maximum(edge_counts, 1)).astype(np.float32)

    def _cache_key(self, seed: int, is_seed: np.ndarray) -> str:
        return json.dumps(
            {
                "mode": self.mode,
                "budget": self.budget,
                "walk_length": self.walk_length if self.mode == "walk" else None,
                "node_prob": self.node_prob if self.mode == "node" else None,
                "num_presample": self.num_presample or f"coverage {COVERAGE}",
                "seed": int(seed),
                "num_nodes": int(self.n),
                "num_edges": int(len(self.builder.indices)),
                "train": hashlib.sha256(np.packbits(is_seed).tobytes()).hexdigest()[:16],
            },
            sort_keys=True,
        )

    # ------------------------------------------------------------ batches
    def num_batches(self, num_seeds: int) -> int:
        if self.batches_per_epoch > 0:
            return self.batches_per_epoch
        if num_seeds == 0:
            return 0
        return max(1, math.ceil(num_seeds / max(self.expected_seeds, 1e-9)))

    def loader(self, g, seeds, batch_size=None, shuffle=True, num_workers=0, drop_last=False):
        """This epoch's subgraphs (batch_size, shuffle, num_workers and drop_last do not apply: the budget
        sets the batch, every batch is a random draw, sampling runs in this process)."""
        self._setup(g)
        if self.batches_per_epoch == 0 and self.node_counts is None:
            raise DataError("saint has not pre-sampled yet", "call prepare(ctx) first")
        if self.normalize and self.loss_weight is None:
            raise DataError("saint has no normalisation coefficients yet", "call prepare(ctx) first")
        is_seed = seed_mask(self.n, seeds)
        return SaintLoader(self, is_seed, self.num_batches(int(is_seed.sum())))

    def batch(self, rng, is_seed: np.ndarray) -> Batch:
        sub, seeds, rows = self.sample(rng, is_seed)
        sg = sub.to_dgl()
        loss_weight = None
        if self.normalize:
            d_sub = sub.in_degrees()
            weight = self.edge_scale[sub.edge_ids] * np.repeat(d_sub, d_sub).astype(np.float32)
            sg.edata[EDGE_WEIGHT] = torch.from_numpy(weight)
            loss_weight = torch.from_numpy(self.loss_weight[seeds.numpy()])
        return Batch(
            torch.from_numpy(sub.nodes), seeds, subgraph=sg, output_rows=rows, loss_weight=loss_weight
        )


class SaintLoader:
    def __init__(self, sampler: SaintSampler, is_seed: np.ndarray, num_batches: int):
        self.sampler, self.is_seed, self.num_batches = sampler, is_seed, num_batches

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        return (self.sampler.batch(np.random, self.is_seed) for _ in range(self.num_batches))


def _read_counts(path: Path, key: str) -> tuple[np.ndarray, np.ndarray, int] | None:
    try:
        with np.load(path) as z:
            if str(z["key"]) != key:
                return None
            return z["node_counts"], z["edge_counts"], int(z["presampled"])
    except (OSError, ValueError, KeyError):
        return None


def _write_counts(path: Path, key: str, node_counts: np.ndarray, edge_counts: np.ndarray, presampled: int):
    from gnnscale.utils.atomic import atomic_path

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                key=np.array(key),
                node_counts=node_counts,
                edge_counts=edge_counts,
                presampled=np.array(presampled),
            )


def build(cfg, num_layers: int, fanouts=None) -> SaintSampler:
    """Factory (sampling.SAMPLERS): checks the options; pre-sampling happens in prepare()."""
    if cfg.mode not in MODES:
        raise ConfigError(f"sampler.mode={cfg.mode!r} is not known", f"choose one of {', '.join(MODES)}")
    node_prob = str(cfg.get("node_prob", "colnorm"))
    if node_prob not in NODE_PROBS:
        raise ConfigError(
            f"sampler.node_prob={node_prob!r} is not known", f"choose one of {', '.join(NODE_PROBS)}"
        )
    checks = (
        ("budget", int(cfg.budget) >= 1, "use e.g. sampler.budget=6000"),
        ("walk_length", int(cfg.walk_length) >= 0, "use e.g. sampler.walk_length=2"),
        ("num_presample", int(cfg.num_presample) >= 0, "use 0 for GraphSAINT's rule, or a count"),
        ("batches_per_epoch", int(cfg.batches_per_epoch) >= 0, "use 0 to cover the training nodes once"),
    )
    for name, ok, hint in checks:
        if not ok:
            raise ConfigError(f"sampler.{name}={cfg.get(name)} is out of range", hint)
    return SaintSampler(
        str(cfg.mode),
        int(cfg.budget),
        int(cfg.walk_length),
        int(cfg.num_presample),
        bool(cfg.normalize),
        int(cfg.batches_per_epoch),
        node_prob,
    )
