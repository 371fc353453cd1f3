"""`infer --update changes.npz`: which base run to update, what the change reaches, and the update itself."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gnnscale.errors import ConfigError, DataError, GraphDirError
from gnnscale.inference.delta import GraphDelta, PatchedFeatures, read_changes, write_updated_graph
from gnnscale.inference.incremental import affected_rows
from gnnscale.inference.job import compute_layers, emb_layer, publish_layerwise
from gnnscale.inference.layerwise import layer_paths, preact_path
from gnnscale.inference.update import UpdateInputs, plan_methods, update_seconds
from gnnscale.models.checkpoint import LoadedCheckpoint, check_fits_graph, load_model
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import (
    EMB_INFO,
    RUNS_ROOT,
    cached_layerwise,
    find_checkpoint,
    keeps_layers,
    newest_run,
    read_json,
    read_summary,
)
from gnnscale.utils.ui import info

DELTA_FILE, CHANGES_FILE = "graph_delta.npz", "changes.npz"


def load_base(spec) -> tuple[Path, dict]:
    """infer.base (default: the newest layer-wise run that kept its layers) and its emb_info."""
    base = Path(spec) if spec else newest_run("infer", cached_layerwise)
    if base is None:
        raise ConfigError(
            f"no layer-wise infer run with cached layers under {RUNS_ROOT / 'infer'}/",
            "run `gnnscale infer --layerwise` first, or pass infer.base=RUN_DIR",
        )
    meta = read_json(base / EMB_INFO)
    if meta is None:
        raise ConfigError(
            f"infer.base='{base}' is not a finished infer run (no {EMB_INFO})",
            "pass infer.base= a run_dir of `gnnscale infer --layerwise`",
        )
    if not keeps_layers(meta):
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


@dataclass
class UpdateJob:
    base: Path
    base_info: dict
    ck: LoadedCheckpoint
    graph: GraphDir
    layer: int  # the layer embeddings.npy holds


def open_update(ckpt_spec, graph_dir_spec, opts) -> UpdateJob:
    """The base run, its model and its graph, each checked to be the ones the cached layers came from."""
    base, binfo = load_base(opts.base)
    ck = load_model(find_checkpoint(ckpt_spec or binfo["ckpt"]))
    if ck.weights_hash != binfo["weights_hash"]:
        raise ConfigError(
            f"checkpoint {ck.path} is not the model of base run '{base}' (cached layers need the same weights)",
            f"drop ckpt= to use {binfo['ckpt']}, or run a full `gnnscale infer --layerwise`",
        )
    graph_dir = Path(binfo["graph_dir"])
    if graph_dir_spec and Path(graph_dir_spec).resolve() != graph_dir:
        raise ConfigError(
            f"graph_dir={graph_dir_spec} differs from base run's graph {graph_dir}",
            "drop graph_dir= (an update applies to the base run's graph)",
        )
    graph = GraphDir(graph_dir)
    if [s["sha256"] for s in graph.meta["shards"]] != binfo["graph_shards_sha256"]:
        raise GraphDirError(
            f"graph_dir '{graph_dir}' changed since base run '{base}'",
            "run a full `gnnscale infer --layerwise` on it first",
        )
    check_fits_graph(ck, graph)
    if ck.degree_feature:  # an edge change moves its endpoints' degree column: every layer's rows shift
        raise ConfigError(
            f"checkpoint {ck.path} was trained with model.degree_feature: --update cannot patch its layers",
            "run a full `gnnscale infer --layerwise` on the changed graph",
        )
    layer = emb_layer(opts.layer if opts.layer is not None else binfo["layer"], ck.num_layers, ck.task)
    return UpdateJob(base, binfo, ck, graph, layer)


def run_update(job: UpdateJob, run_dir: Path, opts, device, overwrite: bool) -> tuple[dict, dict, dict]:
    """(layers, published outputs, summary fields of the update) for the base run plus opts.changes."""
    model, graph, n = job.ck.model.to(device), job.graph, job.graph.num_nodes
    t0 = time.time()
    indptr, indices = open_csc(graph)
    changes = read_changes(opts.changes, graph)
    old_delta = GraphDelta.load(job.base / DELTA_FILE)
    delta, rep = old_delta.apply(changes, graph, indptr, indices)
    adj = delta.adjacency(indptr, indices)
    rows = affected_rows(
        model.arch, model.num_layers, adj, rep["changed_feat_nodes"], rep["changed_src"], rep["changed_dst"]
    )
    plan_s = time.time() - t0
    affected = [
        {"layer": i + 1, "rows": int(len(r)), "fraction": round(len(r) / n, 6)} for i, r in enumerate(rows)
    ]
    info(
        "rows to recompute per layer: "
        + ", ".join(f"layer {a['layer']}: {a['rows']:,} ({a['fraction']:.1%})" for a in affected)
    )
    store = FeatureStore(graph)
    base_h = layer_paths(job.base / job.base_info["cache"]["dir"], model.num_layers)
    have_z = set(job.base_info["cache"].get("preact") or [])  # none in runs made before z was cached
    inputs = UpdateInputs(
        adj=adj,
        adj_old=old_delta.adjacency(indptr, indices),
        features=PatchedFeatures(store, delta),
        features_old=PatchedFeatures(store, old_delta),
        feat_changed=np.unique(rep["changed_feat_nodes"]),
        base_h=base_h,
        base_z=[preact_path(p) if preact_path(p).name in have_z else None for p in base_h],
    )
    t1 = time.time()
    plan = plan_methods(model, inputs, rows, device)
    plan_s += time.time() - t1
    base_summary = read_summary(job.base) or {}  # its measured time: the price of a full run
    choice = _choose(
        base_summary, plan, rows, n=n, dims=model.dims, plan_s=plan_s, batch_size=int(opts.batch_size)
    )
    if choice["path"] == "full run":
        layers = compute_layers(model, adj, inputs.features, run_dir, num_nodes=n, opts=opts, device=device)
        layers["stats"] = [replace(st, method="full run") for st in layers["stats"]]
    else:
        layers = compute_layers(
            model, adj, None, run_dir, num_nodes=n, opts=opts, device=device, update=(inputs, rows, plan)
        )
    layers["compute_s"] += plan_s  # what the update costs against a full run
    for a, st in zip(affected, layers["stats"], strict=True):
        # Work follows edges, and nodes a change reaches are the well-connected ones (degree bias).
        a["edges"], a["edge_fraction"] = st.edges, round(st.edges / max(adj.num_edges, 1), 6)
    delta.save(run_dir / DELTA_FILE)
    shutil.copyfile(opts.changes, run_dir / CHANGES_FILE)
    applied = {k: v for k, v in rep.items() if not isinstance(v, np.ndarray)}
    extra_info = {
        "delta": {"file": DELTA_FILE, **delta.summary()},
        "base_run": str(job.base.resolve()),
        "update": applied,
    }
    out = publish_layerwise(run_dir, layers, job.ck, graph, opts=opts, layer=job.layer, extra_info=extra_info)
    graph_out = None
    if opts.write_graph:
        t1 = time.time()
        graph_out = str(write_updated_graph(graph, delta, opts.write_graph, overwrite=overwrite))
        info(f"updated graph written to {graph_out} ({time.time() - t1:.1f} s)")
    base_time = base_summary.get("infer_time_s") if base_summary.get("mode") == "layerwise" else None
    fields = {
        "base_run": str(job.base),
        "changes": applied,
        "affected": affected,
        "plan_time_s": round(plan_s, 3),
        "choice": choice,
        "base_infer_time_s": base_time,
        "speedup_vs_base": round(base_time / layers["compute_s"], 2) if base_time else None,
        "updated_graph_dir": graph_out,
    }
    return layers, out, fields


def _choose(s: dict, plan, rows, *, n: int, dims, plan_s: float, batch_size: int) -> dict:
    """Update layer by layer, or compute every layer afresh on the updated graph (a full run), whichever
    is estimated faster: a change that reaches most rows costs an update more than the base run took.
    A full run in the base run's batches gives the rows the change did not reach bit for bit as the
    base run has them, as an update does; in other batches it may not, so it is not offered then.
    s: the base run's summary."""
    layers = s.get("layers") or []
    if s.get("mode") != "layerwise" or any("method" in x for x in layers) or not s.get("infer_time_s"):
        return {"path": "update", "why": "the base run is no full layer-wise run whose time can be compared"}
    if s.get("batch_size") != batch_size:
        return {
            "path": "update",
            "why": f"the base run's batches were {s.get('batch_size')} rows, not {batch_size}",
        }
    full_s = s["infer_time_s"]
    est = update_seconds(plan, n, dims, rows, [x["seconds"] for x in layers])
    if est is None:
        return {"path": "update", "why": "a layer recomputes scattered rows, which has no measured price"}
    path = "full run" if est + plan_s > full_s else "update"
    info(
        f"update estimated at {est + plan_s:.2f} s against {full_s:.2f} s for the base run's full pass: "
        + ("computing every layer afresh on the updated graph" if path == "full run" else "updating")
    )
    return {"path": path, "estimated_update_s": round(est + plan_s, 3), "full_run_s": full_s}
