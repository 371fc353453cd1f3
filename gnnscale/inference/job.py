"""An infer run's shared steps: options, the checkpoint and graph it reads, every layer into
run_dir/layers/, and the published outputs (embeddings, predictions, emb_info.json, summary)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import ConfigError
from gnnscale.inference.layerfile import plan_storage
from gnnscale.inference.layerwise import caches_preactivation, layer_paths, preact_path, run_layers
from gnnscale.inference.outputs import (
    accuracy,
    emb_info,
    link_or_copy,
    publish,
    write_emb_info,
    write_predictions,
    write_rows,
)
from gnnscale.inference.update import update_layers
from gnnscale.models.checkpoint import LoadedCheckpoint, check_fits_graph
from gnnscale.storage.csc import open_csc
from gnnscale.storage.edge_split import open_edge_split
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import EMBEDDINGS, LAYERS, PREDICTIONS
from gnnscale.utils.faults import fault_point
from gnnscale.utils.memlimit import parse_size, resolve_budget
from gnnscale.utils.memory import rss_anon_mb
from gnnscale.utils.ui import info, make_progress

MODES = ("layerwise", "sampled")
STORAGES = ("auto", "memory", "disk")


def check_options(opts) -> None:
    if opts.mode not in MODES:
        raise ConfigError(f"infer.mode={opts.mode!r} is not known", "use --layerwise or --sampled")
    if opts.storage not in STORAGES:
        raise ConfigError(
            f"infer.storage={opts.storage!r} is not known", f"choose one of {', '.join(STORAGES)}"
        )
    if opts.batch_size < 1:
        raise ConfigError(
            f"infer.batch_size={opts.batch_size} must be positive", "use e.g. infer.batch_size=16384"
        )
    if str(opts.memory_budget).lower() != "auto":
        parse_size(opts.memory_budget, "infer.memory_budget")
    if opts.changes and opts.mode != "layerwise":
        raise ConfigError(
            "--update re-runs layer-wise inference; it cannot be combined with --sampled", "drop --sampled"
        )
    if opts.edge_split and (opts.changes or opts.mode != "layerwise"):
        raise ConfigError(
            "infer.edge_split applies to a plain layer-wise run",
            "drop --update / --sampled or infer.edge_split",
        )
    if opts.write_graph and not opts.changes:
        raise ConfigError(
            "infer.write_graph only applies to --update", "add --update changes.npz or drop infer.write_graph"
        )


def pick_device(spec: str) -> torch.device:
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(
            f"infer.device={spec!r} is not a torch device", "use infer.device=cpu or cuda"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"infer.device={spec} but no CUDA device is available", "use infer.device=cpu")
    return device


def open_graph(graph_dir, ck: LoadedCheckpoint) -> GraphDir:
    if not graph_dir:
        raise ConfigError(f"checkpoint {ck.path} records no graph_dir", "pass graph_dir=PATH")
    graph = GraphDir(graph_dir)
    check_fits_graph(ck, graph)
    return graph


def message_passing_csc(graph: GraphDir, ck: LoadedCheckpoint, edge_split: str | None):
    """The CSC inference runs over: the graph's, or an edge split's message-passing graph (val / test
    edges left out, as the link model saw the graph while it trained)."""
    if not edge_split:
        return open_csc(graph)
    if ck.task != "link":
        raise ConfigError(
            f"infer.edge_split={edge_split} needs a task=link checkpoint; {ck.path} is task={ck.task}",
            "drop infer.edge_split",
        )
    split = open_edge_split(graph, edge_split)
    return split.indptr, split.indices


def input_features(graph: GraphDir, ck: LoadedCheckpoint, indptr) -> FeatureStore:
    """The graph's features as the model was trained on them: with the degree column (from this CSC,
    every known edge) when it was trained with model.degree_feature."""
    return FeatureStore(graph, degree_indptr=np.asarray(indptr) if ck.degree_feature else None)


def emb_layer(layer, num_layers: int, task: str = "node") -> int:
    """Default: the last hidden layer (the final layer's input); a 1-layer model has only its logits.
    task=link: the last layer's output, the embedding the pair decoder was trained to score."""
    if layer is None:
        return num_layers if task == "link" else max(num_layers - 1, 1)
    if not 1 <= int(layer) <= num_layers:
        raise ConfigError(
            f"infer.layer={layer} is outside 1..{num_layers} for this {num_layers}-layer model",
            f"choose infer.layer between 1 and {num_layers} ({num_layers} = the logits)",
        )
    return int(layer)


def _progress_cb(bar, num_layers: int):
    tasks = {}

    def cb(layer: int, done: int, total: int) -> None:
        if layer not in tasks:
            tasks[layer] = bar.add_task(f"layer {layer + 1}/{num_layers}", total=total, extra="")
        bar.update(tasks[layer], completed=done)
        fault_point("infer.batch")  # tests/test_faults.py: a deterministic kill point mid-layer

    return cb


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def _free_bytes(budget) -> int:
    """The budget less the heap this process holds already (the model, the graph's index arrays)."""
    held = rss_anon_mb()
    return budget.bytes - int((held or 0) * 1e6)


def compute_layers(model, adj, features, run_dir: Path, *, num_nodes: int, opts, device, update=None) -> dict:
    """Every layer into run_dir/layers/h_*.npy (and z_*.npy: the conv outputs --update propagates through).

    update: (UpdateInputs, affected rows per layer, plan_methods' plan) to update a base run's cached
    layers instead.
    """
    budget = resolve_budget(opts.memory_budget, "infer.memory_budget")
    storage, why, need = plan_storage(num_nodes, list(model.dims), budget, opts.storage)
    where = (
        "in memory (page cache, kept mapped)" if storage == "memory" else "on disk (pages dropped per batch)"
    )
    info(f"layers {where}: {why}")
    final = layer_paths(run_dir / LAYERS, model.num_layers)
    final_z = [
        preact_path(p) if opts.cache_layers and caches_preactivation(model, i) else None
        for i, p in enumerate(final)
    ]
    partial = [_partial(p) for p in final]
    partial_z = [_partial(p) if p is not None else None for p in final_z]
    partial[0].parent.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.time(), time.process_time()
    with make_progress() as bar:
        common = dict(mode=storage, batch_size=opts.batch_size, device=device)
        progress = _progress_cb(bar, model.num_layers)
        if update is None:
            free = _free_bytes(budget) if storage == "disk" else None
            stats = run_layers(
                model, adj, features, partial, preact=partial_z, progress=progress, free_bytes=free, **common
            )
            wrote_z = [p is not None for p in partial_z]
        else:
            stats, wrote_z = update_layers(
                model, update[0], update[1], partial, partial_z, progress=progress, plan=update[2], **common
            )
    compute_s, compute_cpu_s = time.time() - t0, time.process_time() - c0
    t_pub = time.time()
    for p, f in zip(partial, final, strict=True):
        publish(p, f)  # fsync + rename: durable and atomic, timed apart from the compute
    preact = []
    for p, f, ok in zip(partial_z, final_z, wrote_z, strict=True):
        if p is not None and ok:
            publish(p, f)
            preact.append(f.name)
    return {
        "paths": final,
        "preact": preact,
        "stats": stats,
        "batch_size": int(opts.batch_size),
        "storage": storage,
        "why": why,
        "bytes_per_layer_pair": need,
        "compute_s": compute_s,
        "compute_cpu_s": compute_cpu_s,
        "fsync_s": time.time() - t_pub,
    }


def publish_layerwise(
    run_dir: Path, layers: dict, ck: LoadedCheckpoint, graph: GraphDir, *, opts, layer: int, extra_info: dict
) -> dict:
    """embeddings / predictions / emb_info.json from the finished layer files; returns what was written."""
    t0 = time.time() - layers["fsync_s"]
    paths = layers["paths"]
    order = graph.node_order
    # layers/ stays in graph_dir's order (what --update works on); what the user reads is in theirs
    rows = None if order.identity else order.old_to_new
    if rows is None:
        how = link_or_copy(paths[layer - 1], run_dir / EMBEDDINGS)
    else:
        write_rows(paths[layer - 1], run_dir / EMBEDDINGS, rows)
        how = f"copy in the user's node order (graph_dir reordered by {order.method})"
    files, metric = {}, None  # task=link: the last layer is the embedding, there are no classes
    if ck.task != "link":
        files = write_predictions(np.load(paths[-1], mmap_mode="r"), run_dir, opts.probabilities, rows)
        metric = accuracy(np.load(run_dir / PREDICTIONS, mmap_mode="r"), graph, opts.split, rows)
    if not opts.cache_layers:  # keep only what was asked for
        for p in paths:
            p.unlink()
        (run_dir / LAYERS).rmdir()
    cache = None
    if opts.cache_layers:
        cache = {
            "dir": LAYERS,
            "files": [p.name for p in paths],
            "dims": list(ck.model.dims[1:]),
            # conv outputs of hidden layers, what --update propagates a change through (extra disk)
            "preact": layers["preact"],
            "preact_bytes": sum((run_dir / LAYERS / f).stat().st_size for f in layers["preact"]),
        }
    emb = np.load(run_dir / EMBEDDINGS, mmap_mode="r")
    record = emb_info(
        emb,
        layer,
        ck,
        graph,
        "layerwise",
        order.describe_rows(),
        cache=cache,
        **extra_info,
    )
    write_emb_info(run_dir, record)
    return {
        "files": {"embeddings": f"embeddings.npy ({how} of layers/{paths[layer - 1].name})", **files},
        "metric": metric,
        "publish_s": time.time() - t0,
        "emb_info": record,
    }


def layerwise_summary(mode: str, ck, graph, layers: dict, out: dict, meter_stats: dict, **extra) -> dict:
    n = graph.num_nodes
    metric = out["metric"]
    return {
        "stage": "infer",
        "mode": mode,
        "ckpt": str(ck.path),
        "graph_dir": str(graph.path),
        "num_nodes": n,
        "num_layers": ck.num_layers,
        "storage": {
            "layers": layers["storage"],
            "why": layers["why"],
            "layer_pair_gb": round(layers["bytes_per_layer_pair"] / 1e9, 3),
        },
        "batch_size": int(layers["batch_size"]),
        "layers": [s.as_dict() for s in layers["stats"]],
        "infer_time_s": round(layers["compute_s"], 3),
        "infer_cpu_s": round(layers["compute_cpu_s"], 3),  # all threads; less sensitive to a busy machine
        "nodes_per_s": round(n / max(layers["compute_s"], 1e-9)),
        "publish_time_s": round(out["publish_s"], 3),
        "embeddings": {"shape": out["emb_info"]["shape"], "layer": out["emb_info"]["layer"]},
        "files": out["files"],
        "metric": metric,
        "test_acc": metric["accuracy"] if metric and metric["split"] == "test" else None,
        **extra,
        **meter_stats,
    }


def summary_rows(summary: dict) -> dict:
    """The table `gnnscale infer` ends with."""
    rows = {
        "mode": summary["mode"],
        "nodes": summary["num_nodes"],
        "layers": f"{summary['num_layers']} (embeddings = layer {summary['embeddings']['layer']}, "
        f"{summary['embeddings']['shape'][1]} dims)",
    }
    if "storage" in summary:
        rows["layer storage"] = summary["storage"]["layers"]
    if "affected" in summary:
        rows["rows recomputed per layer"] = " / ".join(
            f"{a['rows']:,} ({a['fraction']:.1%})" for a in summary["affected"]
        )
    rows["inference time (s)"] = summary["infer_time_s"]
    rows["nodes/s"] = summary["nodes_per_s"]
    if summary.get("metric"):
        m = summary["metric"]
        rows[f"{m['split']} accuracy"] = f"{m['accuracy']:.4f} ({m['labelled_nodes']:,} labelled nodes)"
    rss, anon = (summary.get(k) for k in ("peak_rss_mb", "peak_anon_mb"))
    rows["peak RSS / anon (MB)"] = " / ".join("n/a" if v is None else f"{v:,.0f}" for v in (rss, anon))
    return rows
