"""`gnnscale infer`: a train checkpoint -> embeddings and predictions.

--layerwise (default): every node's exact embedding, one layer at a time over all nodes, each layer's
  output a memory-mapped .npy in run_dir/layers/ (kept for --update), RAM bounded by one batch.
--sampled: a node subset (infer.nodes) through sampled neighbourhoods (infer.fanouts); fast, approximate.
--update changes.npz: reuse a layer-wise run's cached layers and recompute only the affected rows.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from gnnscale.config.schema import InferOptions
from gnnscale.errors import ConfigError, DataError, GraphDirError
from gnnscale.inference.blocks import Adjacency
from gnnscale.inference.checkpoint import LoadedCheckpoint, check_fits_graph, load_checkpoint
from gnnscale.inference.delta import GraphDelta, PatchedFeatures, read_changes, write_updated_graph
from gnnscale.inference.incremental import affected_rows
from gnnscale.inference.layerfile import plan_storage
from gnnscale.inference.layerwise import caches_preactivation, layer_paths, preact_path, run_layers
from gnnscale.inference.outputs import accuracy, link_or_copy, publish, write_predictions
from gnnscale.inference.sampled import resolve_fanouts, resolve_nodes, sampled_infer
from gnnscale.inference.update import UpdateInputs, update_layers
from gnnscale.sampling import set_sampling_threads
from gnnscale.stages.common import config_hash, make_run_dir, metered, write_summary
from gnnscale.storage.csc import open_csc, to_dgl_graph
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.utils.atomic import write_json
from gnnscale.utils.ui import info, make_progress, summary_table

MODES = ("layerwise", "sampled")
STORAGES = ("auto", "memory", "disk")
EMB_INFO = "emb_info.json"


# ---------------------------------------------------------------- entry point
def run(cfg: DictConfig) -> dict:
    # Merging onto the schema lets a pipeline config without an `infer` node run with the defaults.
    opts = OmegaConf.merge(OmegaConf.structured(InferOptions), cfg.get("infer") or {})
    _check_options(opts)
    if opts.num_threads > 0:
        torch.set_num_threads(int(opts.num_threads))
    device = _device(opts.device)
    if opts.changes:
        return _run_update(cfg, opts, device)
    ck = load_checkpoint(cfg.get("ckpt"))
    graph = _open_graph(cfg.get("graph_dir") or ck.graph.get("graph_dir"), ck)
    emb_layer = _emb_layer(opts.layer, ck.num_layers)
    run_dir = make_run_dir(cfg, "infer")
    if opts.mode == "layerwise":
        return _run_layerwise(cfg, opts, ck, graph, emb_layer, run_dir, device)
    return _run_sampled(cfg, opts, ck, graph, emb_layer, run_dir, device)


def _check_options(opts) -> None:
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
    if opts.memory_budget_gb <= 0:
        raise ConfigError(
            f"infer.memory_budget_gb={opts.memory_budget_gb} must be positive",
            "use e.g. infer.memory_budget_gb=4",
        )
    if opts.changes and opts.mode != "layerwise":
        raise ConfigError(
            "--update re-runs layer-wise inference; it cannot be combined with --sampled", "drop --sampled"
        )
    if opts.write_graph and not opts.changes:
        raise ConfigError(
            "infer.write_graph only applies to --update", "add --update changes.npz or drop infer.write_graph"
        )


def _device(spec: str) -> torch.device:
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(
            f"infer.device={spec!r} is not a torch device", "use infer.device=cpu or cuda"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"infer.device={spec} but no CUDA device is available", "use infer.device=cpu")
    return device


def _open_graph(graph_dir, ck: LoadedCheckpoint) -> GraphDir:
    if not graph_dir:
        raise ConfigError(f"checkpoint {ck.path} records no graph_dir", "pass graph_dir=PATH")
    graph = GraphDir(graph_dir)
    check_fits_graph(ck, graph)
    return graph


def _emb_layer(layer, num_layers: int) -> int:
    """Default: the last hidden layer (the final layer's input); a 1-layer model has only its logits."""
    if layer is None:
        return max(num_layers - 1, 1)
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

    return cb


# ---------------------------------------------------------------- layer-wise (full and update)
def _compute_layers(model, adj, features, run_dir: Path, num_nodes: int, opts, device, update=None) -> dict:
    """Every layer into run_dir/layers/h_*.npy (and z_*.npy: the conv outputs --update propagates through).

    update: (UpdateInputs, affected rows per layer) to update a base run's cached layers instead.
    """
    storage, why, need = plan_storage(num_nodes, list(model.dims), opts.memory_budget_gb, opts.storage)
    where = (
        "in memory (page cache, kept mapped)" if storage == "memory" else "on disk (pages dropped per batch)"
    )
    info(f"layers {where}: {why}")
    final = layer_paths(run_dir / "layers", model.num_layers)
    final_z = [
        preact_path(p) if opts.cache_layers and caches_preactivation(model, i) else None
        for i, p in enumerate(final)
    ]
    partial = [_partial(p) for p in final]
    partial_z = [_partial(p) if p is not None else None for p in final_z]
    partial[0].parent.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.time(), time.process_time()
    with make_progress() as bar:
        if update is None:
            stats = run_layers(
                model,
                adj,
                features,
                partial,
                mode=storage,
                batch_size=opts.batch_size,
                preact=partial_z,
                device=device,
                progress=_progress_cb(bar, model.num_layers),
            )
            wrote_z = [p is not None for p in partial_z]
        else:
            stats, wrote_z = update_layers(
                model,
                update[0],
                update[1],
                partial,
                partial_z,
                mode=storage,
                batch_size=opts.batch_size,
                device=device,
                progress=_progress_cb(bar, model.num_layers),
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
    fsync_s = time.time() - t_pub
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
        "fsync_s": fsync_s,
    }


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def _finish(
    run_dir: Path, layers: dict, ck: LoadedCheckpoint, graph: GraphDir, opts, emb_layer: int, extra_info: dict
) -> dict:
    """embeddings / predictions / emb_info.json from the finished layer files; returns what was written."""
    t0 = time.time() - layers["fsync_s"]
    paths = layers["paths"]
    how = link_or_copy(paths[emb_layer - 1], run_dir / "embeddings.npy")
    logits = np.load(paths[-1], mmap_mode="r")
    files = write_predictions(logits, run_dir, opts.probabilities)
    pred = np.load(run_dir / "predictions.npy", mmap_mode="r")
    metric = accuracy(pred, graph, opts.split)
    if not opts.cache_layers:  # keep only what was asked for
        for p in paths:
            p.unlink()
        (run_dir / "layers").rmdir()
    preact_bytes = sum((run_dir / "layers" / f).stat().st_size for f in layers["preact"])
    emb = np.load(run_dir / "embeddings.npy", mmap_mode="r")
    emb_info = {
        "file": "embeddings.npy",
        "shape": list(emb.shape),
        "dtype": str(emb.dtype),
        "layer": emb_layer,
        "num_layers": ck.num_layers,
        "layer_kind": "logits"
        if emb_layer == ck.num_layers
        else "hidden (input of layer %d)" % (emb_layer + 1),
        "node_order": "row i is global node id i of graph_dir",
        "mode": "layerwise",
        "graph_dir": str(graph.path.resolve()),
        "graph_name": graph.meta["name"],
        "graph_shards_sha256": [s["sha256"] for s in graph.meta["shards"]],
        "ckpt": str(ck.path.resolve()),
        "signature_hash": ck.signature_hash,
        "weights_hash": ck.weights_hash,
        "model_cfg": ck.model_cfg,
        "model_cfg_hash": config_hash(ck.model_cfg),
        "cache": {
            "dir": "layers",
            "files": [p.name for p in paths],
            "dims": list(ck.model.dims[1:]),
            # conv outputs of hidden layers, what --update propagates a change through (extra disk)
            "preact": layers["preact"],
            "preact_bytes": preact_bytes,
        }
        if opts.cache_layers
        else None,
        **extra_info,
    }
    write_json(run_dir / EMB_INFO, emb_info)  # written last: its presence marks a complete run
    return {
        "files": {"embeddings": f"embeddings.npy ({how} of layers/{paths[emb_layer - 1].name})", **files},
        "metric": metric,
        "publish_s": time.time() - t0,
        "emb_info": emb_info,
    }


def _layer_report(layers: dict) -> list[dict]:
    return [s.as_dict() for s in layers["stats"]]


def _run_layerwise(
    cfg, opts, ck: LoadedCheckpoint, graph: GraphDir, emb_layer: int, run_dir: Path, device
) -> dict:
    n = graph.num_nodes
    model = ck.model.to(device)
    with metered() as meter:
        indptr, indices = open_csc(graph)
        layers = _compute_layers(
            model, Adjacency(indptr, indices), FeatureStore(graph), run_dir, n, opts, device
        )
        out = _finish(run_dir, layers, ck, graph, opts, emb_layer, {"delta": None, "base_run": None})
    summary = _summary("layerwise", cfg, ck, graph, layers, out, meter)
    _report(summary, run_dir)
    return summary


def _summary(mode: str, cfg, ck, graph, layers, out, meter, **extra) -> dict:
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
        "layers": _layer_report(layers),
        "infer_time_s": round(layers["compute_s"], 3),
        "infer_cpu_s": round(layers["compute_cpu_s"], 3),  # all threads; less sensitive to a busy machine
        "nodes_per_s": round(n / max(layers["compute_s"], 1e-9)),
        "publish_time_s": round(out["publish_s"], 3),
        "embeddings": {"shape": out["emb_info"]["shape"], "layer": out["emb_info"]["layer"]},
        "files": out["files"],
        "metric": metric,
        "test_acc": metric["accuracy"] if metric and metric["split"] == "test" else None,
        **extra,
        **meter.stats(),
    }


def _report(summary: dict, run_dir: Path) -> None:
    write_summary(run_dir, summary)
    rows = {
        "mode": summary["mode"],
        "nodes": summary["num_nodes"],
        "layers": f"{summary['num_layers']} (embeddings = layer {summary['embeddings']['layer']}, {summary['embeddings']['shape'][1]} dims)",
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
    rows["peak RSS / anon (MB)"] = f"{summary['peak_rss_mb']:,.0f} / {summary['peak_anon_mb']:,.0f}"
    summary_table(f"infer --{summary['mode']}: {summary['ckpt']} on {summary['graph_dir']}", rows)
    info(
        f"outputs: {run_dir}  (summary.json, {', '.join(f.split(' ')[0] for f in summary['files'].values())}, {EMB_INFO})"
    )
    summary["run_dir"] = str(run_dir)


# ---------------------------------------------------------------- incremental
def newest_cached_run(root: Path = Path("runs") / "infer") -> Path:
    runs = []
    for p in sorted(root.glob("*")):
        try:
            meta = json.loads((p / EMB_INFO).read_text())
        except (OSError, ValueError):
            continue
        if meta.get("mode") == "layerwise" and meta.get("cache"):
            runs.append(p)
    if not runs:
        raise ConfigError(
            f"no layer-wise infer run with cached layers under {root}/",
            "run `gnnscale infer --layerwise` first, or pass infer.base=RUN_DIR",
        )
    return runs[-1]


def _load_base(spec) -> tuple[Path, dict]:
    base = Path(spec) if spec else newest_cached_run()
    try:
        meta = json.loads((base / EMB_INFO).read_text())
    except (OSError, ValueError):
        raise ConfigError(
            f"infer.base='{base}' is not a finished infer run (no {EMB_INFO})",
            "pass infer.base= a run_dir of `gnnscale infer --layerwise`",
        ) from None
    if meta.get("mode") != "layerwise" or not meta.get("cache"):
        raise ConfigError(
            f"infer run '{base}' kept no layer cache (a sampled run or infer.cache_layers=false)",
            "re-run `gnnscale infer --layerwise` with infer.cache_layers=true",
        )
    missing = [f for f in meta["cache"]["files"] if not (base / meta["cache"]["dir"] / f).is_file()]
    if missing:
        raise DataError(
            f"infer run '{base}' lacks cached layer file(s) {', '.join(missing)}",
            "re-run `gnnscale infer --layerwise`",
        )
    return base, meta


def _run_update(cfg, opts, device) -> dict:
    base, binfo = _load_base(opts.base)
    ck = load_checkpoint(cfg.get("ckpt") or binfo["ckpt"])
    if ck.weights_hash != binfo["weights_hash"]:
        raise ConfigError(
            f"checkpoint {ck.path} is not the model of base run '{base}' (cached layers need the same weights)",
            f"drop ckpt= to use {binfo['ckpt']}, or run a full `gnnscale infer --layerwise`",
        )
    graph_dir = Path(binfo["graph_dir"])
    if cfg.get("graph_dir") and Path(cfg.graph_dir).resolve() != graph_dir:
        raise ConfigError(
            f"graph_dir={cfg.graph_dir} differs from base run's graph {graph_dir}",
            "drop graph_dir= (an update applies to the base run's graph)",
        )
    graph = GraphDir(graph_dir)
    if [s["sha256"] for s in graph.meta["shards"]] != binfo["graph_shards_sha256"]:
        raise GraphDirError(
            f"graph_dir '{graph_dir}' changed since base run '{base}'",
            "run a full `gnnscale infer --layerwise` on it first",
        )
    check_fits_graph(ck, graph)
    emb_layer = _emb_layer(opts.layer if opts.layer is not None else binfo["layer"], ck.num_layers)
    run_dir = make_run_dir(cfg, "infer")
    model = ck.model.to(device)
    n = graph.num_nodes
    with metered() as meter:
        t0 = time.time()
        indptr, indices = open_csc(graph)
        changes = read_changes(opts.changes, graph)
        old_delta = GraphDelta.load(base / "graph_delta.npz")
        delta, rep = old_delta.apply(changes, graph, indptr, indices)
        adj = delta.adjacency(indptr, indices)
        rows = affected_rows(
            model.arch,
            model.num_layers,
            adj,
            rep["changed_feat_nodes"],
            rep["changed_src"],
            rep["changed_dst"],
        )
        plan_s = time.time() - t0
        affected = [
            {"layer": i + 1, "rows": int(len(r)), "fraction": round(len(r) / n, 6)}
            for i, r in enumerate(rows)
        ]
        info(
            "rows to recompute per layer: "
            + ", ".join(f"layer {a['layer']}: {a['rows']:,} ({a['fraction']:.1%})" for a in affected)
        )
        store = FeatureStore(graph)
        cache = base / binfo["cache"]["dir"]
        base_h = layer_paths(cache, model.num_layers)
        have_z = set(binfo["cache"].get("preact") or [])  # none in runs made before z was cached
        inputs = UpdateInputs(
            adj=adj,
            adj_old=old_delta.adjacency(indptr, indices),
            features=PatchedFeatures(store, delta),
            features_old=PatchedFeatures(store, old_delta),
            feat_changed=np.unique(rep["changed_feat_nodes"]),
            base_h=base_h,
            base_z=[preact_path(p) if preact_path(p).name in have_z else None for p in base_h],
        )
        layers = _compute_layers(model, adj, None, run_dir, n, opts, device, update=(inputs, rows))
        layers["compute_s"] += plan_s  # what the update costs against a full run
        for a, st in zip(affected, layers["stats"], strict=True):
            # Work follows edges, and nodes a change reaches are the well-connected ones (degree bias).
            a["edges"], a["edge_fraction"] = st.edges, round(st.edges / max(adj.num_edges, 1), 6)
        delta.save(run_dir / "graph_delta.npz")
        shutil.copyfile(opts.changes, run_dir / "changes.npz")
        applied = {k: v for k, v in rep.items() if not isinstance(v, np.ndarray)}
        out = _finish(
            run_dir,
            layers,
            ck,
            graph,
            opts,
            emb_layer,
            {
                "delta": {"file": "graph_delta.npz", **delta.summary()},
                "base_run": str(base.resolve()),
                "update": applied,
            },
        )
        graph_out = None
        if opts.write_graph:
            t1 = time.time()
            graph_out = str(write_updated_graph(graph, delta, opts.write_graph, overwrite=cfg.overwrite))
            info(f"updated graph written to {graph_out} ({time.time() - t1:.1f} s)")
    base_time = _base_infer_time(base)
    summary = _summary(
        "layerwise-update",
        cfg,
        ck,
        graph,
        layers,
        out,
        meter,
        base_run=str(base),
        changes=applied,
        affected=affected,
        plan_time_s=round(plan_s, 3),
        base_infer_time_s=base_time,
        speedup_vs_base=round(base_time / layers["compute_s"], 2) if base_time else None,
        updated_graph_dir=graph_out,
    )
    _report(summary, run_dir)
    return summary


def _base_infer_time(base: Path) -> float | None:
    try:
        s = json.loads((base / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return s.get("infer_time_s") if s.get("mode") == "layerwise" else None


# ---------------------------------------------------------------- sampled
def _run_sampled(
    cfg, opts, ck: LoadedCheckpoint, graph: GraphDir, emb_layer: int, run_dir: Path, device
) -> dict:
    nodes, what = resolve_nodes(opts.nodes, graph)
    fanouts = resolve_fanouts(list(opts.fanouts), ck.num_layers)
    info(f"sampled inference for {what} ({len(nodes):,}), fanouts {fanouts}")
    model = ck.model.to(device)
    set_sampling_threads(torch.get_num_threads())  # seeded draws that repeat in any process
    with metered() as meter:
        g = to_dgl_graph(graph)
        t0 = time.time()
        with make_progress() as bar:
            task = bar.add_task("sampled batches", total=len(nodes), extra="")
            emb, logits = sampled_infer(
                model,
                g,
                FeatureStore(graph),
                nodes,
                fanouts,
                emb_layer,
                opts.batch_size,
                int(cfg.seed),
                device,
                progress=lambda d, t: bar.update(task, completed=d),
            )
        compute_s = time.time() - t0
        t1 = time.time()
        from gnnscale.utils.atomic import atomic_path

        for name, arr in (("node_ids.npy", nodes), ("embeddings.npy", emb)):
            with atomic_path(run_dir / name) as tmp, open(tmp, "wb") as fh:
                np.save(fh, arr)
        files = write_predictions(logits, run_dir, opts.probabilities)
        pred = np.load(run_dir / "predictions.npy")
        metric = accuracy(pred, graph, opts.nodes if opts.nodes in ("train", "val", "test") else "all", nodes)
        emb_info = {
            "file": "embeddings.npy",
            "shape": list(emb.shape),
            "dtype": str(emb.dtype),
            "layer": emb_layer,
            "num_layers": ck.num_layers,
            "node_order": "row i is global node id node_ids.npy[i]",
            "mode": "sampled",
            "fanouts": fanouts,
            "seed": int(cfg.seed),
            "graph_dir": str(graph.path.resolve()),
            "graph_name": graph.meta["name"],
            "ckpt": str(ck.path.resolve()),
            "signature_hash": ck.signature_hash,
            "weights_hash": ck.weights_hash,
            "model_cfg": ck.model_cfg,
            "model_cfg_hash": config_hash(ck.model_cfg),
            "cache": None,
        }
        write_json(run_dir / EMB_INFO, emb_info)
        publish_s = time.time() - t1
    summary = {
        "stage": "infer",
        "mode": "sampled",
        "ckpt": str(ck.path),
        "graph_dir": str(graph.path),
        "num_nodes": int(len(nodes)),
        "nodes": what,
        "num_layers": ck.num_layers,
        "fanouts": fanouts,
        "batch_size": int(opts.batch_size),
        "infer_time_s": round(compute_s, 3),
        "nodes_per_s": round(len(nodes) / max(compute_s, 1e-9)),
        "publish_time_s": round(publish_s, 3),
        "embeddings": {"shape": list(emb.shape), "layer": emb_layer},
        "files": {"node_ids": "node_ids.npy", "embeddings": "embeddings.npy", **files},
        "metric": metric,
        "test_acc": metric["accuracy"] if metric and metric["split"] == "test" else None,
        **meter.stats(),
    }
    _report(summary, run_dir)
    return summary
