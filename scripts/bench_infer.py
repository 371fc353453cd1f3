"""Inference benchmark: gnnscale's layer-wise inference beside a naive full-graph forward of the same model.

Default: a 500k-node / ~10M-edge / 128-feature synthetic graph and a 3-layer GraphSAGE (hidden 256,
random weights: throughput and memory do not depend on the values). Every measurement runs in its own
process, so peak RSS (VmRSS) and peak anonymous memory (RssAnon, sampled every 20 ms: heap that the
kernel cannot reclaim, unlike the page cache of mmap'd files) belong to that run alone.

  naive        features loaded into RAM, every layer on the whole graph at once (eval, no_grad)
  layerwise    `gnnscale infer --layerwise` with the default memory budget (layers in page cache)
  disk         the same with infer.memory_budget_gb small enough to force disk-streamed layers
  update       `gnnscale infer --update`: 1% of nodes get new features, 0.5% more edges
  full_updated a full layer-wise run on the updated graph (what the update must equal, and beat)

    .venv/bin/python scripts/bench_infer.py                        # the issue's size (~25 min on 2 cores)
    .venv/bin/python scripts/bench_infer.py --num-nodes 20000 --avg-degree 20 --out bench/results/infer_20k.json
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
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


# ---------------------------------------------------------------- workers (one process per measurement)
def cpu_seconds() -> float:
    """User + system CPU time of this process: less sensitive than wall time to other jobs on the machine."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker_naive(args) -> dict:
    import torch

    from gnnscale.inference.checkpoint import load_checkpoint
    from gnnscale.storage.csc import to_dgl_graph
    from gnnscale.storage.feature_store import FeatureStore
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.utils.memory import MemorySampler

    graph = GraphDir(args.graph)
    ck = load_checkpoint(args.ckpt)
    model = ck.model
    with MemorySampler(0.02) as mem:
        t0 = time.time()
        x = FeatureStore(graph, in_memory=True)._full.to(torch.float32)  # the whole feature matrix in RAM
        g = to_dgl_graph(graph)
        t1, c1 = time.time(), cpu_seconds()
        per_layer = []
        with torch.no_grad():
            h = x
            for layer in range(model.num_layers):
                tl = time.time()
                h = model.layer_forward(layer, g, h)
                per_layer.append(round(time.time() - tl, 3))
                if layer == model.num_layers - 2:
                    emb = h
        t2, c2 = time.time(), cpu_seconds()
    out = Path(args.save)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "embeddings.npy", emb.numpy())
    np.save(out / "logits.npy", h.numpy())
    n = graph.num_nodes
    return {
        "load_s": round(t1 - t0, 3),
        "forward_s": round(t2 - t1, 3),
        "forward_cpu_s": round(c2 - c1, 3),
        "forward_layers_s": per_layer,
        "total_s": round(t2 - t0, 3),
        "nodes_per_s_forward": round(n / (t2 - t1)),
        "nodes_per_s_total": round(n / (t2 - t0)),
        "peak_rss_mb": round(mem.peak_rss_mb, 1),
        "peak_anon_mb": round(mem.peak_anon_mb, 1),
    }


def worker_infer(args) -> dict:
    from gnnscale.config import compose_config
    from gnnscale.stages import infer
    from gnnscale.utils.memory import MemorySampler

    cfg = compose_config("infer", json.loads(args.overrides))
    with MemorySampler(0.02) as mem:
        t0, c0 = time.time(), cpu_seconds()
        s = infer.run(cfg)
        wall, cpu = time.time() - t0, cpu_seconds() - c0
    keep = (
        "infer_cpu_s",
        "storage",
        "layers",
        "infer_time_s",
        "nodes_per_s",
        "publish_time_s",
        "affected",
        "changes",
        "plan_time_s",
    )
    return {
        **{k: s[k] for k in keep if k in s},
        "stage_wall_s": round(wall, 3),
        "stage_cpu_s": round(cpu, 3),
        "peak_rss_mb": round(mem.peak_rss_mb, 1),
        "peak_anon_mb": round(mem.peak_anon_mb, 1),
        "run_dir": s["run_dir"],
    }


def worker_write_graph(args) -> dict:
    from gnnscale.inference.delta import GraphDelta, write_updated_graph
    from gnnscale.storage.graph_dir import GraphDir

    t0 = time.time()
    delta = GraphDelta.load(Path(args.delta))
    write_updated_graph(GraphDir(args.graph), delta, args.save, overwrite=True)
    return {"write_graph_s": round(time.time() - t0, 2), **delta.summary()}


WORKERS = {"naive": worker_naive, "infer": worker_infer, "write_graph": worker_write_graph}


def spawn(kind: str, result: Path, **kw) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--result", str(result)]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, DGLBACKEND="pytorch")
    os.sync()  # the previous run's dirty pages are written back now, not during this measurement
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"worker {kind} failed ({proc.returncode})")
    row = json.loads(result.read_text())
    row["process_wall_s"] = round(time.time() - t0, 2)
    print(json.dumps({kind: {k: v for k, v in row.items() if k != "layers"}}), flush=True)
    return row


# ---------------------------------------------------------------- the benchmark
def build_graph(scratch: Path, args) -> Path:
    from gnnscale.config import compose_config
    from gnnscale.stages import build_csr, shard

    graph_dir = scratch / "graph"
    data = [
        f"data.num_nodes={args.num_nodes}",
        f"data.avg_degree={args.avg_degree}",
        f"data.feat_dim={args.feat_dim}",
        "data.num_classes=16",
    ]
    stamp = scratch / "graph.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == data and (graph_dir / "csc").is_dir():
        return graph_dir  # --keep from an earlier run with the same graph
    shard.run(
        compose_config(
            "shard",
            [f"graph_dir={graph_dir}", f"run_dir={scratch / 'runs' / 'shard'}", "overwrite=true", *data],
        )
    )
    build_csr.run(
        compose_config("build_csr", [f"graph_dir={graph_dir}", f"run_dir={scratch / 'runs' / 'csc'}"])
    )
    stamp.write_text(json.dumps(data))
    return graph_dir


def make_ckpt(scratch: Path, graph_dir: Path, args) -> Path:
    import torch
    from omegaconf import OmegaConf

    from gnnscale.models import build_model, model_signature, signature_hash
    from gnnscale.storage.graph_dir import GraphDir

    g = GraphDir(graph_dir)
    cfg = OmegaConf.create(
        dict(
            arch="sage",
            hidden=args.hidden,
            num_layers=args.layers,
            aggregator="mean",
            dropout=0.5,
            norm="none",
        )
    )
    torch.manual_seed(0)
    feat_dim, classes = int(g.meta["feat_dim"]), int(g.meta["num_classes"])
    model = build_model(cfg, feat_dim, classes)
    sig = model_signature(cfg, feat_dim, classes)
    path = scratch / "train" / "checkpoints" / "last.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": model.state_dict(),
            "signature": sig,
            "signature_hash": signature_hash(sig),
            "model_cfg": OmegaConf.to_container(cfg),
            "graph": {
                "name": g.meta["name"],
                "num_nodes": g.num_nodes,
                "feat_dim": feat_dim,
                "num_classes": classes,
                "graph_dir": str(graph_dir),
            },
            "epoch": 0,
        },
        path,
    )
    return path


def make_changes(graph_dir: Path, path: Path, feat_frac: float, edge_frac: float, seed: int) -> dict:
    """feat_frac of nodes get new feature rows; edge_frac x stored edges are added (as undirected pairs)."""
    from gnnscale.storage.graph_dir import GraphDir

    g = GraphDir(graph_dir)
    rng = np.random.default_rng(seed)
    n, f = g.num_nodes, int(g.meta["feat_dim"])
    feat_nodes = np.sort(rng.choice(n, max(1, int(feat_frac * n)), replace=False)).astype(np.int64)
    pairs = max(1, int(edge_frac * g.meta["num_edges"] / 2))  # each pair is stored in both directions
    src, dst = rng.integers(0, n, pairs), rng.integers(0, n, pairs)
    keep = src != dst
    np.savez(
        path,
        feat_nodes=feat_nodes,
        feat=rng.standard_normal((len(feat_nodes), f)).astype(np.float32),
        add_src=src[keep],
        add_dst=dst[keep],
    )
    return {
        "feature_rows": int(len(feat_nodes)),
        "edge_pairs": int(keep.sum()),
        "directed_edges": int(2 * keep.sum()),
    }


def max_abs_diff(a_path: Path, b_path: Path, chunk: int = 1 << 16) -> float:
    a, b = np.load(a_path, mmap_mode="r"), np.load(b_path, mmap_mode="r")
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(
        max(
            np.abs(np.asarray(a[i : i + chunk]) - np.asarray(b[i : i + chunk])).max()
            for i in range(0, len(a), chunk)
        )
    )


def warm(graph_dir: Path) -> None:
    """Read the graph files once so every run starts with the same (warm) page cache."""
    for p in list(graph_dir.glob("part_*.pt")) + list((graph_dir / "csc").glob("*.npy")):
        with open(p, "rb") as fh:
            while fh.read(1 << 24):
                pass


def _layer_seconds(run: dict) -> list[float]:
    return [x["seconds"] for x in run["layers"]]


def _medians(rows: list[dict]) -> dict:
    """Medians over repeats of the compute wall / CPU seconds, the stage's wall, and each layer's seconds."""
    return {
        "infer_time_s": round(median(r["infer_time_s"] for r in rows), 3),
        "infer_cpu_s": round(median(r["infer_cpu_s"] for r in rows), 3),
        "stage_wall_s": round(median(r["stage_wall_s"] for r in rows), 3),
        "layers_s": [round(median(x), 3) for x in zip(*(_layer_seconds(r) for r in rows), strict=True)],
    }


def incremental(args, graph_dir: Path, scratch: Path, runs: Path, res: Path, infer, num_layers: int) -> dict:
    """`infer --update` against a full layer-wise run on the updated graph, in alternating processes.

    The first update writes the delta the updated graph is built from; then the two kinds alternate (which
    goes first switches every repeat), and the speedups are ratios of medians.
    """
    changes = make_changes(graph_dir, scratch / "changes.npz", args.feat_frac, args.edge_frac, seed=1)
    upd_args = (f"infer.changes={scratch / 'changes.npz'}", f"infer.base={runs / 'layerwise'}")
    updates = [infer("update", *upd_args)]
    spawn(
        "write_graph",
        res / "write_graph.json",
        graph=graph_dir,
        delta=runs / "update" / "graph_delta.npz",
        save=scratch / "graph_updated",
    )
    warm(scratch / "graph_updated")
    fulls = [infer("full_updated", f"graph_dir={scratch / 'graph_updated'}")]
    eq, eq_z = {}, {}
    for i in range(1, num_layers + 1):
        eq[f"h_{i}"] = max_abs_diff(
            runs / "update" / "layers" / f"h_{i}.npy", runs / "full_updated" / "layers" / f"h_{i}.npy"
        )
        if (runs / "update" / "layers" / f"z_{i}.npy").is_file():
            eq_z[f"z_{i}"] = max_abs_diff(
                runs / "update" / "layers" / f"z_{i}.npy", runs / "full_updated" / "layers" / f"z_{i}.npy"
            )
    for r in range(1, args.repeat):
        order = ("update", "full") if r % 2 == 0 else ("full", "update")
        for kind in order:
            if kind == "update":
                updates.append(infer(f"update_{r}", *upd_args))
                shutil.rmtree(runs / f"update_{r}")
            else:
                fulls.append(infer(f"full_updated_{r}", f"graph_dir={scratch / 'graph_updated'}"))
                shutil.rmtree(runs / f"full_updated_{r}")
    mu, mf = _medians(updates), _medians(fulls)
    first = updates[0]
    return {
        "changes": changes,
        "applied": first.get("changes"),
        "affected_per_layer": first.get("affected"),
        "update": {k: v for k, v in first.items() if k not in ("run_dir", "affected", "changes")},
        "full_on_updated_graph": {k: v for k, v in fulls[0].items() if k != "run_dir"},
        "runs": {
            "update": {k: [r[k] for r in updates] for k in ("infer_time_s", "infer_cpu_s", "stage_wall_s")},
            "full_on_updated_graph": {
                k: [r[k] for r in fulls] for k in ("infer_time_s", "infer_cpu_s", "stage_wall_s")
            },
            "update_layers_s": [_layer_seconds(r) for r in updates],
            "full_layers_s": [_layer_seconds(r) for r in fulls],
        },
        "median": {"update": mu, "full_on_updated_graph": mf},
        "speedup": {
            # full-on-updated-graph time / update time, medians over the repeats
            "median_wall": round(mf["infer_time_s"] / mu["infer_time_s"], 3),
            "median_cpu": round(mf["infer_cpu_s"] / mu["infer_cpu_s"], 3),
            "median_stage_wall": round(mf["stage_wall_s"] / mu["stage_wall_s"], 3),
            "per_layer_median": [
                round(f / u, 3) for f, u in zip(mf["layers_s"], mu["layers_s"], strict=True)
            ],
        },
        "equality_max_abs_per_layer": eq,
        "equality_max_abs_conv_outputs": eq_z,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=sorted(WORKERS))
    ap.add_argument("--result")
    ap.add_argument("--graph")
    ap.add_argument("--ckpt")
    ap.add_argument("--save")
    ap.add_argument("--delta")
    ap.add_argument("--overrides")
    ap.add_argument("--num-nodes", type=int, default=500_000)
    ap.add_argument("--avg-degree", type=float, default=20.0)
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--disk-budget-gb", type=float, default=0.1, help="forces disk-streamed layers")
    ap.add_argument("--feat-frac", type=float, default=0.01)
    ap.add_argument("--edge-frac", type=float, default=0.005)
    ap.add_argument(
        "--small-update", action="store_true", help="also time a 0.01%%-of-nodes update (no equality run)"
    )
    ap.add_argument("--skip-incremental", action="store_true")
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each kind, alternating (naive / layer-wise, update / full)",
    )
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "infer"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "infer.json"))
    ap.add_argument("--keep", action="store_true", help="keep the generated graph for the next run")
    args = ap.parse_args()
    if args.worker:
        Path(args.result).write_text(json.dumps(WORKERS[args.worker](args)))
        return

    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for stale in ("runs_infer", "naive", "graph_updated", "results"):
        shutil.rmtree(scratch / stale, ignore_errors=True)
    (scratch / "results").mkdir()
    t0 = time.time()
    graph_dir = build_graph(scratch, args)
    ckpt = make_ckpt(scratch, graph_dir, args)
    meta = json.loads((graph_dir / "meta.json").read_text())
    print(
        json.dumps(
            {
                "graph": {
                    "nodes": meta["num_nodes"],
                    "edges": meta["num_edges"],
                    "build_s": round(time.time() - t0, 1),
                }
            }
        ),
        flush=True,
    )
    warm(graph_dir)
    res = scratch / "results"
    runs = scratch / "runs_infer"
    common = [f"ckpt={ckpt}", f"infer.batch_size={args.batch_size}"]

    def infer(name: str, *extra: str) -> dict:
        return spawn(
            "infer", res / f"{name}.json", overrides=json.dumps([*common, f"run_dir={runs / name}", *extra])
        )

    # The machine may be shared: naive and layer-wise runs alternate; the targets are judged on medians
    # over the repeats (the fastest of each is kept too, and all times are recorded).
    naive_runs, lw_runs = [], []
    for r in range(args.repeat):
        naive_runs.append(
            spawn("naive", res / f"naive_{r}.json", graph=graph_dir, ckpt=ckpt, save=scratch / "naive")
        )
        lw_runs.append(infer("layerwise" if r == 0 else f"layerwise_{r}", f"graph_dir={graph_dir}"))
        if r:
            shutil.rmtree(runs / f"layerwise_{r}")  # the first one is the update's base
    naive = dict(
        min(naive_runs, key=lambda x: x["forward_s"]), forward_s_all=[x["forward_s"] for x in naive_runs]
    )
    lw = dict(
        min(lw_runs, key=lambda x: x["infer_time_s"]), infer_time_s_all=[x["infer_time_s"] for x in lw_runs]
    )
    naive["forward_cpu_s_all"] = [x["forward_cpu_s"] for x in naive_runs]
    lw["infer_cpu_s_all"] = [x["infer_cpu_s"] for x in lw_runs]
    naive["peak_anon_mb_all"] = [x["peak_anon_mb"] for x in naive_runs]
    lw["peak_anon_mb_all"] = [x["peak_anon_mb"] for x in lw_runs]
    naive["forward_layers_s_median"] = [
        round(median(x), 3) for x in zip(*(r["forward_layers_s"] for r in naive_runs), strict=True)
    ]
    lw["layers_s_median"] = [
        round(median(x), 3) for x in zip(*(_layer_seconds(r) for r in lw_runs), strict=True)
    ]
    disk = infer("disk", f"graph_dir={graph_dir}", f"infer.memory_budget_gb={args.disk_budget_gb}")
    L = args.layers
    equality = {
        "embeddings_layerwise_vs_naive": max_abs_diff(
            runs / "layerwise" / "embeddings.npy", scratch / "naive" / "embeddings.npy"
        ),
        "logits_layerwise_vs_naive": max_abs_diff(
            runs / "layerwise" / "layers" / f"h_{L}.npy", scratch / "naive" / "logits.npy"
        ),
        "embeddings_disk_vs_layerwise": max_abs_diff(
            runs / "disk" / "embeddings.npy", runs / "layerwise" / "embeddings.npy"
        ),
    }
    print(json.dumps({"equality": equality}), flush=True)
    shutil.rmtree(scratch / "naive")
    results: dict = {
        "graph": {
            "num_nodes": meta["num_nodes"],
            "num_edges": meta["num_edges"],
            "feat_dim": meta["feat_dim"],
            "avg_degree": args.avg_degree,
        },
        "model": {
            "arch": "sage",
            "aggregator": "mean",
            "hidden": args.hidden,
            "num_layers": L,
            "weights": "random (seed 0)",
        },
        "batch_size": args.batch_size,
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "naive_full_graph": naive,
        "layerwise": {k: v for k, v in lw.items() if k != "run_dir"},
        "layerwise_disk": {k: v for k, v in disk.items() if k != "run_dir"},
        "equality_max_abs": equality,
    }
    results["ratios"] = {
        "anon_layerwise_over_naive": round(lw["peak_anon_mb"] / naive["peak_anon_mb"], 3),
        "anon_median_layerwise_over_naive": round(
            median(lw["peak_anon_mb_all"]) / median(naive["peak_anon_mb_all"]), 3
        ),
        "rss_layerwise_over_naive": round(lw["peak_rss_mb"] / naive["peak_rss_mb"], 3),
        "throughput_layerwise_over_naive_forward": round(lw["nodes_per_s"] / naive["nodes_per_s_forward"], 3),
        # Medians over the alternating repeats, in wall and in CPU seconds (all threads of the compute).
        "throughput_median_wall": round(median(naive["forward_s_all"]) / median(lw["infer_time_s_all"]), 3),
        "throughput_median_cpu": round(median(naive["forward_cpu_s_all"]) / median(lw["infer_cpu_s_all"]), 3),
        "throughput_layerwise_over_naive_total": round(lw["nodes_per_s"] / naive["nodes_per_s_total"], 3),
        "anon_disk_over_naive": round(disk["peak_anon_mb"] / naive["peak_anon_mb"], 3),
        "rss_disk_over_naive": round(disk["peak_rss_mb"] / naive["peak_rss_mb"], 3),
        "disk_slowdown_vs_memory": round(disk["infer_time_s"] / lw["infer_time_s"], 3),
    }
    if not args.skip_incremental:
        results["incremental"] = incremental(args, graph_dir, scratch, runs, res, infer, L)
        inc = results["incremental"]
        print(
            json.dumps({"incremental_equality": inc["equality_max_abs_per_layer"], **inc["speedup"]}),
            flush=True,
        )
        if args.small_update:
            small = make_changes(graph_dir, scratch / "changes_small.npz", 1e-4, 1e-5, seed=2)
            su = infer(
                "update_small",
                f"infer.changes={scratch / 'changes_small.npz'}",
                f"infer.base={runs / 'layerwise'}",
            )
            results["incremental_small"] = {
                "changes": small,
                "affected_per_layer": su.get("affected"),
                "layers": su.get("layers"),
                "infer_time_s": su["infer_time_s"],
                "speedup_vs_base_run": round(lw["infer_time_s"] / su["infer_time_s"], 3),
            }
    results["targets"] = {
        "anon_at_most_40pct_of_naive": results["ratios"]["anon_median_layerwise_over_naive"] <= 0.40,
        "throughput_at_least_0.8x_naive_forward": results["ratios"]["throughput_median_wall"] >= 0.8,
        "layerwise_equals_naive_1e-4": max(equality.values()) <= 1e-4,
    }
    if "incremental" in results:
        inc = results["incremental"]
        results["targets"]["incremental_equals_full_1e-5"] = (
            max(inc["equality_max_abs_per_layer"].values()) <= 1e-5
        )
        results["targets"]["incremental_faster_than_full"] = inc["speedup"]["median_wall"] > 1.0
    if meta["num_nodes"] < 500_000:
        results["note"] = (
            "the memory and throughput targets are set for the 500k-node graph; at this size the ~300 MB "
            "process baseline (torch + dgl) dominates peak memory, so only the equality results carry over"
        )
    results["bench_wall_s"] = round(time.time() - t0, 1)
    from gnnscale.utils.atomic import write_json

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, results)
    print(json.dumps({"ratios": results["ratios"], "targets": results["targets"]}), flush=True)
    shutil.rmtree(runs, ignore_errors=True)
    shutil.rmtree(scratch / "graph_updated", ignore_errors=True)
    if not args.keep:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
