"""Storage benchmark: shard + build-csr of a large synthetic graph through the real stages.

Default: 5M nodes, average degree 40 (200M directed edges), 128 float32 features — about 6 GB of
edges and features. Per stage it records wall time, edges/s, peak RSS and peak anonymous memory
(RssAnon sampled every 50 ms: heap the kernel cannot reclaim, unlike the page cache of mmap'd files).

    .venv/bin/python scripts/bench_storage.py                      # the issue's size (~15 GB scratch disk)
    .venv/bin/python scripts/bench_storage.py --num-nodes 200000   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gnnscale.config import compose_config  # noqa: E402
from gnnscale.stages import build_csr, shard  # noqa: E402
from gnnscale.utils.atomic import write_json  # noqa: E402
from gnnscale.utils.memory import MemorySampler, measured_mb, rss_anon_mb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=5_000_000)
    ap.add_argument("--avg-degree", type=float, default=40.0)
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--nodes-per-shard", type=int, default=100_000)
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "storage"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "storage.json"))
    ap.add_argument("--keep", action="store_true", help="keep the generated graph_dir")
    args = ap.parse_args()

    scratch = Path(args.scratch)
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    graph_dir = scratch / "graph"
    data = [
        f"data.num_nodes={args.num_nodes}",
        f"data.avg_degree={args.avg_degree}",
        f"data.feat_dim={args.feat_dim}",
        "data.num_classes=16",
    ]
    common = [f"graph_dir={graph_dir}", f"shard.nodes_per_shard={args.nodes_per_shard}"]
    # An unreadable meter stops the benchmark here: a 0 MB reading would pass the memory target.
    baseline_anon = measured_mb(rss_anon_mb(), "process baseline RssAnon")
    results: dict = {
        "graph": {
            "num_nodes": args.num_nodes,
            "avg_degree": args.avg_degree,
            "feat_dim": args.feat_dim,
            "nodes_per_shard": args.nodes_per_shard,
        },
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "process_baseline_anon_mb": round(baseline_anon, 1),
        "stages": {},
    }
    for stage, module, overrides in (
        ("shard", shard, data + common + [f"run_dir={scratch / 'runs' / 'shard'}"]),
        ("build_csr", build_csr, [f"graph_dir={graph_dir}", f"run_dir={scratch / 'runs' / 'csc'}"]),
    ):
        cfg = compose_config(stage, overrides)
        t0 = time.time()
        with MemorySampler(0.05) as mem:
            summary = module.run(cfg)
        wall = time.time() - t0
        edges = summary["num_edges"]
        peak_rss = measured_mb(mem.peak_rss_mb, f"{stage} peak VmRSS")
        peak_anon = measured_mb(mem.peak_anon_mb, f"{stage} peak RssAnon")
        row = {
            "wall_time_s": round(wall, 2),
            "num_edges": edges,
            "edges_per_s": round(edges / wall),
            "peak_rss_mb": round(peak_rss, 1),
            "peak_anon_mb": round(peak_anon, 1),
            "peak_anon_above_baseline_mb": round(peak_anon - baseline_anon, 1),
        }
        if stage == "shard":
            row["input_edges_per_s"] = round(summary["input_edges"] / wall)
            row["bytes_on_disk_gb"] = round(
                sum(f.stat().st_size for f in graph_dir.glob("part_*.pt")) / 1e9, 2
            )
        else:
            row["csc_build_time_s"] = summary["build_time_s"]
            row["csc_edges_per_s"] = summary["edges_per_s"]
            row["verify_and_stats_s"] = round(wall - summary["build_time_s"], 2)
        results["stages"][stage] = row
        print(json.dumps({stage: row}), flush=True)
    results["targets"] = {
        "peak_anon_under_2gb": all(r["peak_anon_mb"] < 2048 for r in results["stages"].values()),
        "build_csr_at_least_3m_edges_per_s": results["stages"]["build_csr"]["csc_edges_per_s"] >= 3_000_000,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, results)
    print(json.dumps(results["targets"]))
    if not args.keep:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
