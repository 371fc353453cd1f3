"""`task=link`: link prediction — node embeddings from the GNN, a pair decoder, a loss on positive and
negative pair scores, and ranking metrics (tasks/link_metrics.py) over held-out edges.

The model is the usual GNN whose last layer outputs `model.hidden`-wide embeddings (no class head), so
`infer` writes the embeddings as for any checkpoint. decoder=dot scores a pair by the inner product of
its embeddings; decoder=mlp by a small MLP on their elementwise product (its weights ride along in the
model's state as `link_decoder.*`). task.pair_features adds the pair's common-neighbour, Adamic–Adar,
resource-allocation and degree-product counts (tasks/pair_features.py), which two embeddings cannot express:
decoder=dot adds a small MLP of them to the inner product, decoder=mlp reads them beside a * b.
Every evaluation also ranks its positives by each of those four heuristics alone, on the same negatives,
so a report shows whether the model beats them. loss=bce: binary cross-entropy with positives 1 and negatives 0;
loss=margin: the hinge max(0, 1 - s_pos + s_neg) for each positive and each of its negatives.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gnnscale.errors import ConfigError
from gnnscale.models import build_model
from gnnscale.models.checkpoint import LINK_DECODER
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.link import POSITIVES
from gnnscale.tasks.link_metrics import check_link_metric, link_scores, ranking_scores, ranks
from gnnscale.tasks.pair_features import PAIR_FEATURES, PairStructure, encode

DECODERS = ("dot", "mlp")
LOSSES = ("bce", "margin")
_EVAL_ROWS = 256  # mlp decoder at evaluation: positives scored against all negatives this many at a time


def check_link_cfg(task_cfg) -> None:
    check_link_metric(str(task_cfg.metric))
    if int(task_cfg.num_negatives) < 1:
        raise ConfigError(
            f"task.num_negatives={task_cfg.num_negatives} must be at least 1",
            "use e.g. task.num_negatives=1 (negatives per positive edge)",
        )
    hard = float(task_cfg.get("hard_negatives", 0.0))
    if not 0.0 <= hard <= 1.0:
        raise ConfigError(
            f"task.hard_negatives={hard} is outside [0, 1]",
            "use e.g. task.hard_negatives=0.5 (the share of negatives drawn as friends of friends)",
        )
    if task_cfg.decoder not in DECODERS:
        raise ConfigError(
            f"task.decoder={task_cfg.decoder!r} is not known", f"choose one of {', '.join(DECODERS)}"
        )
    if task_cfg.loss not in LOSSES:
        raise ConfigError(f"task.loss={task_cfg.loss!r} is not known", f"choose one of {', '.join(LOSSES)}")
    if task_cfg.positives not in POSITIVES:
        raise ConfigError(
            f"task.positives={task_cfg.positives!r} is not known", f"choose one of {', '.join(POSITIVES)}"
        )
    if task_cfg.get("pair_features") and task_cfg.in_batch_negatives:
        raise ConfigError(
            "task.pair_features does not score in-batch negatives (their counts are not gathered)",
            "set task.in_batch_negatives=false or task.pair_features=false",
        )
    if task_cfg.get("learned_common") and not (task_cfg.get("pair_features") and task_cfg.decoder == "dot"):
        raise ConfigError(
            "task.learned_common adds a count to the dot decoder's pair counts",
            "set task.pair_features=true task.decoder=dot, or task.learned_common=false",
        )
    if task_cfg.in_batch_negatives and task_cfg.decoder != "dot":
        raise ConfigError(
            "task.in_batch_negatives needs task.decoder=dot",
            "set task.decoder=dot or task.in_batch_negatives=false",
        )


class PairMLP(nn.Module):
    """Scores a pair from its endpoints' elementwise product, and its `extra` structural counts if any."""

    def __init__(self, dim: int, extra: int = 0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + extra, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, h: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        if counts is not None:
            h = torch.cat([h, counts.to(h)], -1)
        return self.net(h).squeeze(-1)


class DegreeCurve(nn.Module):
    """A learned positive weight for a common neighbour from its degree (Adamic–Adar's 1 / log d and resource
    allocation's 1 / d are two fixed such curves; which one ranks best differs by graph)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, degree: torch.Tensor) -> torch.Tensor:
        return F.softplus(self.net(torch.log1p(degree.float())[:, None])).squeeze(-1)

    @torch.no_grad()
    def per_node(self, degree: np.ndarray) -> np.ndarray:
        """The weight of every node, evaluated once per distinct degree."""
        levels, back = np.unique(degree, return_inverse=True)
        return self(torch.from_numpy(levels)).numpy()[back]


class CountHead(nn.Module):
    """decoder=dot with pair counts: a small MLP of the counts added to the inner product (cheap to rank
    against many negatives: one [B, E] product plus this on [B, E, 4], where an MLP on a * b is [B, E, dim]).
    With `learned` (task.learned_common) one more count: the common neighbours summed by a DegreeCurve."""

    def __init__(self, extra: int, width: int = 32, learned: bool = False):
        super().__init__()
        self.curve = DegreeCurve() if learned else None
        self.net = nn.Sequential(nn.Linear(extra + int(learned), width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, counts: torch.Tensor) -> torch.Tensor:
        return self.net(counts).squeeze(-1)

    def pair_counts(self, structure: PairStructure, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Raw counts [P, 4 (+1)] of the pairs (u[i], v[i]) this head reads; differentiable in the curve."""
        raw = structure.pairs(u, v)
        if self.curve is None:
            return raw
        pair, w = structure.common(u, v)
        weight = self.curve(torch.from_numpy(structure.degree)[w])
        learned = torch.zeros(len(raw), dtype=weight.dtype).index_add(0, pair, weight)
        return torch.cat([raw, learned[:, None]], 1)

    def grid_counts(
        self, structure: PairStructure, u: torch.Tensor, cand: torch.Tensor, raw: torch.Tensor
    ) -> torch.Tensor:
        """Raw counts [len(u), len(cand), 4 (+1)] of every (u[i], cand[j]), given their structure.grid `raw`."""
        if self.curve is None:
            return raw
        node = self.curve.per_node(structure.degree)
        return torch.cat([raw, torch.from_numpy(structure.weighted_grid(u, cand, node))[..., None]], -1)


class LinkPrediction:
    name = "link"

    def __init__(self, task_cfg, structure: PairStructure | None = None):
        """`structure`: the message-passing graph's pair counts (the decoder's input with task.pair_features,
        and the heuristics every evaluation reports); None reports no heuristics."""
        check_link_cfg(task_cfg)
        self.pair_features = bool(task_cfg.get("pair_features", False))
        self.learned_common = bool(task_cfg.get("learned_common", False))
        if self.pair_features and structure is None:
            raise ValueError("task.pair_features needs the split's PairStructure")
        self.structure = structure
        self._heuristic_ranks: dict[str, torch.Tensor] = {}  # evaluation batch -> its CN / AA / RA / PA ranks
        self.metric = str(task_cfg.metric)
        self.decoder_kind = str(task_cfg.decoder)
        self.loss_kind = str(task_cfg.loss)
        self.k = int(task_cfg.num_negatives)
        self.in_batch = bool(task_cfg.in_batch_negatives)
        self.decoder: PairMLP | None = None
        self.count_head: CountHead | None = None
        # decoder=dot's scale: 1 (a plain inner product). Measured on Cora: 1 / sqrt(width) with lr 0.01 let
        # the embeddings collapse (loss stuck at log 2); the plain product at lr 0.005 trains steadily.
        self.scale = 1.0

    @property
    def metric_names(self) -> tuple[str, ...]:
        return (self.metric, "loss")

    def build_model(self, model_cfg, in_dim: int):
        """The GNN with an embedding head (model.hidden wide), plus the pair decoder's weights if any."""
        model = build_model(model_cfg, in_dim, int(model_cfg.hidden))
        extra = len(PAIR_FEATURES) if self.pair_features else 0
        if self.decoder_kind == "mlp":
            self.decoder = PairMLP(int(model_cfg.hidden), extra)
        elif extra:
            self.count_head = CountHead(extra, learned=self.learned_common)
        module = self.decoder if self.decoder is not None else self.count_head
        if module is not None:
            # trained, saved and restored with the GNN (models/checkpoint.LINK_DECODER: infer leaves it out)
            model.add_module(LINK_DECODER.rstrip("."), module)
        return model

    def pair_scores(
        self, h: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """decoder=dot: the inner product <a, b> (what a top-K inner-product search over the embeddings ranks by),
        plus with task.pair_features a learned term of the pair's counts; decoder=mlp: the MLP on a * b, and
        with task.pair_features the counts. `pairs` index rows of h; `ids` are those rows' global node ids
        (needed for the counts)."""
        a, b = h[pairs[0]], h[pairs[1]]
        counts = None
        if self.count_head is not None:
            counts = encode(self.count_head.pair_counts(self.structure, ids[pairs[0]], ids[pairs[1]])).to(h)
        elif self.pair_features:
            counts = encode(self.structure.pairs(ids[pairs[0]], ids[pairs[1]])).to(h)
        if self.decoder is None:
            dot = (a * b).sum(-1) * self.scale
            return dot if counts is None else dot + self.count_head(counts)
        return self.decoder(a * b, counts)

    def _scores(self, out: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        h = b.outputs(out).float()
        pos, neg = self.pair_scores(h, b.pos_pairs, b.seeds), self.pair_scores(h, b.neg_pairs, b.seeds)
        if self.in_batch and b.pos_pairs.shape[1] > 1:
            # Every source against the batch's other destinations (those equal to its own are masked).
            u, v = b.pos_pairs
            grid = h[u] @ h[v].T * self.scale
            other = v[None, :] != v[:, None]
            neg = torch.cat([neg, grid[other]])
        return pos, neg

    def loss(self, out: torch.Tensor, b: Batch) -> torch.Tensor:
        pos, neg = self._scores(out, b)
        if self.loss_kind == "margin":
            k = max(len(neg) // max(len(pos), 1), 1)
            head = pos.repeat_interleave(k)[: len(neg)]
            return F.relu(1.0 - head + neg[: len(head)]).mean()
        logits = torch.cat([pos, neg])
        target = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
        return F.binary_cross_entropy_with_logits(logits, target)

    def num_scored(self, b: Batch) -> int:
        return int(b.pos_pairs.shape[1])

    def correct(self, out: torch.Tensor, b: Batch) -> float:
        """The running train score: positives' share of pairs classified right (score > 0 vs < 0)."""
        with torch.no_grad():
            pos, neg = self._scores(out.detach(), b)
            right = (pos > 0).float().mean() + (neg < 0).float().mean()
        return float(right / 2 * len(pos))

    @torch.no_grad()
    def collect(self, out: torch.Tensor, b: Batch) -> tuple:
        """Positive scores [B], the scores against the batch's shared negatives [B, E] (the positive's own
        destination, and for filtered ranking b.neg_known, masked as NaN), and each positive's rank under
        each heuristic of PAIR_FEATURES on the same negatives [B, 4] (None without a structure), on the CPU."""
        h = out.float()
        u, v = b.pos_pairs
        pos = self.pair_scores(h, b.pos_pairs, b.seeds)
        hn = h[b.neg_dst]
        masked = (b.neg_dst[None, :] == v[:, None]).cpu()
        if b.neg_known is not None:  # known edges of each source: no negatives (filtered ranking)
            masked[b.neg_known[0].cpu(), b.neg_known[1].cpu()] = True
        key = _pairs_key(b, masked) if self.structure is not None else None
        grid = None
        if self.pair_features or (key is not None and key not in self._heuristic_ranks):
            grid = self.structure.grid(b.seeds[u], b.seeds[b.neg_dst])  # [B, E, 4] raw counts
        if self.decoder is None:
            neg = h[u] @ hn.T * self.scale
            if self.count_head is not None:
                own = self.count_head.grid_counts(self.structure, b.seeds[u], b.seeds[b.neg_dst], grid)
                neg = neg + self.count_head(encode(own).to(h))
        else:
            neg = torch.cat(
                [
                    self.decoder(
                        h[u[i : i + _EVAL_ROWS], None, :] * hn[None],
                        encode(grid[i : i + _EVAL_ROWS]) if self.pair_features else None,
                    )
                    for i in range(0, len(u), _EVAL_ROWS)
                ]
            )
        neg = neg.cpu().masked_fill(masked, float("nan"))
        if key is not None and key not in self._heuristic_ranks:
            # The same pairs and negatives every evaluation of a split (seeded): ranked once per run.
            own = self.structure.pairs(b.seeds[u], b.seeds[v])
            grid = grid.masked_fill(masked[..., None], float("nan"))
            self._heuristic_ranks[key] = torch.stack(
                [ranks(own[:, k], grid[:, :, k]) for k in range(len(PAIR_FEATURES))], 1
            )
        return pos.cpu(), neg, self._heuristic_ranks.get(key)

    def score(self, collected: list[tuple]) -> dict:
        """The model's link metrics and loss; beside them each heuristic's ranking metrics ("cn_mrr", ...: its
        ROC-AUC is not computed, as the ranks are kept per batch, not every pair's count)."""
        if not collected:
            return {self.metric: float("nan"), "loss": float("nan")}
        pos = torch.cat([c[0] for c in collected])
        neg = torch.cat([c[1] for c in collected])
        out = link_scores(pos, neg)
        valid = neg[~torch.isnan(neg)]
        logits = torch.cat([pos, valid])
        target = torch.cat([torch.ones_like(pos), torch.zeros_like(valid)])
        out["loss"] = float(F.binary_cross_entropy_with_logits(logits, target))
        if all(c[2] is not None for c in collected):
            heuristic = torch.cat([c[2] for c in collected])
            for k, name in enumerate(PAIR_FEATURES):
                out |= {f"{name}_{m}": value for m, value in ranking_scores(heuristic[:, k]).items()}
        return out


def _pairs_key(b: Batch, masked: torch.Tensor) -> str:
    """An evaluation batch's identity: its positives' and negatives' global ids and the masked pairs."""
    u, v = b.pos_pairs
    digest = hashlib.blake2b(digest_size=16)
    for t in (b.seeds[u], b.seeds[v], b.seeds[b.neg_dst], masked):
        digest.update(t.cpu().numpy().tobytes())
    return digest.hexdigest()
