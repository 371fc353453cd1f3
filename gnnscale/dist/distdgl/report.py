"""A DistDGL train run's summary.json and table: trainer rank 0's result, in the single-process keys
(training/report.py), plus how the job was spread and what the DistTensor layer-wise inference scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from gnnscale.dist.distdgl.trainer import LAYERS_DIR, RESULT
from gnnscale.errors import DataError
from gnnscale.storage.run_dir import BEST, LAST, checkpoint_file, write_summary
from gnnscale.tasks.metrics import compute_metric, finite_or_none
from gnnscale.training.report import summary_rows
from gnnscale.utils.ui import info, summary_table


def compose_summary(
    cfg: DictConfig, graph, run_dir: Path, machines: list, part_config: Path, few_labels: dict, wall_s: float
) -> dict:
    path = run_dir / RESULT
    if not path.is_file():
        raise DataError(
            f"the DistDGL trainers ended without writing {path}", f"see the logs in {run_dir / 'logs'}"
        )
    r = json.loads(path.read_text())
    m = str(cfg.train.metric)
    layer_files = [Path(p) for p in r["layer_files"]]
    layer_test = layerwise_metric(graph, layer_files[-1], m)
    best = checkpoint_file(run_dir, BEST)
    d = cfg.dist
    summary = {
        "stage": "train",
        "graph_dir": str(cfg.graph_dir),
        "graph": str(graph.meta["name"]),
        "metric": m,
        f"val_{m}": finite_or_none(r["val"][m]),
        f"test_{m}": finite_or_none(r["test"][m]),
        f"best_val_{m}": r["best_val"],
        "test_loss": finite_or_none(r["test"]["loss"]),
        "best_epoch": r["best_epoch"],
        "epochs_run": r["epochs_run"],
        "early_stopped": r["stopped"],
        "resumed_from_epoch": None,
        "epoch_time_s": r["epoch_time_s"],
        "time_split_s": r["time_split_s"],
        "seeds_per_s": r["seeds_per_s"],
        "num_params": r["num_params"],
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "sampler": OmegaConf.to_container(cfg.sampler, resolve=True),
        "fanouts": list(cfg.sampler.fanouts),
        "batch_size": int(cfg.train.batch_size),
        "phases": None,
        "diagnostics": None,
        "warnings": [],
        "feature_cache": "distdgl servers",
        "precision": str(cfg.precision.dtype),
        "device": "cpu",
        "few_labels_applied": few_labels,
        "dist": {
            "kind": "distdgl",
            "machines": [m_.ip for m_ in machines],
            "num_trainers": int(d.num_trainers),
            "num_servers": int(d.num_servers),
            "num_samplers": int(d.num_samplers),
            "world_size": r["world_size"],
            "part_config": str(part_config),
            "batch_size_per_trainer": r["batch_size_per_trainer"],
            "steps_per_epoch": r["steps_per_epoch"],
            "seeds_per_trainer": r["seeds_per_trainer"],
            "logs": str(run_dir / "logs"),
        },
        # Exact full-neighbour outputs of every node, computed into DistTensors (row i = graph_dir node i).
        "layerwise": {
            "files": [str(p) for p in layer_files],
            "seconds": r["layer_seconds"],
            f"test_{m}": layer_test,
        },
        f"layerwise_test_{m}": layer_test,
        "peak_rss_mb": r["peak_rss_mb_rank0"],
        "wall_time_s": round(wall_s, 2),
        "checkpoint": str(best if best.is_file() else checkpoint_file(run_dir, LAST)),
    }
    write_summary(run_dir, summary)
    rows = summary_rows(summary)
    rows[f"layer-wise test {m} (DistTensor)"] = "n/a" if layer_test is None else f"{layer_test:.4f}"
    rows["machines x trainers"] = (
        f"{len(machines)} x {d.num_trainers} (batch {r['batch_size_per_trainer']} each)"
    )
    summary_table(f"train dist=distdgl: {cfg.model.arch} on {summary['graph']} -> {run_dir}", rows)
    info(
        f"summary: {run_dir / 'summary.json'}   checkpoint: {summary['checkpoint']}   layers: {run_dir / LAYERS_DIR}"
    )
    return {**summary, "run_dir": str(run_dir)}


def layerwise_metric(graph, last_layer: Path, metric: str) -> float | None:
    """The test metric of the final layer's outputs (the logits), as `gnnscale infer` scores them."""
    labels = graph.labels().long()
    ids = graph.split_ids("test")
    ids = ids[labels[ids] >= 0]
    if not len(ids):
        return None
    logits = torch.from_numpy(np.asarray(np.load(last_layer, mmap_mode="r")[ids.numpy()]))
    return finite_or_none(compute_metric(metric, logits, labels[ids], int(graph.meta["num_classes"])))


def few_labels_line(cfg: DictConfig, num_train: int, applied: dict, kept: list) -> str:
    below = cfg.train.few_labels.below
    return (
        f"few labelled training nodes ({num_train:,} < train.few_labels.below={below:,}): using "
        + " ".join(f"{k}={v}" for k, v in applied.items())
        + (f" (kept yours: {' '.join(kept)})" if kept else "")
    )
