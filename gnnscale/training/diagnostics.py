"""Training-health diagnostics (`train.diagnostics`, on by default): numbers in metrics.jsonl, and a
plain-language warning, once per run, when one trips.

Per epoch, from the batches as they pass (a few microseconds to a millisecond a batch):

- diag_label_tv: the largest total-variation distance between a batch's label mix and the training
  split's; diag_dominated: the share of batches whose majority class holds more than twice its split
  share (and at least half the batch). Many such batches: "batches are dominated by one class".
- diag_loss_cv, diag_grad_cv: the spread (std / mean) of the batch losses and gradient norms. High for
  three epochs in a row after the first while the loss stays large (above 30% of epoch 1's: a loss near
  zero varies by a large share of itself and is no sign of trouble): "the curve oscillates".
- diag_overlap: mean Jaccard overlap of consecutive batches' input nodes, measured on every
  OVERLAP_EVERY-th pair.

After the epoch, on a fixed sample of at most 256 validation nodes (drawn once from the run's seed by
a numpy Generator of its own: the training RNG streams are never touched, so a run with diagnostics
gives the same losses as one without):

- diag_smooth_cos: the mean cosine similarity between a node's last hidden representation and its
  neighbours'; diag_smooth_rand: the same between random pairs of the sampled nodes. Neighbours alike
  is homophily (a trained 2-layer model on Cora: 0.97, random pairs 0.74); every node alike is
  over-smoothing. Both above 0.9, the neighbours' rising for three epochs, while validation stops
  improving: "over-smoothing".

The warnings lines are also kept in the record that raised them ("diag_warnings"), so a resumed run
knows which were said and summary.json lists them all.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from gnnscale.training.loop import BatchEnd
from gnnscale.training.trainer import Callback
from gnnscale.utils.ui import info

OVERLAP_EVERY = 4  # measure the overlap of batch 4k + 1 with batch 4k + 2
PROBE_NODES = 256  # validation nodes whose smoothness is measured
PROBE_NEIGHBOURS = 5  # at most this many neighbours per node, per layer, in the probe
PROBE_MAX_ROWS = 20_000  # rows the probe's first layer may read
DOMINATED_SHARE = 0.25  # warn when at least this share of an epoch's batches is dominated by one class
# Warn when the batch losses' std exceeds LOSS_CV of their mean (or the gradient norms' GRAD_CV) ...
OSCILLATION_LOSS_CV, OSCILLATION_GRAD_CV = 0.35, 0.5
OSCILLATION_EPOCHS = 3  # ... for this many epochs in a row, counted from epoch 2 ...
OSCILLATION_LOSS_LEFT = 0.3  # ... while the epoch loss is above this share of epoch 1's
SMOOTH_COS = 0.9  # warn when the neighbour cosine exceeds this and has risen for SMOOTH_EPOCHS epochs
SMOOTH_EPOCHS = 3

RECORD_KEYS = (
    "diag_label_tv",
    "diag_dominated",
    "diag_loss_cv",
    "diag_grad_cv",
    "diag_overlap",
    "diag_smooth_cos",
    "diag_smooth_rand",
)


def _cv(values: list[float]) -> float | None:
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(vals) < 2 or abs(vals.mean()) < 1e-12:
        return None
    return float(vals.std() / abs(vals.mean()))


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 4)


def label_balance(counts: np.ndarray, split_share: np.ndarray) -> tuple[float | None, float | None]:
    """(largest TV distance to the split's label mix, share of dominated batches) over `counts`
    [batches, classes]. Batches under half the largest are left out (an epoch's remainder batch)."""
    if len(counts) == 0:
        return None, None
    sizes = counts.sum(1)
    full = counts[(sizes > 0) & (sizes >= 0.5 * sizes.max())]
    if len(full) == 0:
        return None, None
    share = full / full.sum(1, keepdims=True)
    tv = 0.5 * np.abs(share - split_share[None, :]).sum(1)
    top = share.argmax(1)
    top_share = share[np.arange(len(share)), top]
    dominated = (top_share >= 0.5) & (top_share > 2 * split_share[top])
    return float(tv.max()), float(dominated.mean())


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|a ∩ b| / |a ∪ b| of two arrays of distinct ids."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0


class SmoothingProbe:
    """Mean cosine similarity between a node's last hidden representation and its neighbours' (and a
    random sampled node's), on a fixed sample of nodes. The structure (which nodes, which neighbours)
    is drawn once, from a numpy Generator of its own, and kept: every epoch measures the same thing.

    Bounded cost: at most PROBE_NEIGHBOURS neighbours per node and layer, and the sample is halved
    until the first layer reads at most PROBE_MAX_ROWS rows (deep models on big graphs)."""

    def __init__(self, indptr, indices, nodes: torch.Tensor, num_layers: int, seed: int):
        self.indptr, self.indices = np.asarray(indptr), np.asarray(indices)
        self.hidden_layers = int(num_layers) - 1
        self.rng = np.random.default_rng([int(seed), 0x5EED])  # its own stream: no global RNG is drawn
        nodes = np.asarray(nodes, dtype=np.int64)
        # A fixed random order; the sample is a prefix of it (halved while the probe is too large).
        self.order = nodes[self.rng.permutation(len(nodes))]
        self.nodes = np.sort(self.order[:PROBE_NODES])
        self._built = None

    def _sample(self, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of dst, global neighbour id) of up to PROBE_NEIGHBOURS in-neighbours of each dst node
        (all of them when it has no more; else that many drawn at random, with replacement)."""
        start = self.indptr[dst].astype(np.int64)
        deg = self.indptr[dst + 1].astype(np.int64) - start
        rows = np.arange(len(dst))
        small = deg <= PROBE_NEIGHBOURS
        d = deg[small]
        within = np.arange(int(d.sum())) - np.repeat(np.cumsum(d) - d, d)
        big_rows = rows[~small]
        k = PROBE_NEIGHBOURS
        drawn = (self.rng.random(len(big_rows) * k) * np.repeat(deg[~small], k)).astype(np.int64)
        row = np.concatenate([np.repeat(rows[small], d), np.repeat(big_rows, k)])
        eid = np.concatenate([np.repeat(start[small], d) + within, np.repeat(start[~small], k) + drawn])
        return row, np.asarray(self.indices[eid], dtype=np.int64)

    @staticmethod
    def _relabel(first: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first followed by the ids not in it, each id's position in that list)."""
        extra = np.setdiff1d(np.unique(ids), first)
        every = np.concatenate([first, extra])
        order = np.argsort(every, kind="stable")
        return every, order[np.searchsorted(every[order], ids)]

    def _try_build(self, nodes: np.ndarray):
        import dgl

        v_rows, u = self._sample(nodes)
        keep = u != nodes[v_rows]  # a self-loop is no neighbour to compare with
        v_rows, u = v_rows[keep], u[keep]
        dst, u_rows = self._relabel(nodes, u)
        blocks = []
        for _ in range(self.hidden_layers):
            row, src = self._sample(dst)
            every, src_rows = self._relabel(dst, src)
            blocks.insert(
                0,
                dgl.create_block(  # input layer first
                    (torch.from_numpy(src_rows), torch.from_numpy(row)),
                    num_src_nodes=len(every),
                    num_dst_nodes=len(dst),
                ),
            )
            dst = every
            if len(dst) > PROBE_MAX_ROWS:
                return None
        n = len(nodes)
        partner = (np.arange(n) + 1 + self.rng.integers(0, max(n - 1, 1), n)) % n  # never the node itself
        return blocks, dst, torch.from_numpy(v_rows), torch.from_numpy(u_rows), torch.from_numpy(partner)

    def _build(self) -> None:
        n = len(self.nodes)
        while True:
            built = self._try_build(self.nodes)
            if built is not None or n <= 16:
                break
            n //= 2
            self.nodes = np.sort(self.order[:n])
        self._built = built if built is not None else ()

    @torch.no_grad()
    def measure(self, model, features) -> tuple[float | None, float | None]:
        """(mean cosine of a node's last hidden representation to its neighbours', the same to a random
        sampled node's); (None, None) for a model without a hidden layer."""
        if self.hidden_layers < 1 or len(self.nodes) < 2:
            return None, None
        if self._built is None:
            self._build()
        if not self._built or len(self._built[2]) == 0:
            return None, None
        blocks, inputs, v_rows, u_rows, partner = self._built
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            h = features.gather(torch.from_numpy(inputs)).float().to(device)
            for i, block in enumerate(blocks):
                h = model.layer_forward(i, block.to(device), h)
        finally:
            model.train(was_training)
        v_rows, u_rows, n = v_rows.to(device), u_rows.to(device), len(self.nodes)
        cos = F.cosine_similarity(h[v_rows], h[u_rows], dim=1, eps=1e-8).double()
        # Each node's mean over its neighbours, then the mean over nodes.
        per_node = torch.zeros(n, dtype=torch.float64, device=device).index_add_(0, v_rows, cos)
        count = torch.bincount(v_rows, minlength=n).double()
        has = count > 0
        rand = F.cosine_similarity(h[:n], h[partner.to(device)], dim=1, eps=1e-8).double().mean()
        return float((per_node[has] / count[has]).mean()), float(rand)


class Diagnostics(Callback):
    wants_grad_norm = True

    def __init__(
        self,
        num_classes: int,
        train_labels: torch.Tensor,
        metric: str = "acc",
        probe: SmoothingProbe | None = None,
        features=None,  # a FeatureStore, or a callable returning the current one
        say=info,
    ):
        self.num_classes, self.metric = int(num_classes), metric
        y = np.asarray(train_labels, dtype=np.int64)
        y = y[(y >= 0) & (y < self.num_classes)]
        self.split_share = np.bincount(y, minlength=self.num_classes) / max(len(y), 1)
        self.probe, self._features, self.say = probe, features, say
        self.fired: dict[str, str] = {}  # code -> the line said
        self.history: list[dict] = []  # per epoch: the diag numbers, "best", val evaluated
        self.cost_s, self.batches = 0.0, 0  # this run's time in on_batch_end, and its batches
        self._reset()

    def _reset(self) -> None:
        self.counts: list[np.ndarray] = []
        self.losses: list[float] = []
        self.grads: list[float] = []
        self.overlaps: list[float] = []
        self._prev_nodes = None
        self.epoch_cost_s = 0.0

    # ------------------------------------------------------------ hooks
    def on_resume(self, records: list[dict]) -> None:
        for r in records:
            self._remember(r)
            for code, line in (r.get("diag_warnings") or {}).items():
                self.fired.setdefault(code, line)

    def on_epoch_start(self, epoch: int, num_batches: int) -> None:
        self._reset()

    def on_batch_end(self, epoch: int, end: BatchEnd) -> None:
        t0 = time.perf_counter()
        if end.labels is not None and end.labels.dim() == 1:
            # Training seeds are labelled (load_train_data drops the rest): no filtering, no device sync.
            self.counts.append(torch.bincount(end.labels, minlength=self.num_classes).cpu().numpy())
        self.losses.append(end.loss)
        if end.grad_norm is not None:
            self.grads.append(end.grad_norm)
        if end.input_nodes is not None:
            phase = end.step % OVERLAP_EVERY  # steps count from 1: pairs (1, 2), (5, 6), ...
            if phase == 1:
                self._prev_nodes = end.input_nodes.cpu().numpy()
            elif phase == 2 and self._prev_nodes is not None:
                self.overlaps.append(jaccard(self._prev_nodes, end.input_nodes.cpu().numpy()))
                self._prev_nodes = None
        spent = time.perf_counter() - t0
        self.cost_s += spent
        self.epoch_cost_s += spent
        self.batches += 1

    def on_epoch_record(self, epoch: int, record: dict, model) -> None:
        t0 = time.perf_counter()
        counts = np.stack(self.counts) if self.counts else np.zeros((0, self.num_classes))
        tv, dominated = label_balance(counts, self.split_share)
        smooth = rand = None
        if self.probe is not None:
            features = self._features() if callable(self._features) else self._features
            smooth, rand = self.probe.measure(model, features)
        numbers = {
            "diag_label_tv": _round(tv),
            "diag_dominated": _round(dominated),
            "diag_loss_cv": _round(_cv(self.losses)),
            "diag_grad_cv": _round(_cv(self.grads)),
            "diag_overlap": _round(float(np.mean(self.overlaps)) if self.overlaps else None),
            "diag_smooth_cos": _round(smooth),
            "diag_smooth_rand": _round(rand),
        }
        record.update(numbers)
        self._remember(record)
        said = self._check(epoch)
        if said:
            record["diag_warnings"] = said
        # Seconds this epoch: in the batch hooks (the per-batch cost), and after the epoch (the probe).
        record["diag_cost_s"] = round(self.epoch_cost_s, 4)
        record["diag_probe_s"] = round(time.perf_counter() - t0, 4)

    # ------------------------------------------------------------ warnings
    def _remember(self, record: dict) -> None:
        entry = {k: record.get(k) for k in RECORD_KEYS}
        entry["epoch"], entry["loss"] = record.get("epoch"), record.get("loss")
        entry["best"] = bool(record.get("best"))
        entry["validated"] = f"val_{self.metric}" in record
        self.history.append(entry)

    def _warn(self, code: str, line: str, said: dict) -> None:
        if code in self.fired:
            return
        self.fired[code] = said[code] = line
        self.say(f"warning: {line}")

    def _check(self, epoch: int) -> dict:
        said: dict[str, str] = {}
        h = self.history[-1]
        if h["diag_dominated"] is not None and h["diag_dominated"] >= DOMINATED_SHARE:
            self._warn(
                "imbalance",
                f"batches are dominated by one class (epoch {epoch}: in {h['diag_dominated']:.0%} of "
                "them one class holds more than twice its share of the training split): use "
                "sampler.seed_order=stratified or train.class_weights=true",
                said,
            )
        recent = [e for e in self.history if (e["epoch"] or 0) >= 2][-OSCILLATION_EPOCHS:]
        first = next((e["loss"] for e in self.history if e["epoch"] == 1), None)

        def noisy(e: dict) -> bool:
            large = first is None or e["loss"] is None or e["loss"] > OSCILLATION_LOSS_LEFT * first
            return large and (
                (e["diag_loss_cv"] or 0.0) > OSCILLATION_LOSS_CV
                or (e["diag_grad_cv"] or 0.0) > OSCILLATION_GRAD_CV
            )

        if len(recent) == OSCILLATION_EPOCHS and all(noisy(e) for e in recent):
            self._warn(
                "oscillation",
                f"the curve oscillates (epochs {recent[0]['epoch']}-{recent[-1]['epoch']}: batch losses "
                f"vary by {h['diag_loss_cv'] or 0:.0%} and gradient norms by {h['diag_grad_cv'] or 0:.0%} "
                "of their mean): fanouts may be too small before the model is too big; raise "
                "sampler.fanouts or train.batch_size before shrinking the model",
                said,
            )
        cos = [e["diag_smooth_cos"] for e in self.history[-(SMOOTH_EPOCHS + 1) :]]
        if (
            len(cos) == SMOOTH_EPOCHS + 1
            and all(c is not None for c in cos)
            and cos[-1] > SMOOTH_COS
            and (h["diag_smooth_rand"] or 0.0) > SMOOTH_COS
            and all(b > a for a, b in zip(cos, cos[1:], strict=False))
            and any(e["validated"] for e in self.history[-SMOOTH_EPOCHS:])
            and not any(e["best"] for e in self.history[-SMOOTH_EPOCHS:])
        ):
            self._warn(
                "smoothing",
                f"node representations are becoming alike (mean cosine to their neighbours {cos[-1]:.2f} "
                f"and rising for {SMOOTH_EPOCHS} epochs, {h['diag_smooth_rand']:.2f} between random nodes) "
                f"while val_{self.metric} stalls: the model "
                "over-smooths; use fewer layers (model.num_layers) or more dropout",
                said,
            )
        return said


def build_diagnostics(cfg, data, metric: str) -> Diagnostics | None:
    """The train stage's diagnostics callback (None with train.diagnostics=false)."""
    if not bool(cfg.train.get("diagnostics", True)):
        return None
    from gnnscale.storage.csc import open_csc

    indptr, indices = open_csc(data.graph)
    nodes = next((data.splits[s] for s in ("val", "test", "train") if len(data.splits[s])), None)
    probe = SmoothingProbe(indptr, indices, nodes, int(cfg.model.num_layers), int(cfg.seed))
    return Diagnostics(
        data.num_classes,
        data.labels[data.splits["train"]],
        metric,
        probe,
        features=lambda: data.features,
    )


def summary_warnings(records: list[dict]) -> list[str]:
    """Every warning the run said, in order, once each (from the records that raised them)."""
    seen: dict[str, str] = {}
    for r in records:
        for code, line in (r.get("diag_warnings") or {}).items():
            seen.setdefault(code, line)
    return list(seen.values())


def last_values(records: list[dict]) -> dict:
    """The last epoch's diagnostics numbers that were measured."""
    for r in reversed(records):
        if any(k in r for k in RECORD_KEYS):
            return {k: r.get(k) for k in RECORD_KEYS}
    return {}
