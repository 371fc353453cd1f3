"""The sampler comparison (`profile.compare_samplers`): the design notes' "run a small comparison first",
automated. Each formation's preset trains `profile.compare_epochs` epochs on the graph (the stage runs
them); this module says how long each runs, turns their run folders into one table and picks the winner.

Full-graph training takes one optimizer step per epoch where a sampled formation takes one per batch,
so the comparison gives it as many epochs as neighbour sampling has steps: equal steps, not equal
epochs, or it would be judged after one gradient step. The winner is the best validation metric;
within `tolerance` of it, the shortest training time (not the epoch time: the full-graph runs more
epochs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

TOLERANCE = 0.005  # half a point of a validation metric is noise in a 1-2 epoch comparison


def comparison_epochs(kind: str, compare_epochs: int, num_train: int, batch_size: int) -> int:
    """Epochs for one formation: compare_epochs, times neighbour sampling's steps per epoch for `full`."""
    if kind == "full":
        return int(compare_epochs) * max(1, math.ceil(num_train / max(int(batch_size), 1)))
    return int(compare_epochs)


def comparison_overrides(cfg, preset: str, run_dir: Path, epochs: int) -> list[str]:
    """The train stage's overrides for one formation: its preset on this graph, short, seeded as the
    profile, every epoch evaluated, no early stop, no diagnostics (their probes would tilt the times)."""
    return [
        f"+exp={preset}",
        f"graph_dir={cfg.graph_dir}",
        f"run_dir={run_dir}",
        "overwrite=true",
        f"seed={cfg.seed}",
        f"train.epochs={int(epochs)}",
        "train.eval_every=1",
        "train.patience=0",
        "train.diagnostics=false",
        f"train.metric={cfg.train.metric}",
        f"train.device={cfg.train.device}",
    ]


def comparison_row(kind: str, preset: str, run_dir: Path, summary: dict) -> dict:
    """One formation's line: its loss curve, validation metric, epoch and training time, nodes per batch."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metric = summary["metric"]
    return {
        "sampler": kind,
        "preset": preset,
        "epochs": len(rows),
        "steps": sum(int(r.get("steps") or 0) for r in rows),
        "loss_curve": [r["loss"] for r in rows],
        f"val_{metric}": summary.get(f"best_val_{metric}"),
        "epoch_time_s": summary.get("epoch_time_s"),
        "train_time_s": round(sum(float(r.get("epoch_time_s") or 0.0) for r in rows), 4),
        "seeds_per_s": summary.get("seeds_per_s"),
        "input_nodes_per_batch": rows[-1].get("input_nodes_per_batch"),
        "batches_per_epoch": rows[-1].get("steps"),
        "run_dir": str(run_dir),
    }


def pick_winner(rows: list[dict], metric: str, tolerance: float = TOLERANCE) -> dict:
    """The best validation metric; formations within `tolerance` of it count as tied and the shortest
    training time among them wins (a point of accuracy is worth more than time, half a point of noise
    is not)."""
    key = f"val_{metric}"
    scored = [r for r in rows if r.get(key) is not None and not math.isnan(r[key])]
    if not scored:
        return {"sampler": None, "reason": "no formation produced a validation metric"}
    best = max(r[key] for r in scored)
    tied = [r for r in scored if r[key] >= best - tolerance]
    winner = min(tied, key=lambda r: r["train_time_s"] if r["train_time_s"] is not None else math.inf)
    others = [r["sampler"] for r in tied if r is not winner]
    reason = f"best {key} {winner[key]:.4f}" + (
        f"; tied within {tolerance} with {', '.join(others)}, and the shortest training" if others else ""
    )
    return {"sampler": winner["sampler"], "reason": reason, "tied": others}


def agreement(plan_formation: str, winner: dict, rows: list[dict], metric: str) -> str:
    """Whether the plan's advice and the comparison agree, and if not, why, in this comparison's numbers."""
    name = winner.get("sampler")
    if name is None:
        return "no winner to compare with"
    if name == plan_formation:
        return f"agrees with the plan ({plan_formation})"
    if plan_formation == "distributed":
        return f"the plan says one host is not enough; of the single-host formations {name} did best"
    key = f"val_{metric}"
    by_kind = {r["sampler"]: r for r in rows}
    planned, best = by_kind.get(plan_formation), by_kind[name]
    if planned is None or planned.get(key) is None:
        return f"the plan advises {plan_formation}, which this comparison did not run; {name} won it"
    if plan_formation in winner.get("tied", ()):
        return (
            f"the plan's {plan_formation} tied with the winner {name} on {key} ({planned[key]:.4f} vs "
            f"{best[key]:.4f}) and trained in {planned['train_time_s']:.3g} s against {best['train_time_s']:.3g} s "
            f"for as many steps; the plan decides from memory and degree skew, not measured time"
        )
    return (
        f"the plan advises {plan_formation}, but here it reached {key} {planned[key]:.4f} against {name}'s "
        f"{best[key]:.4f} after {planned['steps']} vs {best['steps']} steps: on this graph the short comparison "
        f"favours {name}; the plan's rules stand for graphs too big to compare on"
    )
