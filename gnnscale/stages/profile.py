"""`gnnscale profile`: the plan (memory, batch sizes, the recommended formation) from the files alone;
with profile.measure=true timed training steps against the gather and matmul bounds and the batch-size
doubling test. Writes profile.json and PNG plots into the run folder. The pieces live in gnnscale/profile/;
this stage composes them and renders."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from gnnscale.profile import plots
from gnnscale.profile.plan import make_plan
from gnnscale.stages.common import cpu_count, metered
from gnnscale.storage.run_dir import make_run_dir, write_summary
from gnnscale.training.data import load_train_data
from gnnscale.training.options import pick_device
from gnnscale.utils.atomic import write_json
from gnnscale.utils.memlimit import resolve_budget
from gnnscale.utils.ui import info, summary_table


def run(cfg: DictConfig) -> dict:
    opts = cfg.profile
    torch.set_num_threads(int(cfg.train.num_threads) or cpu_count())
    budget = resolve_budget(opts.memory_budget, "profile.memory_budget")
    run_dir = make_run_dir(cfg, "profile")
    with metered() as meter:
        report = {"plan": make_plan(cfg, budget)}
        if opts.measure and float(opts.num_nodes) <= 0:
            report["measured"] = _measure(cfg, run_dir)
    report["recommendation"] = report["plan"]["recommendation"]
    report["stage_stats"] = meter.stats()
    if opts.plots:
        report["plots"] = [str(p) for p in _plots(run_dir, report)]
    write_json(run_dir / "profile.json", report)
    write_summary(run_dir, {"stage": "profile", "recommendation": report["recommendation"]})
    summary_table(
        f"profile: {cfg.graph_dir if float(opts.num_nodes) <= 0 else 'described graph'}", _rows(report)
    )
    for reason in report["recommendation"]["reasons"]:
        info(f"  - {reason}")
    info(f"profile: {run_dir / 'profile.json'}")
    return {**report, "run_dir": str(run_dir)}


def _measure(cfg: DictConfig, run_dir: Path) -> dict:
    from gnnscale.profile.measure import (
        bounds,
        doubling_test,
        measure_steps,
        measured_shape,
        projection_shapes,
    )
    from gnnscale.profile.micro import gather_bandwidth, matmul_flops

    device = pick_device(cfg.train.device)
    data = load_train_data(cfg.graph_dir)
    trace = run_dir / "trace.json" if cfg.profile.trace else None
    m = measure_steps(cfg, data, device, int(cfg.profile.num_batches), trace_path=trace)
    shape = measured_shape(m)
    bw = gather_bandwidth(data.features, rows=shape.input_rows)
    flops = matmul_flops(device, projection_shapes(shape, m["dims"]))
    return {
        "steps": m,
        "gather_bandwidth": bw,
        "matmul": flops,
        "bounds": bounds(m, bw, flops),
        "doubling": doubling_test(cfg, data, device, int(cfg.profile.num_batches), at_b=m),
    }


def _plots(run_dir: Path, report: dict) -> list[Path]:
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


def _rows(report: dict) -> dict:
    plan, rec = report["plan"], report["recommendation"]
    rows = {
        "recommended formation": f"{rec['formation']} (+exp={rec.get('preset')})",
        "budget": f"{plan['budget']['gb']} GB ({plan['budget']['why']})",
        "full-graph training (predicted)": f"{plan['full_graph']['total_gb']} GB",
        "mini-batch peak (predicted)": f"{plan['minibatch']['predicted_peak']['anon_bytes'] / 2**30:.2f} GB",
        "largest fitting": str(rec.get("largest_fitting")),
    }
    measured = report.get("measured")
    if measured:
        steps = measured["steps"]
        rows["measured seeds/s"] = round(steps["seeds_per_s"])
        rows["time split (ms/batch)"] = " ".join(
            f"{k[:-2]} {v * 1000:.1f}" for k, v in steps["split_s"].items()
        )
        rows["closest bound"] = measured["bounds"]["summary"]
        rows["batch doubling"] = measured["doubling"]["verdict"]
    return rows
