"""`gnnscale compare RUN_DIR...`: train runs side by side — the config keys they differ in, their final
metrics, epoch time and peak memory — and one PNG of their validation curves overlaid. It reads the runs'
files only (config.yaml, summary.json, metrics.jsonl) and writes compare.json and val_curves.png."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gnnscale.errors import ConfigError
from gnnscale.storage.run_dir import new_run_path
from gnnscale.training.curves import draw_val_overlay
from gnnscale.training.run_compare import comparison, load_run, short_labels
from gnnscale.utils.atomic import write_json
from gnnscale.utils.ui import grid_table, info

PLOT, TABLE = "val_curves.png", "compare.json"


def run(run_dirs: Sequence[str], out: str | None = None) -> dict:
    """out: the folder for compare.json and val_curves.png (default runs/compare/<timestamp>)."""
    if not run_dirs:
        raise ConfigError(
            "no run folders to compare", "pass train run_dirs: gnnscale compare RUN_DIR RUN_DIR"
        )
    runs = [load_run(p) for p in run_dirs]
    short_labels(runs)
    table = comparison(runs)
    folder = Path(out) if out else new_run_path("compare")
    folder.mkdir(parents=True, exist_ok=True)
    plot = draw_val_overlay(folder / PLOT, [(r.label, r.records, r.metric) for r in runs])
    write_json(folder / TABLE, {**table, "plot": str(plot)})
    for run_ in runs:
        if run_.label != str(run_.path):
            info(f"{run_.label}: {run_.path}")
    differences = table["differences"]
    if not differences:
        info("the configs agree on every setting (where and how each run was started aside)")
    rows = [[key, *(_shown(v) for v in values)] for key, values in differences.items()]
    rows += [[key, *values] for key, values in table["results"].items()]
    grid_table(f"compare: {len(runs)} runs (config differences, then results)", ["", *table["labels"]], rows)
    info(f"val curves: {plot}   table: {folder / TABLE}")
    return {**table, "plot": str(plot), "run_dir": str(folder)}


def _shown(value):
    """A config value as the table shows it: absent keys say so, floats stay floats (the table rounds)."""
    if value is None:
        return "(unset)"
    return value if isinstance(value, float) else str(value)
