"""A train run's summary.json and its table: the trainer's result plus the settings that produced it."""

from __future__ import annotations

import statistics

import torch
from omegaconf import DictConfig, OmegaConf

from gnnscale.tasks.metrics import finite_or_none
from gnnscale.training.data import TrainData
from gnnscale.training.diagnostics import last_values, summary_warnings
from gnnscale.training.loop import TIME_SPLIT
from gnnscale.training.trainer import FitResult, Trainer


def _median(records: list[dict], key: str) -> float | None:
    vals = [r[key] for r in records if r.get(key) is not None]
    return round(statistics.median(vals), 4) if vals else None


def train_summary(cfg: DictConfig, data: TrainData, trainer: Trainer, result: FitResult, **settings) -> dict:
    """settings: how the run was set up (precision, device, threads, prefetch, ...), recorded as given."""
    metric = trainer.task.metric
    summary = {
        "stage": "train",
        "graph_dir": str(cfg.graph_dir),
        "graph": data.name,
        "metric": metric,
        f"val_{metric}": finite_or_none(result.val[metric]),
        f"test_{metric}": finite_or_none(result.test[metric]),
        f"best_val_{metric}": finite_or_none(result.best_val),
        "test_loss": finite_or_none(result.test.get("loss")),
        "best_epoch": result.best_epoch,
        "epochs_run": len(result.records),
        "early_stopped": result.stopped,
        "resumed_from_epoch": result.resumed_from,
        "epoch_time_s": _median(result.records, "epoch_time_s"),
        "time_split_s": {k: _median(result.records, k) for k in TIME_SPLIT},
        "seeds_per_s": _median(result.records, "seeds_per_s"),
        "num_params": sum(p.numel() for p in trainer.model.parameters()),
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "sampler": OmegaConf.to_container(cfg.sampler, resolve=True),
        "fanouts": list(cfg.sampler.fanouts) if cfg.sampler.get("fanouts") is not None else None,
        "batch_size": int(cfg.train.batch_size),
        "phases": [
            {
                "epochs": [p.start_epoch, p.end_epoch],
                "batch_size": p.batch_size,
                "fanouts": list(p.fanouts) if p.fanouts is not None else None,
            }
            for p in trainer.s.phases
        ]
        or None,
        "diagnostics": last_values(result.records),
        "warnings": summary_warnings(result.records),
        "feature_cache": data.feature_cache,
        **settings,
        "checkpoint": str(result.checkpoint),
    }
    device = next(trainer.model.parameters()).device
    if device.type == "cuda":
        summary["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return summary


def summary_rows(s: dict) -> dict:
    """The table `gnnscale train` ends with."""
    m = s["metric"]

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    rows = {
        f"test {m}": fmt(s[f"test_{m}"]),
        f"val {m} (best epoch {s['best_epoch']})": fmt(s[f"val_{m}"]),
        "epochs run": f"{s['epochs_run']}{' (early stop)' if s['early_stopped'] else ''}",
        "epoch time (median, s)": s["epoch_time_s"] or 0.0,
        "seeds/s (median)": s["seeds_per_s"] or 0.0,
        "parameters": s["num_params"],
        "precision / device": f"{s['precision']} / {s['device']}",
        "peak RSS (MB)": s["peak_rss_mb"],
        "wall time (s)": s["wall_time_s"],
    }
    heuristics = s.get("test_heuristics")
    if heuristics:
        hm = m if m != "auc" else "mrr"  # heuristics are ranked, not scored: no ROC-AUC
        names = " / ".join(h.upper() for h in heuristics)
        rows[f"test {hm}: model / {names}"] = " / ".join(
            fmt(v) for v in (s.get(f"test_{hm}"), *(scores.get(hm) for scores in heuristics.values()))
        )
    diag = {k: v for k, v in (s.get("diagnostics") or {}).items() if v is not None}
    if diag:
        rows["health (last epoch)"] = "  ".join(f"{k.removeprefix('diag_')} {v:.3f}" for k, v in diag.items())
    if s.get("warnings"):
        rows["warnings"] = f"{len(s['warnings'])} (said above; listed in summary.json)"
    return rows


def read_stats(trainer, data) -> dict:
    """summary.json's `feature_reads` (feature_cache=read): batches through the sweep, rows read from disk,
    found held for other batches, given back (evicted) and deferred a pass, batches in flight, the sweep
    thread's CPU seconds, and the reader's requests and bytes, over the whole run."""
    sweeper = trainer.streams["train"][0].sweeper
    reader = dict(data.reader.stats)
    rows = sweeper.stats()
    useful = rows["rows_read"] * data.reader.row_bytes
    return {
        **rows,
        "reader": reader,
        "direct_io": bool(data.reader.direct),
        # bytes the requests covered per byte of the rows wanted (coalescing reads the gaps too)
        "read_amplification": round(reader["bytes_read"] / useful, 3) if useful else None,
    }
