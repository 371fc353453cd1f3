"""How `gnnscale profile` shows its report: the summary table's rows, the comparison table, the PNGs."""

from __future__ import annotations

from pathlib import Path

from gnnscale.profile import plots
from gnnscale.profile.recommend import describe_fit
from gnnscale.utils.ui import grid_table, info


def show_comparison(c: dict) -> None:
    key = f"val_{c['metric']}"
    rows = [
        [
            r["sampler"],
            r[key],
            r["epochs"],
            r["train_time_s"],
            r["input_nodes_per_batch"],
            _curve(r["loss_curve"]),
        ]
        for r in c["rows"]
    ]
    header = ["sampler", key, "epochs", "train time (s)", "input nodes / batch", "train loss by epoch"]
    grid_table("sampler comparison", header, rows)
    info(f"comparison winner: {c['winner']['sampler']} ({c['winner']['reason']}); {c['agreement']}")


def _curve(losses: list[float], most: int = 6) -> str:
    """A loss curve in a table cell: every value, or `most` of them evenly spaced (first and last kept)."""
    if len(losses) > most:
        losses = [losses[round(i * (len(losses) - 1) / (most - 1))] for i in range(most)]
    return " > ".join(f"{v:.3g}" for v in losses)


def write_plots(run_dir: Path, report: dict) -> list[Path]:
    plan, out = report["plan"], []
    degrees = plan["graph"].get("degrees")
    if degrees:
        hist = degrees["hist"]
        out.append(
            plots.degree_distribution(run_dir / "degrees.png", hist["degree"], hist["nodes"], "in-degree")
        )
    curve = plan["minibatch"].get("memory_vs_fanout") or []
    if curve:
        out.append(
            plots.memory_vs_fanout(
                run_dir / "memory_vs_fanout.png",
                [r["label"] for r in curve],
                [r["per_batch_mb"] for r in curve],
                plan["budget"]["bytes"] / 2**20,
            )
        )
    measured = report.get("measured")
    if measured:
        steps = measured["steps"]
        out.append(plots.time_split(run_dir / "time_split.png", steps["split_s"], "time per batch"))
        planned = plan["minibatch"]["predicted_peak"]["anon_bytes"] / 2**20
        out.append(
            plots.planned_vs_measured(
                run_dir / "memory.png", {"mini-batch peak": (planned, steps.get("peak_anon_mb"))}, "memory"
            )
        )
    return out


def summary_rows(report: dict) -> dict:
    plan, rec = report["plan"], report["recommendation"]
    rows = {
        "recommended formation": f"{rec['formation']} ({rec.get('preset')})",
        "budget": f"{plan['budget']['gb']} GB ({plan['budget']['why']})",
        "full-graph training (predicted)": f"{plan['full_graph']['total_gb']} GB",
        "mini-batch peak (predicted)": f"{plan['minibatch']['predicted_peak']['anon_bytes'] / 2**30:.2f} GB",
        "largest fitting": describe_fit(rec["largest_fitting"]),
    }
    measured = report.get("measured")
    if plan.get("speed"):
        rows["predicted seeds/s"] = round(plan["speed"]["seeds_per_s"])
    ahead = plan.get("read_ahead")
    if ahead:
        rows["predicted seeds/s, features read from disk"] = (
            f"{round(ahead['seeds_per_s'])} (bound: {ahead['bound']}; {ahead['read_bytes_per_batch'] / 1e6:.0f} MB "
            f"read per batch at {ahead['disk'].get('sweep_mb_s_qd16') or ahead['disk']['seq_mb_s']:.0f} MB/s)"
        )
    if measured:
        steps = measured["steps"]
        rows["measured seeds/s"] = (
            f"{round(steps['seeds_per_s'])} (predicted/measured {measured['predicted_over_measured']})"
        )
        rows["time split (ms/batch)"] = " ".join(
            f"{k[:-2]} {v * 1000:.1f}" for k, v in steps["split_s"].items()
        )
        rows["closest bound"] = measured["bounds"]["summary"]
        rows["batch doubling"] = measured["doubling"]["verdict"]
    return rows
