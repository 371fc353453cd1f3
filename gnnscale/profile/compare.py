"""The sampler comparison (`profile.compare_samplers`): the design notes' "run a small comparison first",
automated. Each formation's preset trains `profile.compare_epochs` epochs on the graph (the stage runs
them); this module turns their run folders into one table and picks the winner."""

from __future__ import annotations

import json
import math
from pathlib import Path


def comparison_row(kind: str, preset: str, run_dir: Path, summary: dict) -> dict:
    """One formation's line: its loss curve, validation metric, epoch time and nodes per batch."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metric = summary["metric"]
    return {
        "sampler": kind,
        "preset": preset,
        "loss_curve": [r["loss"] for r in rows],
        f"val_{metric}": summary.get(f"best_val_{metric}"),
        "epoch_time_s": summary.get("epoch_time_s"),
        "seeds_per_s": summary.get("seeds_per_s"),
        "input_nodes_per_batch": rows[-1].get("input_nodes_per_batch"),
        "batches_per_epoch": rows[-1].get("steps"),
        "run_dir": str(run_dir),
    }


def pick_winner(rows: list[dict], metric: str, tolerance: float = 0.005) -> dict:
    """The best validation metric; formations within `tolerance` of it count as tied and the fastest
    epoch among them wins (a point of accuracy is worth more than time, half a point of noise is not)."""
    key = f"val_{metric}"
    scored = [r for r in rows if r.get(key) is not None and not math.isnan(r[key])]
    if not scored:
        return {"sampler": None, "reason": "no formation produced a validation metric"}
    best = max(r[key] for r in scored)
    tied = [r for r in scored if r[key] >= best - tolerance]
    winner = min(tied, key=lambda r: r["epoch_time_s"] or math.inf)
    others = [r["sampler"] for r in tied if r is not winner]
    reason = f"best {key} {winner[key]:.4f}" + (
        f"; tied within {tolerance} with {', '.join(others)}, and the fastest epoch" if others else ""
    )
    return {"sampler": winner["sampler"], "reason": reason}


def agreement(plan_formation: str, winner: str | None) -> str:
    """Whether the plan's advice and the comparison agree, and if not, why that can be."""
    if winner is None:
        return "no winner to compare with"
    if winner == plan_formation or (plan_formation == "distributed"):
        return "agrees with the plan" if winner == plan_formation else "the plan says one host is not enough"
    return (
        f"the plan advises {plan_formation}, the short comparison favours {winner}: the plan decides from "
        "memory and degree skew; a 1-2 epoch comparison measures early accuracy and speed on this graph, "
        "so trust it for graphs like this one and the plan for graphs too big to compare on"
    )
