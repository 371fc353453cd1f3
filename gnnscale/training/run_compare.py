"""Train runs side by side (`gnnscale compare`): what their configs disagree on and what they reached, read
from each run_dir's config.yaml, summary.json and metrics.jsonl (an unfinished run has no summary: its
columns say so and show what its metrics lines hold)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from gnnscale.errors import DataError
from gnnscale.storage.run_dir import CONFIG, METRICS, SUMMARY, read_metrics, read_summary

# Keys that say where or how a run was started, not what it trained: they differ between any two runs.
_IGNORED = ("run_dir", "resume", "overwrite", "cli_overrides", "ui.")


@dataclass
class Run:
    label: str
    path: Path
    config: dict  # dotted key -> value
    summary: dict | None
    records: list[dict]
    metric: str


def load_run(path: str | Path) -> Run:
    folder = Path(path)
    if not (folder / CONFIG).is_file() or not ((folder / SUMMARY).is_file() or (folder / METRICS).is_file()):
        raise DataError(
            f"'{folder}' is not a train run folder (it needs {CONFIG} and {SUMMARY} or {METRICS})",
            "pass train run_dirs, e.g. `gnnscale compare runs/train/A runs/train/B`",
        )
    try:
        config = _flatten(OmegaConf.to_container(OmegaConf.load(folder / CONFIG), resolve=False))
    except Exception as exc:  # a hand-edited or truncated file: name it rather than fail in yaml's words
        raise DataError(
            f"cannot read {folder / CONFIG}: {exc}", "pass a train run_dir gnnscale wrote"
        ) from None
    summary, records = read_summary(folder), read_metrics(folder)
    return Run(str(folder), folder, config, summary, records, _metric(config, summary, records))


def _metric(config: dict, summary: dict | None, records: list[dict]) -> str:
    if summary and summary.get("metric"):
        return str(summary["metric"])
    if config.get("task.name") == "link" and config.get("task.metric"):
        return str(config["task.metric"])
    seen = [k[4:] for r in records for k in r if k.startswith("val_") and k != "val_loss"]
    return seen[0] if seen else str(config.get("train.metric", "acc"))


def _flatten(node, prefix: str = "") -> dict:
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}{key}" if not prefix else f"{prefix}.{key}"))
    return out


def short_labels(runs: Sequence[Run]) -> None:
    """Each run's folder name when those differ, else the paths as given."""
    names = [r.path.name for r in runs]
    if len(set(names)) == len(names):
        for run, name in zip(runs, names, strict=True):
            run.label = name


def config_differences(runs: Sequence[Run]) -> dict[str, list]:
    """key -> each run's value, for the keys whose values are not all equal (absent = None)."""
    keys = []
    for run in runs:
        keys += [k for k in run.config if k not in keys]
    out = {}
    for key in keys:
        if key.startswith(_IGNORED):
            continue
        values = [run.config.get(key) for run in runs]
        if any(v != values[0] for v in values[1:]):
            out[key] = values
    return out


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return round(statistics.median(values), 4) if values else None


def results(run: Run) -> dict:
    """The run's final metrics, epochs, epoch time and peak memory (from its metrics lines when unfinished)."""
    s, records = run.summary, run.records
    if s is None:
        peaks = [r["peak_rss_mb"] for r in records if isinstance(r.get("peak_rss_mb"), (int, float))]
        return {
            "status": f"unfinished ({len(records)} epochs)",
            f"best val_{run.metric}": max(
                (r[f"val_{run.metric}"] for r in records if r.get(f"val_{run.metric}") is not None),
                default=None,
            ),
            "epochs run": len(records),
            "epoch time (median, s)": _median(records, "epoch_time_s"),
            "seeds/s (median)": _median(records, "seeds_per_s"),
            "peak RSS (MB)": max(peaks, default=None),
        }
    out = {"status": "finished" + (" (early stop)" if s.get("early_stopped") else "")}
    for key, value in s.items():
        if key.startswith(("val_", "test_", "best_val_")) and (
            value is None or isinstance(value, (int, float))
        ):
            out[key] = value
    out.update(
        {
            "best epoch": s.get("best_epoch"),
            "epochs run": s.get("epochs_run"),
            "epoch time (median, s)": s.get("epoch_time_s"),
            "seeds/s (median)": s.get("seeds_per_s"),
            "peak RSS (MB)": s.get("peak_rss_mb"),
        }
    )
    if s.get("peak_gpu_mb") is not None:
        out["peak GPU (MB)"] = s["peak_gpu_mb"]
    out["wall time (s)"] = s.get("wall_time_s")
    return out


def comparison(runs: Sequence[Run]) -> dict:
    """{"runs": paths, "differences": key -> values, "results": row -> values} (values in run order)."""
    per_run = [results(run) for run in runs]
    rows: list[str] = []
    for r in per_run:
        rows += [k for k in r if k not in rows]
    return {
        "runs": [str(run.path) for run in runs],
        "labels": [run.label for run in runs],
        "differences": config_differences(runs),
        "results": {row: [r.get(row) for r in per_run] for row in rows},
    }
