"""Mini-batch sizes and memory: the design notes' worst case, the measured batches, and what fits.

Worst case (design note 001's `ego_size`): a seed reaches f_L neighbours in its first hop, each of
those f_(L-1) more, and so on (fanouts are listed input layer first, so the seeds' own layer draws the
last one): ego_size = 1 + f_L + f_L*f_(L-1) + ... nodes per seed, times the batch, capped at the graph.
That counts nodes as if no two draws ever met. A block's edges are its destinations times their fanout
(every destination draws, seeds again at deeper layers too), capped at the graph's edges.

Measured: a few real batches of the configured sampler (training/memory_plan.probe_batches, the train
stage's own probe, the largest of each size kept): the unique nodes and edges per layer, i.e. with the
overlap between neighbourhoods that the worst case leaves out. Their ratio is the overlap.

Memory: training/memory_plan's estimate of the train process (reused, not copied): what the process holds
now, the features (in RAM when they fit), the gather buffers, one step's blocks, activations and gradients
(or an evaluation batch's), the optimizer, the CSC. Other sizes (batch size, fanouts) are extrapolated
from the measured batch by the worst case's growth: linear in the batch size and in the fanouts'
products, capped at the graph, an upper bound since larger batches overlap more.

A described graph (profile.num_nodes, no CSC) cannot be sampled: only the worst case is known, and its
memory is planned from it (labelled "worst case" in the output).
"""

from __future__ import annotations

import math
from dataclasses import replace

from gnnscale.training.memory_plan import (
    BatchShape,
    MemoryPlan,
    Workload,
    _step_bytes,
    estimate,
    plan,
)
from gnnscale.utils.memlimit import Budget

FANOUT_SCALES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
SMALLEST_BATCH = 64  # the leanest run the plan considers (smaller batches waste the hardware)


def seed_hops(fanouts: list[int]) -> list[int]:
    """The fanouts in the order a seed meets them: its own (last) layer first."""
    return list(reversed(fanouts))


def ego_size(fanouts: list[int]) -> int:
    """Design note 001's count: 1 + f1 + f1*f2 + ... nodes per seed (f1 = the seeds' own layer)."""
    size, frontier = 1, 1
    for f in seed_hops(fanouts):
        frontier *= f
        size += frontier
    return size


def _effective(fanouts: list[int], all_neighbours: float) -> list[float]:
    """-1 (every neighbour) counts as `all_neighbours` (the largest degree, or the average one)."""
    return [float(all_neighbours) if f < 0 else float(f) for f in fanouts]


def worst_case(
    fanouts: list[int], batch_size: int, num_nodes: int, num_edges: int, all_neighbours: float
) -> tuple[dict, BatchShape]:
    """The no-overlap sizes of one batch: per hop (notes' arithmetic) and per block (input first)."""
    f = _effective(fanouts, all_neighbours)
    frontier, cumulative = 1.0, [1.0]
    for k in seed_hops(f):
        frontier *= k
        cumulative.append(cumulative[-1] + frontier)
    nodes_per_hop = [min(int(batch_size * c), num_nodes) for c in cumulative]  # seeds, 1 hop, 2 hops ...
    layers, dst_rows, edges = [], [], []
    depth = len(f)
    for i, fan in enumerate(f):  # block i (input first) has the nodes within depth-1-i hops as destinations
        dst = nodes_per_hop[depth - 1 - i]
        src = nodes_per_hop[depth - i]
        e = int(min(dst * fan, num_edges))
        layers.append({"layer": i, "fanout": fanouts[i], "dst_nodes": dst, "src_nodes": src, "edges": e})
        dst_rows.append(dst)
        edges.append(e)
    out = {
        "ego_size_per_seed": int(cumulative[-1]) if all(x >= 0 for x in fanouts) else None,
        "nodes_per_hop": nodes_per_hop,
        "input_nodes": nodes_per_hop[-1],
        "layers": layers,
        "all_neighbours_as": None if all(x >= 0 for x in fanouts) else all_neighbours,
    }
    return out, BatchShape(nodes_per_hop[-1], tuple(dst_rows), tuple(edges))


def shape_layers(shape: BatchShape, fanouts: list[int] | None) -> list[dict]:
    """A BatchShape per layer (input first): unique source and destination nodes, edges."""
    out = []
    for i, (dst, e) in enumerate(zip(shape.dst_rows, shape.edges, strict=True)):
        src = shape.input_rows if i == 0 else shape.dst_rows[i - 1]
        row = {"layer": i, "dst_nodes": int(dst), "src_nodes": int(src), "edges": int(e)}
        if fanouts is not None:
            row["fanout"] = fanouts[i]
        out.append(row)
    return out


def extrapolate(measured: BatchShape, worst_then: BatchShape, worst_now: BatchShape, n: int) -> BatchShape:
    """The measured batch grown as the worst case grows from `worst_then` to `worst_now` (capped at n)."""

    def grow(x: int, a: int, b: int, cap: int | None) -> int:
        value = math.ceil(x * b / a) if a > 0 else int(b)
        return min(value, cap) if cap is not None else value

    return BatchShape(
        grow(measured.input_rows, worst_then.input_rows, worst_now.input_rows, n),
        tuple(
            grow(m, a, b, n)
            for m, a, b in zip(measured.dst_rows, worst_then.dst_rows, worst_now.dst_rows, strict=True)
        ),
        tuple(
            grow(m, a, b, None)
            for m, a, b in zip(measured.edges, worst_then.edges, worst_now.edges, strict=True)
        ),
    )


def batch_bytes(w: Workload) -> dict:
    """One training batch's own memory: its gathered features and its step (blocks, activations and
    their gradients), without the process, the features matrix or the evaluation batches."""
    s = w.sizes
    gather = w.train.input_rows * s.feat_dim * s.feat_itemsize
    step = _step_bytes(s, w.train, True)
    return {
        "gathered_features_bytes": int(gather),
        "step_bytes": int(step),
        "total_bytes": int(gather + step),
        "total_mb": round((gather + step) / 2**20, 1),
    }


def peak_bytes(p: MemoryPlan) -> dict:
    """The predicted peak of a train process: anonymous memory (heap) and RSS (mapped files too)."""
    anon = sum(v for k, v in p.parts.items() if "(mmap)" not in k)
    return {"anon_bytes": int(anon), "rss_bytes": int(p.rss)}


class BatchModel:
    """Plans for other batch sizes and fanouts from one measured (or worst-case) batch."""

    def __init__(
        self,
        w: Workload,
        fanouts: list[int] | None,
        batch_size: int,
        *,
        eval_follows_batch: bool,
        num_edges: int,
        all_neighbours: float,
        feature_cache: str,
        prefetch: int,
        budget: Budget,
    ):
        self.w, self.fanouts, self.batch_size = w, fanouts, batch_size
        self.eval_follows_batch = eval_follows_batch  # train.eval_batch_size=0: the batch size
        self.num_edges, self.all_neighbours = num_edges, all_neighbours
        self.feature_cache, self.prefetch, self.budget = feature_cache, prefetch, budget

    def _worst(self, fanouts: list[int], batch_size: int) -> BatchShape:
        n = self.w.sizes.num_nodes
        return worst_case(fanouts, batch_size, n, self.num_edges, self.all_neighbours)[1]

    def workload(self, batch_size: int, fanouts: list[int] | None) -> Workload:
        """The workload at another batch size / fanouts (the training batch; evaluation batches grow with
        the batch size when train.eval_batch_size=0 ties them to it, their fanouts stay)."""
        n, f = self.w.sizes.num_nodes, batch_size / self.batch_size
        evals = self.w.evals.scaled(f, n) if f != 1 and self.eval_follows_batch else self.w.evals
        if self.fanouts is None or fanouts is None:  # subgraph formations: linear in the batch
            return replace(self.w, train=self.w.train.scaled(f, n) if f != 1 else self.w.train, evals=evals)
        train = extrapolate(
            self.w.train, self._worst(self.fanouts, self.batch_size), self._worst(fanouts, batch_size), n
        )
        return replace(self.w, train=train, evals=evals)

    def plan(self, batch_size: int, fanouts: list[int] | None, lean: bool = False) -> MemoryPlan:
        """The train stage's plan at these settings; lean = features memory-mapped, no prefetch."""
        w = self.workload(batch_size, fanouts)
        if lean:
            return estimate(w, "mmap", 0, self.budget)
        return plan(w, self.feature_cache, self.prefetch, self.budget)[0]

    def fits(self, batch_size: int, fanouts: list[int] | None) -> bool:
        """The train stage's own test (its plan's must_fit within the budget): what it would accept."""
        return self.plan(batch_size, fanouts).fits

    def leanest(self) -> MemoryPlan:
        """The smallest run the plan considers: batch SMALLEST_BATCH (or less when configured so), features
        memory-mapped, no prefetch. Not fitting this means one host cannot train the graph."""
        bs = min(SMALLEST_BATCH, self.batch_size)
        return self.plan(bs, self.fanouts, lean=True)


def scaled_fanouts(fanouts: list[int], scale: float) -> list[int]:
    return [f if f < 0 else max(1, int(round(f * scale))) for f in fanouts]


def largest_fitting(model: BatchModel, num_train: int) -> dict:
    """The largest batch size (at the configured fanouts) and the largest fanout scaling (at the
    configured batch size) whose plans fit the budget, and whether the configuration itself fits."""
    bs, cap = None, max(num_train, 1)
    size = SMALLEST_BATCH
    while True:
        if not model.fits(min(size, cap), model.fanouts):
            break
        bs = min(size, cap)
        if size >= cap:
            break
        size *= 2
    fan = None
    if model.fanouts is not None and all(f > 0 for f in model.fanouts):
        for scale in (*FANOUT_SCALES, 6.0, 8.0):
            candidate = scaled_fanouts(model.fanouts, scale)
            if model.fits(model.batch_size, candidate):
                fan = {"scale": scale, "fanouts": candidate}
            else:
                break
    return {
        "configured_fits": model.fits(model.batch_size, model.fanouts),
        "batch_size": bs,
        "batch_size_rule": (
            f"the largest of {SMALLEST_BATCH}, {SMALLEST_BATCH * 2}, ... (up to the {num_train:,} training "
            "nodes) at the configured fanouts whose plan fits; batches grown linearly (an upper bound)"
        ),
        "fanouts": None if fan is None else fan["fanouts"],
        "fanout_scale": None if fan is None else fan["scale"],
        "fanouts_rule": (
            "the largest scaling of the configured fanouts (x0.25 ... x8) at the configured batch size whose "
            "plan fits; None when even x0.25 does not, or the formation has no fanouts"
        ),
    }


def memory_vs_fanout(model: BatchModel) -> list[dict]:
    """Predicted per-batch memory and process peak for a few scalings of the fanouts (for a plot)."""
    if model.fanouts is None or any(f < 0 for f in model.fanouts):
        return []
    rows = []
    for scale in FANOUT_SCALES:
        fanouts = scaled_fanouts(model.fanouts, scale)
        p = model.plan(model.batch_size, fanouts)
        per = batch_bytes(model.workload(model.batch_size, fanouts))["total_bytes"]
        rows.append(
            {
                "scale": scale,
                "fanouts": fanouts,
                "label": "[" + ",".join(str(f) for f in fanouts) + "]",
                "per_batch_bytes": per,
                "per_batch_mb": round(per / 2**20, 1),
                "peak_anon_bytes": peak_bytes(p)["anon_bytes"],
                "fits": p.fits,
            }
        )
    return rows
