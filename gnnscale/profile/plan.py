"""`gnnscale profile`'s plan: graph statistics, full-graph and mini-batch memory, and the formation advice,
from files alone (no training run).

With a graph_dir the graph is opened as the train stage opens it (training/data.load_train_data: the CSC
and features memory-mapped), its configured sampler is prepared as train prepares it (a formation that
needs a partition or node scores makes them in graph_dir, as train would), draws a few batches
(profile.probe_batches), and the memory plan is the train stage's own (training/memory_plan), measured
from this process. With profile.num_nodes > 0 the graph is described instead: sizes only, the mini-batch
sizes are the design notes' no-overlap worst case, and nothing is said about degree skew. Both plan
fp32 on the CPU heap (precision and train.device are recorded, not modelled), and train.phases' first
phase only.

Every byte count is an int under a *_bytes key; *_gb / *_mb beside it are for people.
"""

from __future__ import annotations

from gnnscale.config import eval_batch_size
from gnnscale.models import build_model
from gnnscale.profile.full_graph import full_graph_memory
from gnnscale.profile.minibatch import (
    SMALLEST_BATCH,
    BatchModel,
    batch_bytes,
    ego_size,
    largest_fitting,
    memory_vs_fanout,
    peak_bytes,
    shape_layers,
    worst_case,
)
from gnnscale.profile.read_ahead import predict_read_ahead
from gnnscale.profile.recommend import recommend
from gnnscale.profile.speed import predict_speed
from gnnscale.profile.stats import GraphStats, described_stats, graph_stats
from gnnscale.sampling import has_fanouts
from gnnscale.training.build import build_samplers, resolve_prefetch, sums_first_layer
from gnnscale.training.data import load_train_data
from gnnscale.training.memory_plan import TRAINER_OVERHEAD, BatchShape, Sizes, Workload, probe_batches
from gnnscale.training.options import apply_few_labels, check_train_cfg, pick_device
from gnnscale.training.task_setup import task_name
from gnnscale.utils.memlimit import Budget

DESCRIBED_FANOUT = 10  # a described graph with a formation without fanouts is planned as this per layer


def make_plan(cfg, budget: Budget, data=None) -> dict:
    """{"graph", "model", "full_graph", "minibatch", "speed", "recommendation", "budget"}: one JSON-able
    dict. data: the graph as train opens it (load_train_data), when the caller has it open already."""
    check_train_cfg(cfg)
    described = float(cfg.profile.num_nodes) > 0
    if described:
        stats, data = described_stats(cfg.profile), None
    else:
        stats = graph_stats(cfg.graph_dir)
        data = data or load_train_data(cfg.graph_dir, degree_feature=cfg.model.degree_feature)
    num_train = len(data.splits["train"]) if data is not None else stats.num_train
    cfg, few_labels, _ = apply_few_labels(cfg, num_train)  # what train would change on this graph
    layers = int(cfg.model.num_layers)
    model = build_model(cfg.model, stats.feat_dim, stats.num_classes)
    fanouts = [int(f) for f in cfg.sampler.fanouts] if has_fanouts(cfg.sampler) else None
    if described and fanouts is None:
        fanouts = [DESCRIBED_FANOUT] * layers
    batch_size = int(cfg.train.batch_size)
    eval_bs = eval_batch_size(cfg.train)
    all_neighbours = stats.degrees.max if stats.degrees is not None else stats.avg_degree

    device = pick_device(cfg.train.device)
    speed = None
    if data is not None:
        samplers = build_samplers(cfg, data)
        train_shape, eval_shape = _probe(cfg, data, samplers, batch_size, eval_bs)
    else:
        train_shape = worst_case(fanouts, batch_size, stats.num_nodes, stats.num_edges, all_neighbours)[1]
        eval_fanouts = [int(f) for f in cfg.train.eval_fanouts] if cfg.train.eval_fanouts else fanouts
        eval_shape = worst_case(eval_fanouts, eval_bs, stats.num_nodes, stats.num_edges, all_neighbours)[1]
    sizes = Sizes(
        num_nodes=stats.num_nodes,
        feat_dim=stats.feat_dim,
        feat_itemsize=stats.feat_itemsize,
        csc_bytes=stats.csc_bytes,
        dims=tuple(model.dims),
        num_params=sum(p.numel() for p in model.parameters()),
        input_dropout=float(cfg.train.input_dropout) > 0,
        norm=(cfg.model.get("norm") or "none") != "none",
        first_sums=sums_first_layer(cfg, stats.feat_dim, stats.num_classes, task_name(cfg) == "node"),
    )
    w = Workload.now(sizes, train_shape, eval_shape)  # this process: interpreter, torch, DGL, the labels
    batches = BatchModel(
        w,
        fanouts,
        batch_size,
        eval_follows_batch=int(cfg.train.eval_batch_size) == 0,
        num_edges=stats.num_edges,
        all_neighbours=all_neighbours,
        feature_cache=str(cfg.train.feature_cache),
        prefetch=resolve_prefetch(int(cfg.train.prefetch), device),
        budget=budget,
    )
    full = full_graph_memory(
        stats, cfg.model, float(cfg.train.input_dropout), w.anon_now, mapped_now_bytes=w.mapped_now
    )
    minibatch = _minibatch(cfg, stats, batches, w, fanouts, batch_size, data is not None)
    rec = recommend(stats, full, minibatch, budget, cfg)
    if (
        data is not None
    ):  # after the memory plan, which reads this process's heap: the probe's buffers stay out
        k = max(1, int(cfg.profile.probe_batches))
        in_ram = minibatch["plan"]["feature_cache"] in ("memory", "read")  # where train will gather from
        speed = predict_speed(
            cfg.model, data, samplers["train"][0], model.dims, batch_size, device, k, in_ram
        )
    read_ahead = (
        predict_read_ahead(data, samplers["train"][0], minibatch["plan"], batch_size, speed["step_s"])
        if speed is not None
        else None
    )
    return {
        "graph": stats.as_dict(),
        "model": {
            "arch": str(cfg.model.arch),
            "dims": list(model.dims),
            "num_params": sizes.num_params,
            "sampler": str(cfg.sampler.kind),
            "fanouts": fanouts,
            "batch_size": batch_size,
            "eval_batch_size": eval_bs,
            "device": device.type,
            "few_labels_applied": {k: _plain(v) for k, v in few_labels.items()},
        },
        "full_graph": full,
        "minibatch": minibatch,
        "speed": speed,  # predicted seeds/s (profile/speed.py); None for a described graph
        # features read from disk by the sweep (profile/read_ahead.py); None when they are not
        "read_ahead": read_ahead,
        "recommendation": rec,
        "budget": {"bytes": int(budget.bytes), "gb": round(budget.bytes / 1e9, 3), "why": budget.why},
    }


def _plain(value):
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _probe(cfg, data, samplers: dict, batch_size: int, eval_bs: int) -> tuple[BatchShape, BatchShape]:
    """The largest of profile.probe_batches training batches and of one validation / test batch, drawn
    by the configured samplers (the train stage's preflight probe, more batches)."""
    k = max(1, int(cfg.profile.probe_batches))
    layers = int(cfg.model.num_layers)
    train = probe_batches(data.g, data.splits["train"], samplers["train"][0], batch_size, k, layers)
    evals = [data.splits[s] for s in ("val", "test") if len(data.splits[s])]
    shape = max(
        (probe_batches(data.g, ids, samplers["eval"], eval_bs, k=1) for ids in evals),
        key=lambda s: s.input_rows,
        default=train,
    )
    return train, shape


def _minibatch(
    cfg, stats: GraphStats, batches: BatchModel, w, fanouts, batch_size: int, sampled: bool
) -> dict:
    n, e = stats.num_nodes, stats.num_edges
    worst, _ = worst_case(fanouts, batch_size, n, e, batches.all_neighbours) if fanouts else (None, None)
    p = batches.plan(batch_size, fanouts)
    lean = batches.leanest()
    peak = peak_bytes(p)
    out = {
        "sampler": str(cfg.sampler.kind),
        "fanouts": fanouts,
        "batch_size": batch_size,
        "source": "sampled" if sampled else "worst case (a described graph cannot be sampled: no overlap)",
        "worst_case": worst,
        "ego_size_per_seed": ego_size(fanouts) if fanouts and all(f > 0 for f in fanouts) else None,
        "measured": None,
        "per_batch": batch_bytes(w),  # gathered rows + one step's blocks, activations, gradients
        "plan": p.as_dict(),
        "predicted_peak": {
            **peak,
            "anon_gb": round(peak["anon_bytes"] / 1e9, 3),
            "rss_gb": round(peak["rss_bytes"] / 1e9, 3),
            "what": (
                "peak of a `gnnscale train` process with these settings: anon = RssAnon (heap), rss = VmRSS "
                f"(mapped files too); both include the process now and {TRAINER_OVERHEAD >> 20} MB of trainer "
                "overhead"
            ),
        },
        "fits": p.fits,
        "leanest_batch_size": min(SMALLEST_BATCH, batch_size),
        "leanest_must_fit_bytes": int(lean.must_fit),
        # Full-graph training has no batch to size: only whether it fits is said.
        "largest_fitting": (
            {"configured_fits": p.fits, "batch_size": None, "fanouts": None, "fanout_scale": None}
            if str(cfg.sampler.kind) == "full"
            else largest_fitting(batches, stats.num_train)
        ),
        "memory_vs_fanout": memory_vs_fanout(batches),
    }
    if sampled:
        k = max(1, int(cfg.profile.probe_batches))
        out["measured"] = {
            "batches": k,
            "what": f"the largest of {k} sampled training batches (unique nodes: overlap counted once)",
            "input_nodes": int(w.train.input_rows),
            "layers": shape_layers(w.train, fanouts),
            "eval_input_nodes": int(w.evals.input_rows),
            "overlap_ratio": (
                round(w.train.input_rows / max(worst["input_nodes"], 1), 4) if worst is not None else None
            ),
        }
    return out
