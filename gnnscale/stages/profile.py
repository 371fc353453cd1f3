"""`gnnscale profile`: the plan (memory, batch sizes, predicted seeds/s, the recommended formation) from
the files alone; with profile.measure=true timed training steps against the gather and matmul bounds and
the batch-size doubling test; with profile.compare_samplers=true a short `gnnscale train` of every
formation's preset and the winner. Writes profile.json and PNG plots into the run folder. The pieces
live in gnnscale/profile/; this stage composes them and renders."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from gnnscale.config import compose_config
from gnnscale.errors import ConfigError
from gnnscale.pipeline.plan import partition_cfg, partition_needed
from gnnscale.profile.compare import (
    agreement,
    comparison_epochs,
    comparison_overrides,
    comparison_row,
    pick_winner,
)
from gnnscale.profile.plan import make_plan
from gnnscale.profile.report import show_comparison, summary_rows, write_plots
from gnnscale.sampling import PRESETS
from gnnscale.stages import partition as partition_stage
from gnnscale.stages import train as train_stage
from gnnscale.stages.common import cpu_count, metered
from gnnscale.storage.run_dir import make_run_dir, write_summary
from gnnscale.training.data import load_train_data
from gnnscale.training.options import pick_device
from gnnscale.utils.atomic import write_json
from gnnscale.utils.memlimit import resolve_budget
from gnnscale.utils.ui import info, summary_table


def run(cfg: DictConfig) -> dict:
    opts = cfg.profile
    _check_described(float(opts.num_nodes))
    torch.set_num_threads(int(cfg.train.num_threads) or cpu_count())
    budget = resolve_budget(opts.memory_budget, "profile.memory_budget")
    kinds = _compared_kinds(cfg) if opts.compare_samplers else []  # a bad name fails before the plan runs
    run_dir = make_run_dir(cfg, "profile")
    with metered() as meter:
        described = float(opts.num_nodes) > 0
        # opened once, as train opens it: for the plan and for the timed steps
        data = None if described else load_train_data(cfg.graph_dir, degree_feature=cfg.model.degree_feature)
        report = {"plan": make_plan(cfg, budget, data)}
        if opts.measure and not described:
            report["measured"] = _measure(cfg, run_dir, report["plan"]["speed"], data)
        if opts.compare_samplers and not described:
            report["comparison"] = _compare(cfg, kinds, run_dir, report["plan"])
    report["recommendation"] = report["plan"]["recommendation"]
    report["stage_stats"] = meter.stats()
    if opts.plots:
        report["plots"] = [str(p) for p in write_plots(run_dir, report)]
    write_json(run_dir / "profile.json", report)
    write_summary(run_dir, {"stage": "profile", "recommendation": report["recommendation"]})
    summary_table(
        f"profile: {cfg.graph_dir if float(opts.num_nodes) <= 0 else 'described graph'}", summary_rows(report)
    )
    for reason in report["recommendation"]["reasons"]:
        info(f"  - {reason}")
    if "comparison" in report:
        show_comparison(report["comparison"])
    info(f"profile: {run_dir / 'profile.json'}")
    return {**report, "run_dir": str(run_dir)}


def _check_described(num_nodes: float) -> None:
    """0 profiles graph_dir, a positive count a described graph; a negative one is neither (it would send
    the user looking for a graph_dir they never meant)."""
    if not num_nodes >= 0:  # NaN too
        raise ConfigError(
            f"profile.num_nodes={num_nodes:g} is not a node count",
            "give the described graph's node count, e.g. profile.num_nodes=1e9 profile.avg_degree=50, "
            "or leave it 0 to profile graph_dir",
        )


def _measure(cfg: DictConfig, run_dir: Path, predicted: dict, data) -> dict:
    """Timed steps judged against the plan's own micro-measurements (gather bandwidth, matmul rate): the
    plan probed the same sampler's mean batch, so measuring them again would only repeat the work."""
    from gnnscale.profile.measure import bounds, doubling_test, measure_steps

    device = pick_device(cfg.train.device)
    trace = run_dir / "trace.json" if cfg.profile.trace else None
    m = measure_steps(cfg, data, device, int(cfg.profile.num_batches), trace_path=trace)
    bw, flops = predicted["gather_bandwidth"], predicted["matmul"]
    return {
        "steps": m,
        "gather_bandwidth": bw,
        "matmul": flops,
        "bounds": bounds(m, bw, flops),
        "doubling": doubling_test(cfg, data, device, int(cfg.profile.num_batches), at_b=m),
        "predicted_over_measured": round(predicted["seeds_per_s"] / m["seeds_per_s"], 3),
    }


def _compared_kinds(cfg: DictConfig) -> list[str]:
    kinds = list(cfg.profile.samplers) or list(PRESETS)
    unknown = [k for k in kinds if k not in PRESETS]
    if unknown:
        raise ConfigError(f"profile.samplers={unknown} has no preset", f"choose from {', '.join(PRESETS)}")
    return kinds


def _compare(cfg: DictConfig, kinds: list[str], run_dir: Path, plan: dict) -> dict:
    """A short `gnnscale train` of each formation's preset (sampling.PRESETS, or profile.samplers), each in
    run_dir/compare/<sampler>; a partition is made first where one is needed."""
    # full-graph training gets as many steps as the neighbour preset's epochs have batches
    neighbor_batch = compose_config("train", [f"+exp={PRESETS['neighbor']}"]).train.batch_size
    rows = []
    for kind in kinds:
        out = run_dir / "compare" / kind
        epochs = comparison_epochs(
            kind, cfg.profile.compare_epochs, plan["graph"]["num_train"], neighbor_batch
        )
        tcfg = compose_config("train", comparison_overrides(cfg, PRESETS[kind], out, epochs))
        info(f"[bold]compare[/bold]: {kind} (+exp={PRESETS[kind]}), {epochs} epoch(s)")
        if partition_needed(tcfg):
            partition_stage.run(partition_cfg(tcfg, str(out / "partition")))
        summary = train_stage.run(tcfg)
        rows.append(comparison_row(kind, PRESETS[kind], Path(summary["run_dir"]), summary))
    metric = str(cfg.train.metric)
    winner = pick_winner(rows, metric)
    planned = plan["recommendation"]["formation"]
    return {
        "metric": metric,
        "rows": rows,
        "winner": winner,
        "agreement": agreement(planned, winner, rows, metric),
    }
