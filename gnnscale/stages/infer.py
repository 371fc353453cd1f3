"""`gnnscale infer`: a train checkpoint -> embeddings and predictions.

--layerwise (default): every node's exact embedding, one layer at a time over all nodes, each layer's
  output a memory-mapped .npy in run_dir/layers/ (kept for --update), RAM bounded by one batch.
--sampled: a node subset (infer.nodes) through sampled neighbourhoods (infer.fanouts); fast, approximate.
--update changes.npz: reuse a layer-wise run's cached layers and recompute only the affected rows.
The work is in gnnscale/inference/ (job.py, update_run.py, sampled.py); this stage composes and reports.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from gnnscale.config.schema import InferOptions
from gnnscale.inference.blocks import Adjacency
from gnnscale.inference.job import (
    check_options,
    compute_layers,
    emb_layer,
    input_features,
    layerwise_summary,
    message_passing_csc,
    open_graph,
    pick_device,
    publish_layerwise,
    summary_rows,
)
from gnnscale.inference.sampled import run_sampled
from gnnscale.inference.update_run import open_update, run_update
from gnnscale.models.checkpoint import load_model
from gnnscale.stages.common import metered, stage_options
from gnnscale.storage.run_dir import EMB_INFO, SUMMARY, find_checkpoint, make_run_dir, write_summary
from gnnscale.storage.verify import verify_graph_dir
from gnnscale.utils.diskspace import ensure_space
from gnnscale.utils.ui import info, summary_table


def run(cfg: DictConfig) -> dict:
    opts = stage_options(cfg, "infer", InferOptions, check_options)
    if opts.num_threads > 0:
        torch.set_num_threads(int(opts.num_threads))
    device = pick_device(opts.device)
    if opts.changes:
        return _update(cfg, opts, device)
    ck = load_model(find_checkpoint(cfg.get("ckpt")))
    graph = open_graph(cfg.get("graph_dir") or ck.graph.get("graph_dir"), ck)
    verify_graph_dir(graph.path, cfg.verify, meta=graph.meta)  # exit 2 naming a bad file
    layer = emb_layer(opts.layer, ck.num_layers, ck.task)
    run_dir = make_run_dir(cfg, "infer")
    if opts.mode == "sampled":
        with metered() as meter:
            summary = run_sampled(ck, graph, layer, run_dir, opts, int(cfg.seed), device)
        return _report({**summary, **meter.stats()}, run_dir)
    ensure_space(run_dir, _disk_bytes(ck, graph, opts))  # mapped writes: refuse up front
    with metered() as meter:
        indptr, indices = message_passing_csc(graph, ck, opts.edge_split)
        model = ck.model.to(device)
        adj, features = Adjacency(indptr, indices), input_features(graph, ck, indptr)
        layers = compute_layers(
            model, adj, features, run_dir, num_nodes=graph.num_nodes, opts=opts, device=device
        )
        split = {"edge_split": opts.edge_split} if opts.edge_split else {}
        out = publish_layerwise(
            run_dir, layers, ck, graph, opts=opts, layer=layer,
            extra_info={"delta": None, "base_run": None, **split},
        )  # fmt: skip
    return _report(layerwise_summary("layerwise", ck, graph, layers, out, meter.stats()), run_dir)


def _disk_bytes(ck, graph, opts) -> int:
    """About what a layer-wise run writes: every layer's rows (or only the embedding layer's), predictions,
    and for a reordered graph_dir the embeddings' copy in the user's node order."""
    widths = [int(ck.model_cfg.get("hidden", 0))] * (ck.num_layers - 1) + [ck.num_classes]
    rows = sum(widths) if opts.cache_layers else max(widths)
    copy = 0 if graph.node_order.identity else max(widths)
    return graph.num_nodes * (4 * (rows + copy) + 8)


def _update(cfg: DictConfig, opts, device) -> dict:
    job = open_update(cfg.get("ckpt"), cfg.get("graph_dir"), opts)
    verify_graph_dir(job.graph.path, cfg.verify, meta=job.graph.meta)
    run_dir = make_run_dir(cfg, "infer")
    with metered() as meter:
        layers, out, fields = run_update(job, run_dir, opts, device, bool(cfg.overwrite))
    summary = layerwise_summary("layerwise-update", job.ck, job.graph, layers, out, meter.stats(), **fields)
    return _report(summary, run_dir)


def _report(summary: dict, run_dir: Path) -> dict:
    write_summary(run_dir, summary)
    summary_table(
        f"infer --{summary['mode']}: {summary['ckpt']} on {summary['graph_dir']}", summary_rows(summary)
    )
    files = ", ".join(f.split(" ")[0] for f in summary["files"].values())
    info(f"outputs: {run_dir}  ({SUMMARY}, {files}, {EMB_INFO})")
    return {**summary, "run_dir": str(run_dir)}
