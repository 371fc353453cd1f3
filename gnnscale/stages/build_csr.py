"""`gnnscale build-csr`: graph_dir shards -> out-of-core CSC adjacency in graph_dir/csc/."""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from gnnscale.stages.common import metered
from gnnscale.storage.csc import build_csc, open_csc
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.lock import graph_lock_path, hold
from gnnscale.storage.run_dir import make_run_dir, write_summary
from gnnscale.storage.verify import stamp_written, verify_graph_dir
from gnnscale.utils.ui import info, make_progress, summary_table


def degree_stats(indptr: np.ndarray, block: int = 1 << 22, cap: int = 1 << 16) -> dict:
    """In-degree min / median / max / isolated, streamed over indptr with an exact capped histogram."""
    n = len(indptr) - 1
    hist = np.zeros(cap + 1, dtype=np.int64)
    hi_deg = 0
    for lo in range(0, n, block):
        deg = np.diff(np.asarray(indptr[lo : min(lo + block, n) + 1]))
        hi_deg = max(hi_deg, int(deg.max()))
        hist += np.bincount(np.minimum(deg, cap), minlength=cap + 1)
    cum = np.cumsum(hist)
    return {
        "min": int(np.argmax(hist > 0)),
        "median": int(np.searchsorted(cum, (n + 1) // 2)),
        "max": hi_deg,
        "isolated": int(hist[0]),
    }


def run(cfg: DictConfig) -> dict:
    GraphDir(cfg.graph_dir)  # absent or incomplete: exit 2 before a lock file is made beside it
    with hold(graph_lock_path(cfg.graph_dir), f"graph_dir '{cfg.graph_dir}'", "build-csr"):
        graph = GraphDir(cfg.graph_dir)
        run_dir = make_run_dir(cfg, "build_csr")
        with metered() as meter:
            with make_progress() as bar:
                check = bar.add_task("verify shards", total=graph.num_shards, extra="")
                verify_graph_dir(
                    graph.path, cfg.verify, ("shards",), graph.meta, writer=True,
                    progress=lambda k, total: bar.update(check, completed=k + 1),
                )  # fmt: skip
                task = bar.add_task("build csc", total=graph.num_shards, extra="")
                csc = build_csc(
                    graph, validate=cfg.csc.validate, progress=lambda k, total: bar.update(task, completed=k)
                )
            stamp_written(graph.path, [(f"{csc['dir']}/{f}", sha) for f, sha in csc["sha256"].items()])
            indptr, _ = open_csc(graph)
            degrees = degree_stats(indptr)
    summary = {
        "stage": "build_csr",
        "graph_dir": str(cfg.graph_dir),
        "num_nodes": graph.num_nodes,
        "num_edges": csc["num_edges"],
        "index_dtype": csc["index_dtype"],
        "in_degree": degrees,
        "edges_per_s": round(csc["num_edges"] / max(csc["build_time_s"], 1e-9)),
        "build_time_s": csc["build_time_s"],
        **meter.stats(),
    }
    write_summary(run_dir, summary)
    summary_table(
        f"build-csr: {cfg.graph_dir}/csc",
        {
            "nodes": graph.num_nodes,
            "edges (CSC)": csc["num_edges"],
            "indices": f"{csc['index_dtype']} ({np.dtype(csc['index_dtype']).itemsize} bytes per edge)",
            "in-degree min / median / max": f"{degrees['min']} / {degrees['median']} / {degrees['max']:,}",
            "isolated nodes": degrees["isolated"],
            "build time (s)": csc["build_time_s"],
            "edges/s": summary["edges_per_s"],
            "peak anon memory (MB)": summary["peak_anon_mb"],
        },
    )
    info(f"summary: {run_dir / 'summary.json'}")
    summary["run_dir"] = str(run_dir)
    return summary
