"""`gnnscale partition`: graph_dir CSC -> graph_dir/partitions/<method>-<k>/ (assignment.npy, report.json;
with partition.method=distdgl also DistDGL's layout, made by gnnscale/dist/distdgl/partition.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from gnnscale.partition import STAGE_METHODS, check_method, current_report, make_partition, resolve_num_parts
from gnnscale.stages.common import metered
from gnnscale.storage.csc import open_csc
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.lock import hold
from gnnscale.storage.partitions import partition_dir
from gnnscale.storage.run_dir import make_run_dir, write_summary
from gnnscale.storage.verify import verify_graph_dir
from gnnscale.utils.ui import info, summary_table

PER_PART = ("nodes_per_part", "edges_per_part", "train_nodes_per_part")


def run(cfg: DictConfig) -> dict:
    opts = cfg.partition
    method = check_method(opts.method, methods=STAGE_METHODS)
    graph = GraphDir(cfg.graph_dir)
    resolve, current, make = _makers(method)
    num_parts = resolve(opts.num_parts, graph.num_nodes)
    open_csc(graph)  # no CSC: "run gnnscale build-csr first", before a run folder is made
    verify_graph_dir(graph.path, cfg.verify, meta=graph.meta)  # exit 2 naming a bad file
    folder = partition_dir(graph, method, num_parts)
    with hold(folder.parent / ".lock", f"'{folder.parent}'", "partition"):  # one partition writer at a time
        return _run(cfg, graph, method, num_parts, folder, current, make)


def _run(cfg: DictConfig, graph, method: str, num_parts: int, folder, current, make) -> dict:
    opts = cfg.partition
    run_dir = make_run_dir(cfg, "partition")
    report = None if cfg.overwrite else current(graph, method, num_parts, opts.balance_train)
    reused = report is not None
    with metered() as meter:
        if reused:
            info(f"partition: {folder} is up to date, reused (overwrite=true makes it again)")
        else:
            info(f"partition: {method} into {num_parts:,} parts ({graph.num_nodes:,} nodes)")
            _, report = make(graph, method, num_parts, cfg.seed, opts.memory_budget, opts.balance_train)
    summary = {
        "stage": "partition",
        "graph_dir": str(cfg.graph_dir),
        "partition_dir": str(folder),
        "reused": reused,
        **{k: v for k, v in report.items() if k not in PER_PART},
        **{f"stage_{k}": v for k, v in meter.stats().items()},
    }
    write_summary(run_dir, summary)
    summary_table(f"partition: {cfg.graph_dir} -> {folder}", _rows(report, reused))
    info(f"summary: {run_dir / 'summary.json'}")
    summary["run_dir"] = str(run_dir)
    return summary


def _makers(method: str):
    """(num_parts check, current report, maker) of a method: DistDGL's layout has its own (one part per
    machine, no default count), imported only when asked for."""
    if method == "distdgl":
        from gnnscale.dist.distdgl.partition import (
            check_num_parts,
            current_distdgl_report,
            make_distdgl_partition,
        )

        return check_num_parts, current_distdgl_report, make_distdgl_partition
    return resolve_num_parts, current_report, make_partition


def _rows(r: dict, reused: bool) -> dict:
    nodes, edges = r["nodes_per_part"], r["edges_per_part"]
    rows = {
        "method / parts": f"{r['method']} / {r['num_parts']:,}" + (" (reused)" if reused else ""),
        "nodes / undirected edges": f"{r['num_nodes']:,} / {r['undirected_edges']:,}",
        "edge cut": f"{r['edge_cut']:,} ({r['edge_cut_ratio']:.2%} of the edges)",
        "nodes per part min / max": f"{min(nodes):,} / {max(nodes):,}",
        "edges inside a part min / max": f"{min(edges):,} / {max(edges):,}",
        "balance nodes / train nodes": f"{_fmt(r['node_balance'])} / {_fmt(r['train_balance'])} (max / mean part)",
        "partition time (s)": r["partition_time_s"],
        "peak anon memory (MB)": r["peak_anon_mb"],
    }
    if r["empty_parts"]:
        rows["empty parts"] = f"{r['empty_parts']:,} (METIS leaves some when parts are tiny)"
    if "estimate_mb" in r:
        rows["METIS estimate / budget (MB)"] = f"{r['estimate_mb']:,.0f} / {r['budget_mb']:,.0f}"
    return rows


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"
