"""Partition benchmark: `gnnscale partition` METIS vs random, how METIS grows with the graph, and KaHIP.

Synthetic graphs through the real shard + build-csr stages (bench/tmp, kept between runs):
  syn500k  500k nodes, avg_degree 20 (~10M directed edges), 128 features, 16 classes (as bench_train.py)
  syn2m    2M nodes, avg_degree 20 (~40M directed edges), 16 features (features do not matter here)

Every partition runs in a fresh child process (no heap inherited from another run) through the stage,
`gnnscale partition ... overwrite=true`; quoted: edge-cut ratio over the undirected edges, node / train
balance (max / mean part), the partition step's time, its peak RssAnon and RssAnon growth (sampled every
20 ms) and METIS's estimate made before it started. Runs:
  500k: metis and random at k=500 (the Cluster-GCN default, one part per 1,000 nodes) and k=8;
        metis without the training-node constraint (partition.balance_train=false) at both, to compare
        with KaHIP on the same single constraint
  2M:   metis at k=8 and at the default k=2,000
  METIS vs KaHIP on the 500k graph, k=8 and k=500: METIS (dgl, one constraint: nodes) and, when
        `import kahip` works (pip install kahip), kaffpa FAST and ECO, imbalance 3 % (METIS's), all on the
        same arrays, each measured by wall time and the growth of VmHWM (KaHIP holds the GIL, so no
        sampling thread runs beside it); edge cut counted by gnnscale's report. A run past
        --kahip-timeout (600 s) is stopped and noted

    .venv/bin/python scripts/bench_partition.py                  # writes bench/results/partition.json
    .venv/bin/python scripts/bench_partition.py --small          # a 50k / 200k-node look (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DGLBACKEND", "pytorch")

from bench_train import build_graph  # noqa: E402  (one way to build the synthetic benchmark graphs)


# ---------------------------------------------------------------- children
def child_partition(graph_dir: str, overrides: list[str]) -> dict:
    from gnnscale.config import compose_config
    from gnnscale.stages import partition

    run_dir = Path(graph_dir).parent / "runs" / "partition"
    cfg = compose_config(
        "partition", [f"graph_dir={graph_dir}", f"run_dir={run_dir}", "overwrite=true", *overrides]
    )
    s = partition.run(cfg)
    keys = (
        "method",
        "num_parts",
        "balance_train",
        "undirected_edges",
        "edge_cut",
        "edge_cut_ratio",
        "node_balance",
        "train_balance",
        "empty_parts",
        "partition_time_s",
        "peak_anon_mb",
        "anon_growth_mb",
        "peak_rss_mb",
        "estimate_mb",
    )
    return {k: s.get(k) for k in keys}


def child_direct(graph_dir: str, num_parts: int, method: str) -> dict:
    """METIS (one constraint: nodes) or KaHIP kaffpa on the same arrays, measured the same way: wall time
    and the growth of the process's peak RSS (VmHWM, reset first). KaHIP holds the GIL while it runs, so a
    sampling thread would see nothing; the CSC's pages are read before the reset, so the growth is heap."""
    import numpy as np

    from gnnscale.partition.graph import adjacency
    from gnnscale.partition.metis import metis_assignment
    from gnnscale.partition.report import quality
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.utils.memory import status_kb

    graph = GraphDir(graph_dir)
    adj = adjacency(graph)
    train = graph.mask("train").numpy()
    int(np.asarray(adj.indices).sum() + np.asarray(adj.indptr).sum())  # page the CSC in
    if method.startswith("kahip"):
        import kahip
    else:
        import dgl  # noqa: F401  (its import is not METIS's cost)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status_kb("VmRSS")
    t0 = time.perf_counter()
    if method.startswith("kahip"):
        # KaHIP takes 32-bit CSR arrays; the stored CSC of a symmetric graph is its CSR.
        xadj = np.asarray(adj.indptr, dtype=np.int32)
        adjncy = np.asarray(adj.indices, dtype=np.int32)
        vwgt = np.ones(adj.num_nodes, dtype=np.int32)
        adjcwgt = np.ones(len(adjncy), dtype=np.int32)
        mode = getattr(kahip, method.split("-")[1].upper())
        cut, parts = kahip.kaffpa(vwgt, xadj, adjcwgt, adjncy, num_parts, 0.03, True, 0, mode)
        assignment = np.asarray(parts, dtype=np.int64)
    else:
        assignment = metis_assignment(adj, num_parts, None)
    elapsed = time.perf_counter() - t0
    hwm = status_kb("VmHWM")
    q = quality(adj, assignment, num_parts, train)
    if method.startswith("kahip"):
        assert q["edge_cut"] == cut, (q["edge_cut"], cut)
    return {
        "method": method,
        "num_parts": num_parts,
        "balance_train": False,
        **{
            k: q[k]
            for k in ("undirected_edges", "edge_cut", "edge_cut_ratio", "node_balance", "train_balance")
        },
        "empty_parts": q["empty_parts"],
        "partition_time_s": round(elapsed, 3),
        "peak_rss_mb": round(hwm / 1024, 1),
        "rss_growth_mb": round((hwm - before) / 1024, 1),
    }


def in_child(kind: str, *args, timeout: float | None = None) -> dict | None:
    """Run one measurement in a fresh interpreter; its last stdout line is the JSON result (None: timed out)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([kind, *args])]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["child_wall_s"] = round(time.perf_counter() - t0, 2)
    return out


# ---------------------------------------------------------------- driver
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--small", action="store_true", help="50k / 200k nodes instead of 500k / 2M")
    ap.add_argument("--scratch", type=Path, default=ROOT / "bench" / "tmp")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-kahip", action="store_true")
    ap.add_argument("--kahip-timeout", type=float, default=600.0, help="seconds one KaHIP run may take")
    args = ap.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        result = child_partition(*rest) if kind == "partition" else child_direct(*rest)
        result["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        print(json.dumps(result))
        return
    small, big = (50_000, 200_000) if args.small else (500_000, 2_000_000)
    out = args.out or (
        ROOT / "bench" / "results" / ("partition_small.json" if args.small else "partition.json")
    )
    g1 = build_graph(args.scratch / f"syn{small // 1000}k", small, 20, 128, 16)
    g2 = build_graph(args.scratch / f"syn{big // 1000}k", big, 20, 16, 16)
    k1 = small // 1000
    runs = []

    def record(graph: dict, result: dict) -> None:
        row = {"graph_nodes": graph["num_nodes"], "graph_edges": graph["num_edges"], **result}
        runs.append(row)
        print(json.dumps(row), flush=True)

    for k in (k1, 8):
        for extra in (["partition.method=metis"], ["partition.method=random"]):
            record(g1, in_child("partition", g1["graph_dir"], [*extra, f"partition.num_parts={k}"]))
        no_train = ["partition.balance_train=false", f"partition.num_parts={k}"]
        record(g1, in_child("partition", g1["graph_dir"], no_train))
    for k in (8, big // 1000):
        record(g2, in_child("partition", g2["graph_dir"], [f"partition.num_parts={k}"]))
    kahip_note, timed_out = None, []
    direct = ["metis"]
    if not args.no_kahip:
        try:
            import kahip  # noqa: F401

            direct += ["kahip-fast", "kahip-eco"]
        except ImportError:
            kahip_note = "kahip is not installed (pip install kahip): not measured"
    for k in (8, k1):
        for method in direct:
            row = in_child("direct", g1["graph_dir"], k, method, timeout=args.kahip_timeout)
            if row is None:
                timed_out.append(f"{method} k={k} ran past {args.kahip_timeout:.0f} s: stopped")
                print(timed_out[-1], flush=True)
            else:
                record(g1, row)
    result = {
        "benchmark": "partition",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "graphs": [g1, g2],
        "runs": runs,
        "notes": [n for n in (kahip_note, *timed_out) if n],
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(runs))
    print(f"\nwritten: {out}")


def markdown(runs: list[dict]) -> str:
    stage = [r for r in runs if "anon_growth_mb" in r]
    direct = [r for r in runs if "rss_growth_mb" in r]
    lines = [
        "`gnnscale partition` (fresh process each):",
        "",
        "| nodes | edges | method | k | train balanced | edge cut | node / train balance | time (s) "
        "| peak anon (MB) | anon growth (MB) | METIS estimate (MB) |",
        "|" + "---|" * 11,
    ]
    for r in stage:
        est = "" if r.get("estimate_mb") is None else f"{r['estimate_mb']:,.0f}"
        lines.append(
            f"| {r['graph_nodes']:,} | {r['graph_edges']:,} | {r['method']} | {r['num_parts']:,} "
            f"| {'yes' if r['balance_train'] else 'no'} | {r['edge_cut_ratio']:.2%} "
            f"| {r['node_balance']} / {r['train_balance']} | {r['partition_time_s']:.1f} "
            f"| {r['peak_anon_mb']:,.0f} | {r['anon_growth_mb']:,.0f} | {est} |"
        )
    if direct:
        lines += [
            "",
            "METIS vs KaHIP, one constraint (nodes), 3 % imbalance, same arrays and measurement:",
            "",
            "| nodes | method | k | edge cut | node balance | time (s) | peak RSS growth (MB) |",
            "|" + "---|" * 7,
        ]
        for r in direct:
            lines.append(
                f"| {r['graph_nodes']:,} | {r['method']} | {r['num_parts']:,} | {r['edge_cut_ratio']:.2%} "
                f"| {r['node_balance']} | {r['partition_time_s']:.1f} | {r['rss_growth_mb']:,.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
