"""The profile's PNGs (matplotlib, Agg backend: no display needed). Each function draws one figure from
plain numbers and returns the file it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    return plt, fig, ax


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def degree_distribution(path: Path, degrees: Sequence[float], counts: Sequence[int], title: str) -> Path:
    """Node count per in-degree bin, log-log (a straight line is a power law)."""
    plt, fig, ax = _figure()
    pairs = [(d, c) for d, c in zip(degrees, counts, strict=True) if d > 0 and c > 0]
    ax.loglog([d for d, _ in pairs], [c for _, c in pairs], marker="o", linestyle="-", markersize=3)
    ax.set_xlabel("in-degree")
    ax.set_ylabel("nodes")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, path)


def time_split(path: Path, parts: dict, title: str) -> Path:
    """Seconds per batch in each part of a training step, one horizontal bar each."""
    plt, fig, ax = _figure()
    names = list(parts)
    ax.barh(names, [parts[n] * 1000 for n in names])
    ax.set_xlabel("ms per batch")
    ax.set_title(title)
    ax.invert_yaxis()
    return _save(plt, fig, path)


def planned_vs_measured(path: Path, rows: dict, title: str) -> Path:
    """Planned and measured memory side by side, in MB, for each label."""
    plt, fig, ax = _figure()
    labels = list(rows)
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [rows[k][0] for k in labels], width=0.4, label="planned")
    ax.bar([i + 0.2 for i in x], [rows[k][1] or 0 for k in labels], width=0.4, label="measured")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("MB")
    ax.set_title(title)
    ax.legend()
    return _save(plt, fig, path)


def memory_vs_fanout(path: Path, labels: Sequence[str], mb: Sequence[float], budget_mb: float | None) -> Path:
    """Planned per-batch memory as the fanouts grow, against the budget."""
    plt, fig, ax = _figure()
    ax.plot(list(labels), list(mb), marker="o")
    if budget_mb:
        ax.axhline(budget_mb, color="red", linestyle="--", label="budget")
        ax.legend()
    ax.set_xlabel("fanouts")
    ax.set_ylabel("MB per batch (planned)")
    ax.set_yscale("log")
    ax.set_title("memory vs fanout")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    return _save(plt, fig, path)
