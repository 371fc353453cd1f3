"""Out-of-core training benchmark: `gnnscale train` on a graph larger than its memory limit.

Graph (--preset): `5m` is bench_storage.py's 5M nodes, average degree 40 (~199M directed edges), 128
float32 features (features 2.56 GB + CSC 0.82 GB with int32 neighbour ids) in a 3 GB cgroup; `1m` is 1M
nodes / ~20M edges / 256 features (1 GB of features) in a 0.9 GB cgroup; `2m` is 2M nodes / ~79M edges /
128 features in 1.5 GB. Each is built once into bench/tmp/outofcore/graph[_<preset>] (reused when present).

Every run trains `+exp=sage_2hop sampler.fanouts=[15,10]` (batch 1024, train.diagnostics=false) through the
real train stage with the memory settings at their defaults (train.memory_budget=auto,
train.feature_cache=auto), each in a fresh child process with the page cache dropped first:

  uncapped   no memory limit: the features fit in RAM, so auto holds them there
  capped     inside a --cap-gb memory cgroup: auto reads them from disk by a sweep (training/sweep.py)

for --batches training batches (BatchStream.limit on the train stream; 0 = the whole epoch, then the
test split is scored too; the default 300 is a tenth of the 5m epoch, long enough that the sweep's first
pass, which fills its pipeline once an epoch, is not most of the time measured), --rounds times in alternating order (uncapped first in odd rounds). Every
training batch's loss is recorded, and the capped run's must equal the uncapped one's.

The cgroup (v1 memory.limit_in_bytes, or v2 memory.max) is made by this script under its own cgroup
and removed after; without a writable one the capped runs are skipped with the reason in the JSON.
The page cache is dropped with /proc/sys/vm/drop_caches where writable, else the graph's files are
evicted with posix_fadvise(DONTNEED); the JSON says which.

Per run, over the training batches (first batch start to last batch end): seeds/s, bytes read from disk
(/proc/self/io read_bytes, which counts O_DIRECT reads too) against the bytes of the rows each batch
gathers, major page faults, the time split; over the whole child: peak anonymous memory (RssAnon,
sampled every 50 ms) against the plan's budget, the cgroup's own peak; summary.json's feature_reads
(batches, chunks and rows read, rows evicted, batches in flight, read amplification). The disk probe
(storage/disk_probe.py) is rerun before each round (this shared disk's rate drifts) and recorded with it; then `gnnscale profile`
runs with the same settings inside the same cgroup, and its predicted capped seeds/s (plan.read_ahead,
profile/read_ahead.py, from that probe) is set against the round's capped run.

    .venv/bin/python scripts/bench_outofcore.py                  # bench/results/outofcore.json
    .venv/bin/python scripts/bench_outofcore.py --preset 1m --batches 0 --rounds 1
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_train import build_graph, child_memory  # noqa: E402  (bench_storage.py's graph, the same meters)

from tests.cgroups import MemoryCgroup  # noqa: E402  (the test's own cgroup, made and removed here too)

PRESETS = {
    "5m": {"num_nodes": 5_000_000, "avg_degree": 40.0, "feat_dim": 128, "cap_gb": 3.0},
    "1m": {"num_nodes": 1_000_000, "avg_degree": 20.0, "feat_dim": 256, "cap_gb": 0.9},
    "2m": {"num_nodes": 2_000_000, "avg_degree": 40.0, "feat_dim": 128, "cap_gb": 1.5},
}
GRAPH = {"num_classes": 16, "nodes_per_shard": 100_000, **PRESETS["5m"]}
TRAIN = ["+exp=sage_2hop", "sampler.fanouts=[15,10]", "train.batch_size=1024", "train.epochs=1",
         "train.diagnostics=false"]  # fmt: skip


# ---------------------------------------------------------------- the graph
def node_order_of(graph_dir: Path) -> str:
    meta = json.loads((graph_dir / "meta.json").read_text())
    return (meta.get("node_order") or {}).get("method", "none")


def find_graph(wanted: Path, reorder: str = "none") -> Path:
    candidates = (wanted, ROOT / "bench" / "tmp" / "storage" / "graph") if reorder == "none" else (wanted,)
    for candidate in candidates:
        if (candidate / "csc" / "indices.npy").is_file() and node_order_of(candidate) == reorder:
            return candidate
    print(
        f"building the {GRAPH['num_nodes']:,}-node graph (shard.reorder={reorder}) into {wanted} (~10 min, ~6 GB)",
        flush=True,
    )
    extra = (f"shard.nodes_per_shard={GRAPH['nodes_per_shard']}",)
    if reorder != "none":  # only then: the unordered graph's bench_data.json stamp stays valid
        extra += (f"shard.reorder={reorder}",)
    build_graph(
        wanted, *(GRAPH[k] for k in ("num_nodes", "avg_degree", "feat_dim", "num_classes")), extra=extra
    )  # fmt: skip
    return wanted


def describe_graph(graph_dir: Path) -> dict:
    meta = json.loads((graph_dir / "meta.json").read_text())
    feats = sum(f.stat().st_size for f in graph_dir.glob("part_*.pt"))
    csc = sum(f.stat().st_size for f in (graph_dir / "csc").glob("*.npy"))
    return {
        "graph_dir": str(graph_dir),
        "num_nodes": meta["num_nodes"],
        "num_edges": meta["csc"]["num_edges"],
        "feat_dim": meta["feat_dim"],
        "shards_gb": round(feats / 1e9, 2),
        "csc_gb": round(csc / 1e9, 2),
    }


# ---------------------------------------------------------------- page cache and cgroups
def drop_page_cache(graph_dir: Path) -> str:
    """'drop_caches' when /proc/sys/vm/drop_caches took it, else 'fadvise' (the graph's files only)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return "drop_caches"
    except OSError:
        for f in graph_dir.rglob("*"):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return "fadvise"


# ---------------------------------------------------------------- a run (child side)
def _proc_io() -> tuple[int, int]:
    """(read_bytes from storage, major faults) of this process so far."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(io["read_bytes"]), int(stat[9])  # field 12 (majflt), counted after "pid (comm)"


def child(spec: dict) -> None:
    """One train run through the real stage; writes spec['out'] (JSON)."""
    import gnnscale.stages.train as stage
    import gnnscale.training.build as build
    from gnnscale.config import compose_config
    from gnnscale.errors import GnnscaleError
    from gnnscale.training.trainer import Callback
    from gnnscale.utils.memory import MemorySampler

    make_streams = build.build_streams

    def capped_streams(*a, **k):
        streams = make_streams(*a, **k)
        if spec["batches"]:
            for s in streams["train"]:
                s.limit(spec["batches"])
            for split in ("val", "test"):
                streams[split].limit(spec["eval_batches"])
        return streams

    class Window(Callback):
        """The training batches: first batch start to last batch end, with disk reads, faults, losses."""

        def __init__(self):
            self.t0 = self.t1 = 0.0
            self.seeds = self.batches = self.rows = 0
            self.io0 = self.io1 = (0, 0)
            self.losses: list[float] = []

        def on_epoch_start(self, epoch: int, num_batches: int) -> None:
            self.t0, self.io0 = time.perf_counter(), _proc_io()

        def on_batch_end(self, epoch, end) -> None:
            self.seeds, self.batches = self.seeds + end.seeds, self.batches + 1
            self.rows += len(end.input_nodes)
            self.losses.append(end.loss)
            self.t1, self.io1 = time.perf_counter(), _proc_io()

    window = Window()
    make_callbacks = stage._callbacks
    build.build_streams = capped_streams  # build_trainer looks it up in its module at call time
    stage._callbacks = lambda *a, **k: make_callbacks(*a, **k) + [window]
    cfg = compose_config(
        "train", [f"graph_dir={spec['graph_dir']}", f"run_dir={spec['run_dir']}", *spec["overrides"]]
    )
    io_start, t_start = _proc_io(), time.perf_counter()
    with MemorySampler(0.05) as mem:
        try:
            summary = stage.run(cfg)
        except GnnscaleError as e:  # the memory plan's refusal: what it says is the result
            Path(spec["out"]).write_text(json.dumps({"refused": e.one_line()}))
            return
    io_end = _proc_io()
    wall = time.perf_counter() - t_start
    record = json.loads((Path(spec["run_dir"]) / "metrics.jsonl").read_text().splitlines()[0])
    span = max(window.t1 - window.t0, 1e-9)
    read_b, faults = window.io1[0] - window.io0[0], window.io1[1] - window.io0[1]
    row_bytes = spec["row_bytes"]
    n = max(window.batches, 1)
    plan = summary["memory_plan"]
    out = {
        "batches": window.batches,
        "seeds": window.seeds,
        "train_time_s": round(span, 2),
        "seeds_per_s": round(window.seeds / span, 1),
        "disk_read_gb": round(read_b / 1e9, 3),
        "disk_read_mb_per_batch": round(read_b / 1e6 / n, 1),
        # what each batch gathers (its unique input rows) against what the process read from disk for it
        "rows_needed_mb_per_batch": round(window.rows * row_bytes / 1e6 / n, 1),
        "read_vs_needed": round(read_b / max(window.rows * row_bytes, 1), 3),
        "major_faults": faults,
        "major_faults_per_batch": round(faults / n, 1),
        "time_split_s": {k: record.get(k) for k in ("sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s")},
        "input_nodes_per_batch": record.get("input_nodes_per_batch"),
        "feature_reads": summary.get("feature_reads"),
        "test_acc": summary.get("test_acc"),
        **child_memory(mem.peak_rss_mb, mem.peak_anon_mb),
        "peak_anon_within_budget": (mem.peak_anon_mb or 0) <= plan["budget_mb"],
        "memory_plan": plan,
        "losses": window.losses,
        "whole_run": {
            "wall_time_s": round(wall, 1),
            "disk_read_gb": round((io_end[0] - io_start[0]) / 1e9, 3),
            "major_faults": io_end[1] - io_start[1],
        },
    }  # fmt: skip
    Path(spec["out"]).write_text(json.dumps(out))


# ---------------------------------------------------------------- a run (parent side)
def run(name: str, graph_dir: Path, scratch: Path, args, cgroup: MemoryCgroup | None) -> dict:
    dropped = drop_page_cache(graph_dir)
    meta = json.loads((graph_dir / "meta.json").read_text())
    spec = {
        "graph_dir": str(graph_dir),
        "run_dir": str(scratch / f"run_{name}"),
        "out": str(scratch / f"{name}.json"),
        "batches": args.batches,
        "eval_batches": args.eval_batches,
        "row_bytes": int(meta["feat_dim"]) * 4,
        "overrides": [*TRAIN, *args.extra],
    }
    Path(spec["out"]).unlink(missing_ok=True)
    shutil.rmtree(spec["run_dir"], ignore_errors=True)
    if cgroup is not None:
        cgroup.reset_peak()
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        preexec_fn=cgroup.join if cgroup is not None else None,
        capture_output=True, text=True, timeout=args.run_timeout,
    )  # fmt: skip
    row = {
        "overrides": spec["overrides"],
        "page_cache_dropped": dropped,
        "exit_code": proc.returncode,
        "child_wall_s": round(time.time() - t0, 1),
        "load_avg_1min_after": round(os.getloadavg()[0], 2),
    }  # fmt: skip  (other work on the machine)
    if cgroup is not None:
        row["cap_gb"] = round(cgroup.limit_bytes / 1e9, 2)
        peak = cgroup.peak_bytes()
        row["cgroup_peak_gb"] = round(peak / 1e9, 3) if peak is not None else None
    if proc.returncode != 0 or not Path(spec["out"]).is_file():
        row["error"] = (proc.stderr or proc.stdout)[-1500:]
        return row
    row.update(json.loads(Path(spec["out"]).read_text()))
    keep = ("features", "graph structure", "memory:", "evaluation batches", "hot-feature", "training batches")
    row["said"] = [" ".join(x.split()) for x in proc.stdout.splitlines() if x.strip().startswith(keep)][:6]
    return row


def predict(graph_dir: Path, scratch: Path, args, cgroup: MemoryCgroup | None) -> dict:
    """`gnnscale profile` with the runs' settings inside the same cgroup (its budget is the cap's): its
    predicted seeds/s for the capped run (plan.read_ahead) and with the features in RAM (plan.speed)."""
    drop_page_cache(graph_dir)
    run_dir = scratch / "profile"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "gnnscale", "profile", f"graph_dir={graph_dir}", f"run_dir={run_dir}",
           "profile.plots=false", *TRAIN, *args.extra]  # fmt: skip
    proc = subprocess.run(cmd, preexec_fn=cgroup.join if cgroup is not None else None, capture_output=True,
                          text=True, timeout=args.run_timeout)  # fmt: skip
    if proc.returncode != 0:
        return {"exit_code": proc.returncode, "error": (proc.stderr or proc.stdout)[-1500:]}
    plan = json.loads((run_dir / "profile.json").read_text())["plan"]
    ahead = plan.get("read_ahead") or {}
    return {
        "in_ram_seeds_per_s": round((plan.get("speed") or {}).get("seeds_per_s") or 0, 1),
        "capped_seeds_per_s": ahead.get("seeds_per_s"),
        "read_ahead": ahead,
        "feature_cache": plan["minibatch"]["plan"]["feature_cache"],
    }


def _median(xs: list) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def summarise(rounds: list[dict]) -> dict:
    """Per-round ratios, the median, and whether every capped batch's loss equals the uncapped one's."""
    ratios, equal = [], []
    for r in rounds:
        u, c = r.get("uncapped", {}), r.get("capped", {})
        if u.get("seeds_per_s") and c.get("seeds_per_s"):
            ratios.append(round(c["seeds_per_s"] / u["seeds_per_s"], 3))
        if u.get("losses") and c.get("losses"):
            equal.append(u["losses"] == c["losses"])
    capped = [r["capped"] for r in rounds if r.get("capped", {}).get("seeds_per_s")]
    predicted = [
        round(r["profile_prediction"]["capped_seeds_per_s"] / r["capped"]["seeds_per_s"], 3)
        for r in rounds
        if (r.get("profile_prediction") or {}).get("capped_seeds_per_s")
        and r.get("capped", {}).get("seeds_per_s")
    ]
    return {
        "capped_seeds_per_s_median": _median([c["seeds_per_s"] for c in capped]),
        "uncapped_seeds_per_s_median": _median(
            [r["uncapped"]["seeds_per_s"] for r in rounds if r.get("uncapped", {}).get("seeds_per_s")]
        ),
        "capped_vs_uncapped_per_round": ratios,
        "profile_predicted_over_measured_per_round": predicted,
        "profile_predicted_over_measured_median": _median(predicted),
        "capped_vs_uncapped_median": _median(ratios),
        "losses_equal_every_round": bool(equal) and all(equal),
        "capped_peak_anon_within_budget": bool(capped) and all(c["peak_anon_within_budget"] for c in capped),
        "capped_read_amplification_median": _median([(c.get("feature_reads") or {}).get("read_amplification") for c in capped]),
        "capped_read_vs_needed_median": _median([c.get("read_vs_needed") for c in capped]),
        "capped_batches_in_flight_median": _median([(c.get("feature_reads") or {}).get("in_flight_mean") for c in capped]),
        "capped_rows_evicted_median": _median([(c.get("feature_reads") or {}).get("rows_evicted") for c in capped]),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="5m", choices=sorted(PRESETS), help="the graph and its cap")
    ap.add_argument(
        "--graph-dir", help="default bench/tmp/outofcore/graph (graph_<preset> for other presets)"
    )
    ap.add_argument("--reorder", default="none", choices=["none", "degree", "rcm"], help="shard.reorder")
    ap.add_argument("--num-nodes", type=int, help="when building: a quick look at a smaller graph")
    ap.add_argument("--batches", type=int, default=300, help="training batches per run (0 = the whole epoch)")
    ap.add_argument("--eval-batches", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap-gb", type=float, help="the cgroup's limit (default: the preset's)")
    ap.add_argument("--extra", nargs="*", default=[], help="more train overrides for both runs")
    ap.add_argument("--run-timeout", type=int, default=1800)
    ap.add_argument("--only", help="comma-separated runs: uncapped,capped")
    ap.add_argument("--out", help="default bench/results/outofcore[_<preset>].json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from gnnscale.storage.disk_probe import probe_disk
    from gnnscale.storage.verify import verify_graph_dir
    from gnnscale.utils.atomic import write_json

    GRAPH.update(PRESETS[args.preset])
    if args.num_nodes:
        GRAPH["num_nodes"] = args.num_nodes
    cap_gb = args.cap_gb or GRAPH["cap_gb"]
    suffix = ("" if args.preset == "5m" else f"_{args.preset}") + (
        "" if args.reorder == "none" else f"_{args.reorder}"
    )
    args.graph_dir = args.graph_dir or str(ROOT / "bench" / "tmp" / "outofcore" / f"graph{suffix}")
    args.out = args.out or str(ROOT / "bench" / "results" / f"outofcore{suffix}.json")
    graph_dir = find_graph(Path(args.graph_dir), args.reorder)
    verify_graph_dir(graph_dir, "stamp")  # the stamps once here, so no run pays for the first hash
    scratch = Path(args.graph_dir).parent / f"runs_outofcore{suffix}"
    scratch.mkdir(parents=True, exist_ok=True)
    wanted = args.only.split(",") if args.only else ["uncapped", "capped"]
    rounds: list[dict] = []
    cgroup = MemoryCgroup(int(cap_gb * 1e9))
    try:
        for i in range(args.rounds):
            probe = probe_disk(graph_dir, refresh=True)  # the shared disk's rate drifts: measured each round
            predicted = None
            if "capped" in wanted and cgroup.path is not None:  # from that probe, just before the runs
                predicted = predict(graph_dir, scratch, args, cgroup)
                print(f"round {i + 1} profile predicts: " + json.dumps({k: predicted.get(k) for k in ("in_ram_seeds_per_s", "capped_seeds_per_s", "feature_cache", "error")}), flush=True)  # fmt: skip
            order = wanted if i % 2 == 0 else wanted[::-1]
            runs: dict = {}
            for name in order:
                capped = name == "capped"
                if capped and cgroup.path is None:
                    runs[name] = {"skipped": cgroup.why_not}
                    continue
                runs[name] = run(name, graph_dir, scratch, args, cgroup if capped else None)
                r = runs[name]
                print(f"round {i + 1} {name}: " + json.dumps({k: r.get(k) for k in ("exit_code", "refused", "seeds_per_s", "disk_read_mb_per_batch", "rows_needed_mb_per_batch", "peak_anon_mb", "cgroup_peak_gb", "test_acc")}), flush=True)  # fmt: skip
            rounds.append({"order": order, "disk": probe, "profile_prediction": predicted, **runs})
    finally:
        if cgroup.path is not None:
            cgroup.remove()
    summary = summarise(rounds)
    result = {
        "graph": describe_graph(graph_dir),
        "setup": {
            "preset": args.preset,
            "train": TRAIN + list(args.extra),
            "memory_settings": "defaults: train.memory_budget=auto, train.feature_cache=auto",
            "batches": args.batches or "the whole epoch",
            "eval_batches": args.eval_batches if args.batches else "all",
            "rounds": args.rounds,
            "cap_gb": cap_gb,
            "cgroup": cgroup.kind or cgroup.why_not,
            "drop_caches_writable": os.access("/proc/sys/vm/drop_caches", os.W_OK),
            "node_order": f"shard.reorder={node_order_of(graph_dir)}",
        },
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "summary": summary,
        "rounds": rounds,
    }
    write_json(args.out, result)
    print(json.dumps(summary))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
