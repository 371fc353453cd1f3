"""Training curves as PNGs (matplotlib, Agg backend: no display needed), drawn from metrics.jsonl records so
a resumed run's picture holds every epoch, those before the resume included."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gnnscale.utils.atomic import atomic_path

CURVES_FILE = "curves.png"
DPI = 100
CURVES_INCHES = (8, 8)  # -> 800 x 800 pixels
OVERLAY_INCHES = (8, 5)  # -> 800 x 500 pixels


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path) as tmp:  # a viewer refreshing it mid-run never reads half a picture
        fig.savefig(tmp, format="png", dpi=DPI)  # no bbox "tight": the size stays the one asked for
    plt.close(fig)
    return path


def _series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["epoch"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [e for e, _ in pairs], [v for _, v in pairs]


def phase_starts(records: Sequence[dict]) -> list[tuple[int, int]]:
    """(first epoch, phase) of every phase after the first (train.phases records say their phase)."""
    starts, previous = [], None
    for r in records:
        phase = r.get("phase")
        if phase is not None and previous is not None and phase != previous:
            starts.append((int(r["epoch"]), int(phase)))
        previous = phase if phase is not None else previous
    return starts


def draw_curves(path: Path, records: Sequence[dict], metric: str, title: str) -> Path:
    """Loss (train, and val where evaluated), the val metric and seeds/s per epoch, one panel each, with a
    dashed line where each phase of train.phases begins."""
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=CURVES_INCHES, dpi=DPI, sharex=True)
    panels = (
        (axes[0], (("loss", "train loss"), ("val_loss", "val loss")), "loss"),
        (axes[1], ((f"val_{metric}", f"val {metric}"),), f"val {metric}"),
        (axes[2], (("seeds_per_s", "seeds/s"),), "seeds/s"),
    )
    for ax, series, ylabel in panels:
        drawn = False
        for key, label in series:
            x, y = _series(records, key)
            if x:
                ax.plot(x, y, marker="o", markersize=3, label=label)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", va="center", alpha=0.6)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        for epoch, phase in phase_starts(records):
            ax.axvline(epoch - 0.5, color="grey", linestyle="--", linewidth=1)
            ax.text(
                epoch - 0.5, 1.0, f" phase {phase}", transform=ax.get_xaxis_transform(), va="top", fontsize=8
            )
    if len(_series(records, "val_loss")[0]):
        axes[0].legend(fontsize=8)
    axes[2].set_xlabel("epoch")
    axes[0].set_title(title)
    return _save(plt, fig, path)


def draw_val_overlay(path: Path, runs: Sequence[tuple[str, Sequence[dict], str]]) -> Path:
    """Each run's validation metric per epoch on one axes; runs: (label, metrics.jsonl records, metric)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=OVERLAY_INCHES, dpi=DPI)
    metrics = {metric for _, _, metric in runs}
    for label, records, metric in runs:
        x, y = _series(records, f"val_{metric}")
        ax.plot(x, y, marker="o", markersize=3, label=label if len(metrics) == 1 else f"{label} ({metric})")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"val {next(iter(metrics))}" if len(metrics) == 1 else "val metric (each run's own)")
    ax.set_title("validation curves")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)
