"""Memory benchmark: peak RSS and epoch time of `gnnscale train` beside a plain DGL loop, and the memory
plan's estimate beside the measured peak.

Graph (through the real shard + build-csr stages): 200k nodes, average degree 10, 512 float32 features
(~440 MB on disk). Every side trains the same 2-layer GraphSAGE (mean, hidden 256, dropout 0.5) with
fanouts [25, 10] (sage_2hop's), batch 1024, for --epochs, then scores the test split.

  plain_dgl        DGL's documented recipe, everything in memory (scripts/bench_train.py's loop)
  gnnscale         `gnnscale train` with its defaults (feature_cache=auto, prefetch auto, budget auto)
  gnnscale_lean    the leanest settings: train.feature_cache=mmap train.prefetch=0
  gnnscale_base    with --base-src DIR: `gnnscale train` from another source tree (an earlier commit),
                   to say how much a change saved

Each side runs in a fresh spawned child; the graph's files are read just before each starts. Peak RSS
is the child's ru_maxrss (its whole life: loading included, on both sides). --repeats rounds, the order
reversed every other round; quoted: median, min and max of each figure and of the per-round ratios.

    .venv/bin/python scripts/bench_memory.py      # writes bench/results/memory.json (~10 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_train as bt  # noqa: E402  (the plain loop, the gnnscale child, warm(), in_child())

FANOUTS = [25, 10]
SIDES = ("plain_dgl", "gnnscale", "gnnscale_lean")
LEAN = ["train.feature_cache=mmap", "train.prefetch=0"]


def plain_child(graph_dir: str, epochs: int, seed: int, queue) -> None:
    bt.FANOUTS[:] = FANOUTS  # this spawned child's copy of the module
    bt.plain_dgl(graph_dir, epochs, seed, queue)


def gnnscale_child(graph_dir: str, epochs: int, seed: int, run_dir: str, extra: list, queue) -> None:
    bt.FANOUTS[:] = FANOUTS
    bt.gnnscale_train(graph_dir, epochs, seed, run_dir, extra, queue)


def base_child(src: str, graph_dir: str, epochs: int, seed: int, run_dir: str, queue) -> None:
    bt.FANOUTS[:] = FANOUTS
    bt.gnnscale_base_train(src, graph_dir, epochs, seed, run_dir, queue)


def run_side(side: str, graph_dir: Path, scratch: Path, args) -> dict:
    bt.warm(graph_dir)
    if side == "plain_dgl":
        return bt.in_child(plain_child, str(graph_dir), args.epochs, args.seed)
    if side == "gnnscale_base":  # an earlier tree: no memory plan in its summary
        run_dir = str(scratch / "run_base")
        return bt.in_child(base_child, args.base_src, str(graph_dir), args.epochs, args.seed, run_dir)
    run_dir = scratch / f"run_{side}"
    got = bt.in_child(
        gnnscale_child,
        str(graph_dir),
        args.epochs,
        args.seed,
        str(run_dir),
        LEAN if side == "gnnscale_lean" else [],
    )
    plan = json.loads((run_dir / "summary.json").read_text())["memory_plan"]
    return {**got, "memory_plan": plan}


def spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": min(xs), "max": max(xs), "all": xs}


def summarize(args, graph: dict, rounds: list[dict], sides: tuple[str, ...]) -> dict:
    def per_round(side: str, key: str) -> list[float]:
        if key == "epoch_time_s":
            return [round(statistics.mean(r[side][key]), 3) for r in rounds]
        value = [r[side][key] for r in rounds]
        if any(v is None for v in value):
            raise SystemExit(f"{side}: {key} could not be measured; no memory figure without it")
        return value

    out = {side: {k: spread(per_round(side, k)) for k in ("max_rss_mb", "epoch_time_s")} for side in sides}
    ratios = {}
    if "gnnscale_base" in sides:
        for key, name in (("max_rss_mb", "rss"), ("epoch_time_s", "epoch_time")):
            for num, den in (("gnnscale_base", "plain_dgl"), ("gnnscale", "gnnscale_base")):
                per = [round(a / b, 3) for a, b in zip(per_round(num, key), per_round(den, key), strict=True)]
                ratios[f"{num}_over_{den}_{name}"] = {**spread(per), "repeats": len(per)}
    for side in ("gnnscale", "gnnscale_lean"):
        for key, name in (("max_rss_mb", "rss"), ("epoch_time_s", "epoch_time")):
            per = [
                round(a / b, 3)
                for a, b in zip(per_round(side, key), per_round("plain_dgl", key), strict=True)
            ]
            ratios[f"{side}_over_plain_{name}"] = {**spread(per), "repeats": len(per)}
        est = [r[side]["memory_plan"]["rss_estimate_mb"] for r in rounds]
        measured = per_round(side, "max_rss_mb")
        out[side]["estimate"] = {
            "rss_estimate_mb": spread(est),
            "estimate_over_measured": spread([round(e / m, 3) for e, m in zip(est, measured, strict=True)]),
            "plan": rounds[-1][side]["memory_plan"],
        }
        out[side]["feature_cache"] = rounds[-1][side]["feature_cache"]
    return {
        "graph": graph,
        "setup": {"fanouts": FANOUTS, "batch_size": bt.BATCH, "hidden": bt.HIDDEN, "epochs": args.epochs,
                  "repeats": args.repeats, "lean": LEAN, "order": "reversed every other round",
                  "base_src": args.base_src},  # fmt: skip
        "sides": out,
        "ratios": ratios,
        "test_acc": {side: [r[side]["test_acc"] for r in rounds] for side in sides},
        "target": "gnnscale peak RSS <= 1.1 x plain_dgl; estimate within +-30 % of the measured peak",
        "target_met": ratios["gnnscale_over_plain_rss"]["max"] <= 1.1
        and all(0.7 <= x <= 1.3 for s in ("gnnscale", "gnnscale_lean") for x in out[s]["estimate"]["estimate_over_measured"]["all"]),
        "rounds": rounds,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=200_000)
    ap.add_argument("--avg-degree", type=float, default=10.0)
    ap.add_argument("--feat-dim", type=int, default=512)
    ap.add_argument("--num-classes", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-src", help="also run `gnnscale train` from this source tree (side gnnscale_base)")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "memory"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory.json"))
    args = ap.parse_args()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    graph_dir = scratch / "graph"
    graph = bt.build_graph(graph_dir, args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes)
    sides = SIDES + (("gnnscale_base",) if args.base_src else ())
    rounds = []
    for r in range(args.repeats):
        row = {"order": list(bt.in_turn(r, sides))}
        for side in row["order"]:
            got = row[side] = run_side(side, graph_dir, scratch, args)
            print(
                f"[{r + 1}] {side}: max RSS {got['max_rss_mb']} MB, epochs {got['epoch_time_s']} s",
                flush=True,
            )
        rounds.append(row)
    result = summarize(args, graph, rounds, sides)
    from gnnscale.utils.atomic import write_json

    write_json(args.out, result)
    print(json.dumps({"ratios": {k: v["median"] for k, v in result["ratios"].items()}}))
    for side in ("gnnscale", "gnnscale_lean"):
        print(side, json.dumps(result["sides"][side]["estimate"]["estimate_over_measured"]))
    print(f"target met: {result['target_met']}; wrote {args.out}")


if __name__ == "__main__":
    main()
