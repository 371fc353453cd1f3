"""The second stage of `recommend`: score each query's candidates with the checkpoint's own pair decoder,
so the list is the model's ranking and not only the inner product's.

A link model trained with task.pair_features adds a learned term of the pair's common-neighbour counts to
the inner product (decoder=dot), or reads them beside a * b (decoder=mlp); an mlp decoder without counts
scores a * b alone. None of that is an inner product a faiss index can search, so the index proposes
candidates (its top `candidates`, plus friends of friends: recommend/fof.py) and this scores them exactly
as tasks/link.LinkPrediction.pair_scores scored pairs in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import ConfigError
from gnnscale.models.checkpoint import LINK_DECODER, read_checkpoint
from gnnscale.tasks.link import CountHead, PairMLP
from gnnscale.tasks.pair_features import PAIR_FEATURES, encode

RERANK = ("auto", "on", "off")


@dataclass
class PairDecoder:
    kind: str  # dot+counts | mlp
    module: torch.nn.Module
    counts: bool  # reads the pair counts (tasks/pair_features.py)

    @torch.no_grad()
    def pair_counts(self, structure, u: torch.Tensor, v: torch.Tensor) -> np.ndarray:
        """The raw counts [P, 4 (+1)] this decoder reads for the pairs (u[i], v[i])."""
        if self.kind == "mlp":
            return structure.pairs(u, v).numpy()
        return self.module.pair_counts(structure, u, v).numpy()

    @torch.no_grad()
    def scores(self, hu: np.ndarray, hc: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """float32 [B, C]: query rows hu [B, d] against their candidates hc [B, C, d] (raw counts
        [B, C, 4 (+1)] when the decoder reads them)."""
        a, b = torch.from_numpy(np.ascontiguousarray(hu, np.float32)), torch.from_numpy(hc.astype(np.float32))
        x = None if counts is None else encode(torch.from_numpy(counts))
        if self.kind == "mlp":
            return self.module(a[:, None, :] * b, x).numpy()
        return ((a[:, None, :] * b).sum(-1) + self.module(x)).numpy()


def load_pair_decoder(ckpt: str | Path, width: int) -> PairDecoder | None:
    """The pair decoder stored beside the GNN in a task=link checkpoint (models/checkpoint.LINK_DECODER);
    None for a plain dot-product model, whose inner product the index already ranks by."""
    state = read_checkpoint(ckpt)["model"]
    own = {k[len(LINK_DECODER) :]: v for k, v in state.items() if k.startswith(LINK_DECODER)}
    if not own:
        return None
    first = own["net.0.weight"]
    if first.shape[1] < width:  # a count head reads only the counts (and with a curve, one learned count)
        learned = any(k.startswith("curve.") for k in own)
        head = CountHead(first.shape[1] - int(learned), first.shape[0], learned=learned)
        module, kind, counts = head, "dot+counts", True
    else:
        extra = first.shape[1] - width
        if extra not in (0, len(PAIR_FEATURES)):
            raise ConfigError(
                f"checkpoint {ckpt}'s pair decoder reads {first.shape[1]} inputs, not {width} (+ counts)",
                "recommend from embeddings of the checkpoint's last layer, or set recommend.rerank=off",
            )
        module, kind, counts = PairMLP(width, extra), "mlp", extra > 0
    module.load_state_dict(own, strict=True)
    return PairDecoder(kind, module.eval(), counts)


def decoder_for(opts, emb_info: dict | None, width: int) -> PairDecoder | None:
    """recommend.rerank: auto re-ranks when the embeddings come from a link checkpoint's last layer that has
    a pair decoder; on insists (exit 2 when there is none); off ranks by the index's metric alone."""
    if opts.rerank not in RERANK:
        raise ConfigError(
            f"recommend.rerank={opts.rerank!r} is not known", f"choose one of {', '.join(RERANK)}"
        )
    if opts.rerank == "off":
        return None
    info = emb_info or {}
    why = None
    if info.get("task") != "link" or not info.get("ckpt"):
        why = "the embeddings do not come from a task=link checkpoint (no emb_info.json naming one)"
    elif int(info.get("layer", -1)) != int(info.get("num_layers", -2)):
        why = f"the embeddings are layer {info.get('layer')}, not the last layer the decoder scores"
    elif not Path(info["ckpt"]).is_file():
        why = f"their checkpoint {info['ckpt']} is gone"
    if why is None:
        decoder = load_pair_decoder(info["ckpt"], width)
        if decoder is not None or opts.rerank == "auto":
            return decoder
        why = f"checkpoint {info['ckpt']} has no pair decoder (task.decoder=dot without task.pair_features)"
    if opts.rerank == "on":
        raise ConfigError(f"recommend.rerank=on but {why}", "set recommend.rerank=auto or off")
    return None


SCORE_BYTES = 64 << 20  # candidates' embedding rows gathered per scoring step


class SecondStage:
    """Each query's candidates: the index's, then its friends of friends, each once (not the query, not a
    neighbour: both lists already leave those out), scored by the decoder; the best k kept."""

    def __init__(self, emb, decoder: PairDecoder, structure, fof, k: int, *, fof_k: int, order=None):
        self.emb, self.decoder, self.structure, self.fof = emb, decoder, structure, fof
        self.k, self.fof_k = int(k), int(fof_k)
        self.order = None if order is None or order.identity else order

    def rank(self, nodes: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids int64 [rows, k], the decoder's scores float32 [rows, k], the friends of friends asked
        [rows, fof_k]) for queries `nodes` and the index's candidates cand [rows, c] (user ids, -1 = none)."""
        fof, _ = self.fof.top(nodes, self.fof_k)
        both = np.sort(np.concatenate([cand, fof], 1), axis=1)
        valid = (both >= 0) & np.r_["1", np.ones((len(both), 1), bool), both[:, 1:] != both[:, :-1]]
        scores = np.full(both.shape, -np.inf, dtype=np.float32)
        step = max(1, SCORE_BYTES // max(1, both.shape[1] * self.emb.shape[1] * 4))
        for a in range(0, len(nodes), step):
            part = slice(a, a + step)
            scores[part] = self._scores(nodes[part], both[part], valid[part])
        order = np.argsort(-scores, axis=1, kind="stable")[:, : self.k]  # ties: the lower id first
        ids = np.take_along_axis(both, order, 1)
        top = np.take_along_axis(scores, order, 1)
        empty = ~np.isfinite(top)
        ids[empty], top[empty] = -1, np.nan
        if ids.shape[1] < self.k:  # fewer candidates than k in all
            pad = self.k - ids.shape[1]
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
            top = np.pad(top, ((0, 0), (0, pad)), constant_values=np.nan)
        return ids, top, fof

    def _scores(self, nodes: np.ndarray, cand: np.ndarray, valid: np.ndarray) -> np.ndarray:
        r, c = np.nonzero(valid)
        out = np.full(cand.shape, -np.inf, dtype=np.float32)
        if not len(r):
            return out
        hu = np.asarray(self.emb[nodes])
        ids = cand[r, c]
        uniq, back = np.unique(ids, return_inverse=True)
        rows = np.asarray(self.emb[uniq])[back]
        hc = np.zeros(cand.shape + (rows.shape[1],), dtype=np.float32)
        hc[r, c] = rows
        counts = None
        if self.decoder.counts:
            u, v = nodes[r], ids
            if self.order is not None:
                u, v = self.order.to_graph(u), self.order.to_graph(v)
            raw = self.decoder.pair_counts(self.structure, torch.from_numpy(u), torch.from_numpy(v))
            counts = np.zeros(cand.shape + (raw.shape[1],), dtype=np.float32)
            counts[r, c] = raw
        s = self.decoder.scores(hu, hc, counts)
        out[r, c] = s[r, c]
        return out
