"""Profile-plan benchmark: the plan's predicted peak memory beside the measured peak of a real train run,
and the formation the plan recommends on each graph.

Rows (graph x preset), each predicted in one fresh child and measured in another (spawned, one at a time):
  mini-batch  sage_2hop and sage_3hop on synthetic graphs of 50k, 200k and 500k nodes (average degree 20,
              128 float32 features, 16 classes, gnnscale's default power-law exponent 2.5), 1 epoch
  full-graph  full_gcn and full_sage on Planetoid Cora (../shared/data/planetoid_cora) and on the 50k
              synthetic graph, FULL_EPOCHS epochs (the heap settles after a few steps)

predicted: `make_plan` (gnnscale/profile/plan.py) on the graph with the preset, in a fresh process that
has imported what the train stage imports and opened the graph as it does; mini-batch rows use its
`minibatch.predicted_peak`, full-graph rows its `full_graph.total_bytes` (+ the mapped CSC for RSS).
measured: `gnnscale train +exp=PRESET` in another fresh process, its summary.json's peak_anon_mb (RssAnon,
sampled every 50 ms over the training loop and evaluation) and peak_rss_mb (VmRSS, mapped files too).
Like is compared with like: anon with anon (the heap the plan counts; the acceptance figure) and RSS
with RSS (reported beside it). ratio = predicted / measured; within_30pct = 0.7 <= ratio <= 1.3.
The graph's files are read before each child starts, so every child finds them in the page cache.

Speed (the smallest synthetic graph, sage_2hop): the plan's predicted seeds/s (`plan.speed`, made before
any training from a few probed batches, the random-gather bandwidth and the matmul rate) beside the
median seeds/s of a SPEED_EPOCHS-epoch `gnnscale train` run; ratio = predicted / measured, within_40pct
= 0.6 <= ratio <= 1.4. Then `gnnscale profile profile.compare_samplers=true` on the same graph: one epoch
of every formation's preset, the winner, and whether the plan's recommendation agrees with it.

The recommendations: the plan's `recommendation.formation` for each graph above with its default config
(sage, neighbor [25, 10], batch 1024), for a 200k-node graph with strongly skewed degrees (exponent 2.1),
and for a described 1-billion-node graph (profile.num_nodes=1e9 profile.avg_degree=50).

    .venv/bin/python scripts/bench_profile.py          # writes bench/results/profile.json (~20-30 min, 2 cores)
    .venv/bin/python scripts/bench_profile.py --sizes 50000 --no-full --out /tmp/profile_quick.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DGLBACKEND", "pytorch")

import bench_train as bt  # noqa: E402  (build_graph, in_child, warm)

SHARED = ROOT.parent / "shared" / "data"
AVG_DEGREE, FEAT_DIM, NUM_CLASSES = 20.0, 128, 16
MINIBATCH_PRESETS = ("sage_2hop", "sage_3hop")
FULL_PRESETS = ("full_gcn", "full_sage")
FULL_EPOCHS = 3
SPEED_PRESET, SPEED_EPOCHS = "sage_2hop", 3
ROW_KEYS = ("epochs", "steps", "train_time_s", "epoch_time_s", "input_nodes_per_batch", "loss_curve")
BUDGET = "auto"


def plan_child(graph_dir: str, overrides: list, queue) -> None:
    from gnnscale.config import compose_config
    from gnnscale.profile.plan import make_plan
    from gnnscale.utils.memlimit import resolve_budget

    cfg = compose_config("profile", [f"graph_dir={graph_dir}", *overrides])
    queue.put(make_plan(cfg, resolve_budget(cfg.profile.memory_budget, "profile.memory_budget")))


def train_child(graph_dir: str, preset: str, run_dir: str, extra: list, queue) -> None:
    from gnnscale.config import compose_config
    from gnnscale.stages import train

    overrides = [f"+exp={preset}", f"graph_dir={graph_dir}", f"run_dir={run_dir}", "overwrite=true", *extra]
    s = train.run(compose_config("train", overrides))
    keys = ("peak_anon_mb", "peak_rss_mb", "max_rss_mb", "memory_plan", "test_acc", "seeds_per_s")
    queue.put({k: s.get(k) for k in keys})


def compare_child(graph_dir: str, run_dir: str, queue) -> None:
    from gnnscale.config import compose_config
    from gnnscale.stages import profile

    overrides = [
        f"graph_dir={graph_dir}",
        f"run_dir={run_dir}",
        "overwrite=true",
        "profile.compare_samplers=true",
    ]
    report = profile.run(compose_config("profile", overrides))
    queue.put({"plan_formation": report["recommendation"]["formation"], **report["comparison"]})


def compare(predicted_mb: float, measured_mb: float | None) -> dict:
    if not measured_mb:
        raise RuntimeError("the train run reported no peak memory: /proc is needed to measure it")
    ratio = predicted_mb / measured_mb
    return {
        "predicted_mb": round(predicted_mb, 1),
        "measured_mb": round(measured_mb, 1),
        "ratio": round(ratio, 3),
        "within_30pct": 0.7 <= ratio <= 1.3,
    }


def one_row(name: str, graph_dir: Path, preset: str, kind: str, scratch: Path) -> dict:
    epochs = 1 if kind == "minibatch" else FULL_EPOCHS
    train_extra = [f"train.epochs={epochs}", "train.patience=0"]
    bt.warm(graph_dir)
    plan = bt.in_child(plan_child, str(graph_dir), [f"+exp={preset}", f"profile.memory_budget={BUDGET}"])
    bt.warm(graph_dir)
    run = bt.in_child(
        train_child, str(graph_dir), preset, str(scratch / "runs" / f"{name}_{preset}"), train_extra
    )
    if kind == "minibatch":
        peak = plan["minibatch"]["predicted_peak"]
        anon, rss = peak["anon_bytes"], peak["rss_bytes"]
        extra = {
            "measured_batch": plan["minibatch"]["measured"],
            "worst_case_input_nodes": plan["minibatch"]["worst_case"]["input_nodes"],
            "per_batch_mb": plan["minibatch"]["per_batch"]["total_mb"],
        }
    else:
        full = plan["full_graph"]
        anon, rss = full["total_bytes"], full["rss_bytes"]
        extra = {"terms_mb": {k: round(v / 2**20, 1) for k, v in full["terms_bytes"].items()}}
    row = {
        "graph": name,
        "preset": preset,
        "kind": kind,
        "epochs": epochs,
        "anon": compare(anon / 2**20, run["peak_anon_mb"]),
        "rss": compare(rss / 2**20, run["peak_rss_mb"]),
        "train_stage_plan_rss_mb": (run.get("memory_plan") or {}).get("rss_estimate_mb"),
        "recommendation": plan["recommendation"]["formation"],
        **extra,
    }
    a = row["anon"]
    print(
        f"{name:>8} {preset:>9}: anon predicted {a['predicted_mb']:8.1f} MB, measured {a['measured_mb']:8.1f} MB, "
        f"ratio {a['ratio']:.2f} {'ok' if a['within_30pct'] else 'OUT'} · rss ratio {row['rss']['ratio']:.2f}",
        flush=True,
    )
    return row


def speed_row(name: str, graph_dir: Path, scratch: Path) -> dict:
    bt.warm(graph_dir)
    plan = bt.in_child(plan_child, str(graph_dir), [f"+exp={SPEED_PRESET}"])
    bt.warm(graph_dir)
    extra = [f"train.epochs={SPEED_EPOCHS}", "train.patience=0"]
    run = bt.in_child(
        train_child, str(graph_dir), SPEED_PRESET, str(scratch / "runs" / f"{name}_speed"), extra
    )
    predicted, measured = plan["speed"]["seeds_per_s"], run["seeds_per_s"]
    ratio = predicted / measured
    print(
        f"speed {name}: predicted {predicted:,.0f} seeds/s, measured {measured:,.0f}, ratio {ratio:.2f}",
        flush=True,
    )
    return {
        "graph": name,
        "preset": SPEED_PRESET,
        "predicted_seeds_per_s": round(predicted),
        "measured_seeds_per_s": round(measured),
        "ratio": round(ratio, 3),
        "within_40pct": 0.6 <= ratio <= 1.4,
        "predicted_parts_s": {k: round(v, 5) for k, v in plan["speed"]["parts_s"].items()},
        "measured": f"median seeds/s over {SPEED_EPOCHS} epochs of gnnscale train (summary.json seeds_per_s)",
    }


def comparison(name: str, graph_dir: Path, scratch: Path) -> dict:
    c = bt.in_child(compare_child, str(graph_dir), str(scratch / "runs" / f"{name}_compare"))
    metric = c["metric"]
    rows = [{k: r.get(k) for k in ("sampler", f"val_{metric}", *ROW_KEYS)} for r in c["rows"]]
    print(f"comparison {name}: winner {c['winner']['sampler']}; {c['agreement']}", flush=True)
    return {
        "graph": name,
        "plan": c["plan_formation"],
        "winner": c["winner"],
        "agreement": c["agreement"],
        "rows": rows,
    }


def speed_sections(graphs: dict, scratch: Path) -> tuple[dict, dict]:
    name = min(graphs, key=lambda k: int(k[3:-1]))  # the smallest synthetic graph
    return speed_row(name, graphs[name], scratch), comparison(name, graphs[name], scratch)


def update_speed(out: str, graphs: dict, scratch: Path) -> None:
    import json

    from gnnscale.utils.atomic import write_json

    result = json.loads(Path(out).read_text())
    result["speed"], result["comparison"] = speed_sections(graphs, scratch)
    write_json(out, result)
    print(f"updated speed and comparison in {out}")


def recommendation(graph_dir: Path | None, overrides: list) -> dict:
    plan = bt.in_child(plan_child, str(graph_dir or "/nonexistent"), overrides)
    rec = plan["recommendation"]
    degrees = plan["graph"]["degrees"] or {}
    return {
        "formation": rec["formation"],
        "reasons": rec["reasons"],
        "numbers": rec["numbers"],
        "degrees": {k: degrees.get(k) for k in ("median", "p99", "max", "gini", "p99_over_median", "skewed")},
    }


def cora_graph(scratch: Path) -> Path | None:
    from gnnscale.config import compose_config
    from gnnscale.stages import build_csr, shard

    path = SHARED / "planetoid_cora"
    if not path.is_dir():
        print(f"{path} is absent: the Cora rows are left out", flush=True)
        return None
    graph_dir = scratch / "cora"
    if not (graph_dir / "csc").is_dir():
        runs = scratch / "runs"
        shard.run(
            compose_config(
                "shard",
                [
                    "data=planetoid",
                    f"data.path={path}",
                    f"graph_dir={graph_dir}",
                    f"run_dir={runs / 'cora_shard'}",
                ],
            )
        )
        build_csr.run(compose_config("build_csr", [f"graph_dir={graph_dir}", f"run_dir={runs / 'cora_csc'}"]))
    return graph_dir


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50000,200000,500000", help="synthetic graphs' node counts")
    ap.add_argument("--no-full", action="store_true", help="leave out the full-graph rows")
    ap.add_argument(
        "--speed-only",
        action="store_true",
        help="run only the speed prediction and the comparison, and replace those two sections of --out",
    )
    ap.add_argument("--no-speed", action="store_true", help="leave out the speed prediction and comparison")
    ap.add_argument("--no-recommend", action="store_true", help="leave out the recommendation table")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "profile"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "profile.json"))
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    graphs = {}
    for n in sizes:
        name = f"syn{n // 1000}k"
        bt.build_graph(scratch / name, n, AVG_DEGREE, FEAT_DIM, NUM_CLASSES)
        graphs[name] = scratch / name
    if args.speed_only:
        return update_speed(args.out, graphs, scratch)
    recs = {}
    if not args.no_recommend:
        skewed = scratch / "skew200k"
        bt.build_graph(skewed, 200_000, AVG_DEGREE, FEAT_DIM, NUM_CLASSES, ("data.power_law_exponent=2.1",))
        cora = cora_graph(scratch)
        targets = {**({"cora": cora} if cora is not None else {}), **graphs, "skew200k": skewed}
        for name, graph_dir in targets.items():
            recs[name] = recommendation(graph_dir, [])
            print(f"recommendation {name}: {recs[name]['formation']}", flush=True)
        recs["described_1e9"] = recommendation(None, ["profile.num_nodes=1e9", "profile.avg_degree=50"])
        print(f"recommendation described_1e9: {recs['described_1e9']['formation']}", flush=True)
    speed, compared = (None, None) if args.no_speed or not graphs else speed_sections(graphs, scratch)
    rows = []
    for name, graph_dir in graphs.items():
        for preset in MINIBATCH_PRESETS:
            rows.append(one_row(name, graph_dir, preset, "minibatch", scratch))
    if not args.no_full:
        full_graphs = {}
        cora = cora_graph(scratch)
        if cora is not None:
            full_graphs["cora"] = cora
        smallest = f"syn{min(sizes) // 1000}k" if sizes else None
        if smallest is not None:
            full_graphs[smallest] = graphs[smallest]
        for name, graph_dir in full_graphs.items():
            for preset in FULL_PRESETS:
                rows.append(one_row(name, graph_dir, preset, "full", scratch))
    result = {
        "method": __doc__.split("    .venv/bin/python")[0].strip(),
        "setup": {
            "avg_degree": AVG_DEGREE,
            "feat_dim": FEAT_DIM,
            "num_classes": NUM_CLASSES,
            "full_epochs": FULL_EPOCHS,
            "minibatch_epochs": 1,
            "budget": BUDGET,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        },
        "rows": rows,
        "all_within_30pct_anon": all(r["anon"]["within_30pct"] for r in rows),
        "recommendations": recs,
        "speed": speed,
        "comparison": compared,
    }
    from gnnscale.utils.atomic import write_json

    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
