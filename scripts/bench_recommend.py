"""Recommendation benchmark: `gnnscale recommend` for every node of a 500k-node synthetic graph, K=20.

The embeddings come from a real run: `gnnscale train +exp=sage_2hop` (hidden 64, fanouts [10,10], one
epoch, seeded) and `gnnscale infer --layerwise` (the hidden layer, [500k, 64]). --emb random_weights
uses an untrained 3-layer GraphSAGE instead; --emb random uses random unit vectors, the worst case for
any approximate index (no structure: recall needs most of the IVF lists probed).

  recommend    `gnnscale recommend` on every node with the default index choice (500k >= exact_below:
               IVF over rows lifted to equal norm, nprobe tuned on 1,000 sampled queries to reach
               recall@20 >= 0.95 vs exact search); wall time, peak RssAnon / VmRSS (sampled by the
               stage), recall@20 as summary.json reports it
  exact        recommend.index=exact (faiss IndexFlatIP) on --exact-queries random nodes: exact search
               of all 500k queries takes about an hour on 2 shared cores, so its time is that sample's
               search time per query x 500k ("extrapolated"), and the JSON says so
  cross_check  the all-nodes run's rows for those same nodes vs the exact run's rows: recall@20 measured
               by the bench itself, independent of the stage's own sample

Each gnnscale command is its own process, so its peak memory is its own.

    .venv/bin/python scripts/bench_recommend.py            # the issue's size, writes bench/results/recommend.json (~6-7 min, 2 cores)
    .venv/bin/python scripts/bench_recommend.py --num-nodes 50000 --scratch /tmp/bench_rec \\
        --out /tmp/recommend_quick.json                    # a quick look (~1-2 min)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
from bench_infer import make_ckpt  # noqa: E402
from bench_train import build_graph  # noqa: E402

from gnnscale.utils.atomic import write_json  # noqa: E402

GNNSCALE = [sys.executable, "-m", "gnnscale"]
ANON_TARGET_MB, RECALL_TARGET = 2048, 0.95


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=500_000)
    ap.add_argument("--avg-degree", type=float, default=20.0)
    ap.add_argument("--feat-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64, help="embedding width (the model's hidden size)")
    ap.add_argument("--layers", type=int, default=3, help="--emb random_weights: model layers")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--emb", choices=["trained", "random_weights", "random"], default="trained")
    ap.add_argument("--epochs", type=int, default=1, help="--emb trained: training epochs")
    ap.add_argument("--exact-queries", type=int, default=3000, help="queries the exact index is timed on")
    ap.add_argument("--recall-sample", type=int, default=1000)
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "recommend"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "recommend.json"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch graph and runs")
    return ap.parse_args()


def gnnscale(*args: str) -> float:
    """Run one gnnscale command in its own process (progress lines off a terminal); its wall seconds."""
    t0 = time.time()
    subprocess.run([*GNNSCALE, *args, "ui.log_every_s=30"], check=True, cwd=ROOT)
    return time.time() - t0


def make_embeddings(scratch: Path, graph_dir: Path, args) -> tuple[Path, dict]:
    """An infer run_dir holding the embeddings recommend reads (see --emb)."""
    infer_dir = scratch / "infer"
    shutil.rmtree(infer_dir, ignore_errors=True)
    if args.emb == "random":
        n = json.loads((graph_dir / "meta.json").read_text())["num_nodes"]
        x = np.random.default_rng(0).standard_normal((n, args.hidden), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        infer_dir.mkdir(parents=True)
        np.save(infer_dir / "embeddings.npy", x)
        info = {
            "file": "embeddings.npy",
            "shape": list(x.shape),
            "mode": "layerwise",
            "graph_dir": str(graph_dir),
        }
        (infer_dir / "emb_info.json").write_text(json.dumps(info))
        return infer_dir, {"source": "random unit vectors (seed 0)", "shape": list(x.shape)}
    train_s = 0.0
    if args.emb == "trained":
        train_dir = scratch / "train"
        shutil.rmtree(train_dir, ignore_errors=True)
        train_s = gnnscale(
            "train",
            f"graph_dir={graph_dir}",
            f"run_dir={train_dir}",
            "+exp=sage_2hop",
            f"model.hidden={args.hidden}",
            f"train.epochs={args.epochs}",
            "sampler.fanouts=[10,10]",
        )
        ckpt, how = train_dir, f"+exp=sage_2hop hidden {args.hidden}, fanouts [10,10], {args.epochs} epoch(s)"
    else:
        ckpt = make_ckpt(scratch, graph_dir, SimpleNamespace(hidden=args.hidden, layers=args.layers))
        how = f"{args.layers}-layer GraphSAGE, hidden {args.hidden}, random weights (seed 0)"
    wall = gnnscale(
        "infer", f"ckpt={ckpt}", f"graph_dir={graph_dir}", f"run_dir={infer_dir}", "infer.cache_layers=false"
    )
    info = json.loads((infer_dir / "emb_info.json").read_text())
    out = {
        "source": f"gnnscale infer --layerwise of {how}",
        "layer": info["layer_kind"],
        "shape": info["shape"],
    }
    return infer_dir, {**out, "train_wall_s": round(train_s, 1), "infer_wall_s": round(wall, 1)}


def recommend(infer_dir: Path, run_dir: Path, *overrides: str) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    wall = gnnscale("recommend", f"infer_dir={infer_dir}", f"run_dir={run_dir}", *overrides)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**summary, "process_wall_s": round(wall, 1)}


def cross_recall(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(
        np.mean(
            [
                len(np.intersect1d(a[a >= 0], e[e >= 0])) / max((e >= 0).sum(), 1)
                for a, e in zip(approx, exact, strict=True)
            ]
        )
    )


def main() -> None:
    args = parse_args()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    graph = build_graph(scratch / "graph", args.num_nodes, args.avg_degree, args.feat_dim, 8)
    graph_dir = Path(graph["graph_dir"])
    graph["build_s"] = round(time.time() - t0, 1)
    print(json.dumps({"graph": graph}), flush=True)
    infer_dir, emb = make_embeddings(scratch, graph_dir, args)
    print(json.dumps({"embeddings": emb}), flush=True)
    n, k = graph["num_nodes"], args.k
    runs = scratch / "runs"

    main_run = recommend(
        infer_dir, runs / "auto", f"recommend.k={k}", f"recommend.recall_sample={args.recall_sample}"
    )
    print(
        json.dumps(
            {"recommend": {x: main_run[x] for x in ("wall_time_s", "peak_anon_mb", "recall", "index")}}
        ),
        flush=True,
    )

    queries = np.sort(np.random.default_rng(1).choice(n, size=min(args.exact_queries, n), replace=False))
    np.save(scratch / "exact_queries.npy", queries)
    exact_run = recommend(
        infer_dir,
        runs / "exact",
        f"recommend.k={k}",
        "recommend.index=exact",
        f"recommend.nodes={scratch / 'exact_queries.npy'}",
    )
    exact_ids = np.load(runs / "exact" / "recommendations.npy")
    approx_ids = np.load(runs / "auto" / "recommendations.npy", mmap_mode="r")[queries]
    cross = cross_recall(approx_ids, exact_ids)
    per_query = exact_run["search_s"] / len(queries)

    stage_recall = (main_run["recall"] or {}).get(f"recall_at_{k}", 1.0)  # exact search: no sample
    results = {
        "graph": graph,
        "embeddings": emb,
        "k": k,
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "recommend_all_nodes": {
            key: main_run[key]
            for key in (
                "queries",
                "index",
                "index_why",
                "tuning",
                "recall",
                "short_rows",
                "index_build_s",
                "tune_s",
                "search_s",
                "queries_per_s",
                "wall_time_s",
                "process_wall_s",
                "peak_anon_mb",
                "peak_rss_mb",
                "max_rss_mb",
            )
        },
        "exact": {
            "queries_timed": len(queries),
            "index_build_s": exact_run["index_build_s"],
            "search_s": exact_run["search_s"],
            "s_per_query": round(per_query, 6),
            "all_nodes_search_s_extrapolated": round(per_query * n, 1),
            "peak_anon_mb": exact_run["peak_anon_mb"],
            "note": f"exact search of all {n:,} queries is extrapolated from {len(queries):,} timed queries "
            "(search time per query x num_nodes): running it whole would take tens of minutes on 2 cores",
        },
        "cross_check": {
            f"recall_at_{k}_on_exact_queries": round(cross, 4),
            "how": "rows of the all-nodes run for the exact run's queries vs the exact run's rows",
        },
        "speedup_search_vs_exact_extrapolated": round(per_query * n / max(main_run["search_s"], 1e-9), 2),
    }
    results["targets"] = {
        f"peak_anon_below_{ANON_TARGET_MB}_mb": main_run["peak_anon_mb"] is not None
        and main_run["peak_anon_mb"] < ANON_TARGET_MB,
        f"recall_at_{k}_at_least_{RECALL_TARGET}": stage_recall >= RECALL_TARGET and cross >= RECALL_TARGET,
    }
    results["bench_wall_s"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, results)
    print(json.dumps({"targets": results["targets"], "cross_check": results["cross_check"]}), flush=True)
    shutil.rmtree(runs, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
