"""Out-of-core training benchmark: `gnnscale train` on a graph larger than its memory limit.

Graph: bench_storage.py's 5M nodes, average degree 40 (~200M directed edges), 128 float32 features —
features 2.56 GB + CSC 1.63 GB, about 4.2 GB the training reads through memory maps. It is built
once into --graph-dir (reused when present; bench/tmp/storage/graph of `bench_storage.py --keep` too).

Every run trains `+exp=sage_2hop sampler.fanouts=[15,10]` (batch 1024) through the real train stage
for --batches training batches (BatchStream.limit on the train stream: the config has no cap on
batches per epoch; validation and test are cut to --eval-batches batches the same way), each in a
fresh child process, with the page cache dropped first:

  uncapped            no memory limit, no hot-feature cache
  capped_auto         inside a --cap-gb memory cgroup with train.memory_budget=auto: the memory plan
                      counts the whole memory-mapped CSC and one batch's feature pages as must-fit, and
                      refuses (exit 2 at the CLI; its line is recorded)
  capped              inside the cap, train.memory_budget=--budget (above the cap on purpose: the run
                      then has less page cache than the graph needs, which is what is measured), no cache
  capped_cache        the same with train.cache_gb=--cache-gb (a list adds capped_cache_<size> runs)

The cgroup (v1 memory.limit_in_bytes, or v2 memory.max) is made by this script under its own cgroup
and removed after; without a writable one the capped runs are skipped with the reason in the JSON.
The page cache is dropped with /proc/sys/vm/drop_caches where writable, else the graph's files are
evicted with posix_fadvise(DONTNEED); the JSON says which.

Per run, over the training batches (first batch start to last batch end): seeds/s, bytes read from disk
(/proc/self/io read_bytes), major page faults (/proc/self/stat majflt), the time split; over the whole
child: peak anonymous memory (RssAnon, sampled every 50 ms), and the cgroup's own peak; plus the cache
size and its hit rate (metrics.jsonl / summary.json).

    .venv/bin/python scripts/bench_outofcore.py     # writes bench/results/outofcore.json (~20 min on 2 cores)

--reorder degree|rcm shards (once) a copy with that node order into bench/tmp/outofcore/graph_<order>
(~10 min more) and writes bench/results/outofcore_reorder.json instead, setup.node_order saying which.
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_train import build_graph, child_memory  # noqa: E402  (bench_storage.py's graph, the same meters)

GRAPH = {
    "num_nodes": 5_000_000,
    "avg_degree": 40.0,
    "feat_dim": 128,
    "num_classes": 16,
    "nodes_per_shard": 100_000,
}
TRAIN = ["+exp=sage_2hop", "sampler.fanouts=[15,10]", "train.batch_size=1024", "train.epochs=1",
         "train.diagnostics=false", "train.feature_cache=mmap"]  # fmt: skip


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


def _own_cgroup(controller: str | None) -> str:
    """This process's cgroup path in the v1 hierarchy of `controller` (None: the v2 one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller and controller in names.split(",")):
            return path.lstrip("/")
    return ""


class MemoryCgroup:
    """A memory cgroup this script makes and removes: v1 memory.limit_in_bytes or v2 memory.max."""

    def __init__(self, limit: int):
        self.limit, self.path, self.kind, self.why_not = limit, None, None, None
        tried = []
        v1 = Path("/sys/fs/cgroup/memory")
        for parent in (v1 / _own_cgroup("memory"), v1):
            if (parent / "cgroup.procs").is_file() and self._make(parent, "v1", "memory.limit_in_bytes"):
                return
            tried.append(f"v1 {parent}")
        for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
            parent = root / _own_cgroup(None)
            ctl = parent / "cgroup.subtree_control"
            if ctl.is_file() and "memory" in ctl.read_text().split():
                if self._make(parent, "v2", "memory.max"):
                    return
            tried.append(f"v2 {parent}")
        self.why_not = "no writable memory cgroup (tried " + ", ".join(tried) + "; needs root)"

    def _make(self, parent: Path, kind: str, knob: str) -> bool:
        path = parent / f"gnnscale-outofcore-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
            (path / knob).write_text(str(self.limit))
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
            return False
        self.path, self.kind = path, f"cgroup {kind} {knob}"
        return True

    def join(self) -> None:
        """In the child, before exec: move it into the group."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            f = self.path / name
            if f.is_file():
                return int(f.read_text())
        return None

    def reset_peak(self) -> None:
        f = self.path / "memory.max_usage_in_bytes"
        if f.is_file():
            f.write_text("0")

    def remove(self) -> None:
        for _ in range(100):  # the exited child's pages are uncharged asynchronously
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


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
        for s in streams["train"]:
            s.limit(spec["batches"])
        for split in ("val", "test"):
            streams[split].limit(spec["eval_batches"])
        return streams

    class Window(Callback):
        """The training batches: first batch start to last batch end, with disk reads and faults."""

        def __init__(self):
            self.t0 = self.t1 = 0.0
            self.seeds = self.batches = 0
            self.io0 = self.io1 = (0, 0)

        def on_epoch_start(self, epoch: int, num_batches: int) -> None:
            self.t0, self.io0 = time.perf_counter(), _proc_io()

        def on_batch_end(self, epoch, end) -> None:
            self.seeds, self.batches = self.seeds + end.seeds, self.batches + 1
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
    cache = summary.get("hot_feature_cache")
    out = {
        "batches": window.batches,
        "seeds": window.seeds,
        "train_time_s": round(span, 2),
        "seeds_per_s": round(window.seeds / span, 1),
        "disk_read_gb": round(read_b / 1e9, 3),
        "disk_read_mb_per_batch": round(read_b / 1e6 / max(window.batches, 1), 1),
        "major_faults": faults,
        "major_faults_per_batch": round(faults / max(window.batches, 1), 1),
        "time_split_s": {k: record.get(k) for k in ("sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s")},
        "input_nodes_per_batch": record.get("input_nodes_per_batch"),
        "cache_hit_rate": record.get("cache_hit_rate"),
        "cache": cache,
        **child_memory(mem.peak_rss_mb, mem.peak_anon_mb),
        "memory_plan": summary["memory_plan"],
        "whole_run": {
            "wall_time_s": round(wall, 1),
            "disk_read_gb": round((io_end[0] - io_start[0]) / 1e9, 3),
            "major_faults": io_end[1] - io_start[1],
        },
    }  # fmt: skip
    Path(spec["out"]).write_text(json.dumps(out))


# ---------------------------------------------------------------- a run (parent side)
def run(name: str, graph_dir: Path, scratch: Path, args, extra: list, cgroup: MemoryCgroup | None) -> dict:
    dropped = drop_page_cache(graph_dir)
    spec = {
        "graph_dir": str(graph_dir),
        "run_dir": str(scratch / f"run_{name}"),
        "out": str(scratch / f"{name}.json"),
        "batches": args.batches,
        "eval_batches": args.eval_batches,
        "overrides": [*TRAIN, f"train.eval_batch_size={args.eval_batch_size}", *extra],
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
    row = {"overrides": spec["overrides"], "page_cache_dropped": dropped, "exit_code": proc.returncode,
           "child_wall_s": round(time.time() - t0, 1)}  # fmt: skip
    if cgroup is not None:
        row["cap_gb"] = round(cgroup.limit / 1e9, 2)
        peak = cgroup.peak_bytes()
        row["cgroup_peak_gb"] = round(peak / 1e9, 3) if peak is not None else None
    if proc.returncode != 0 or not Path(spec["out"]).is_file():
        row["error"] = (proc.stderr or proc.stdout)[-1500:]
        return row
    row.update(json.loads(Path(spec["out"]).read_text()))
    said = [" ".join(x.split()) for x in proc.stdout.splitlines() if "cache" in x or x.startswith("memory:")]
    row["said"] = said[:6]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph-dir", help="default bench/tmp/outofcore/graph (graph_<order> with --reorder)")
    ap.add_argument(
        "--reorder", default="none", choices=["none", "degree", "rcm"], help="shard.reorder of the graph"
    )
    ap.add_argument("--num-nodes", type=int, default=GRAPH["num_nodes"], help="when building: a quick look")
    ap.add_argument("--batches", type=int, default=80)
    ap.add_argument("--eval-batches", type=int, default=1)
    ap.add_argument("--eval-batch-size", type=int, default=1024)
    ap.add_argument("--cap-gb", type=float, default=3.0)
    ap.add_argument("--cache-gb", default="1.0,0.5", help="comma-separated: one capped run per cache size")
    ap.add_argument(
        "--budget",
        default="4GB",
        help="train.memory_budget of the capped runs (at auto, 90%% of the cap, the plan refuses: see run capped_auto)",
    )
    ap.add_argument("--run-timeout", type=int, default=900)
    ap.add_argument("--only", help="comma-separated runs: uncapped,capped,capped_cache")
    ap.add_argument(
        "--out", help="default bench/results/outofcore.json (outofcore_reorder.json with --reorder)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from gnnscale.storage.verify import verify_graph_dir
    from gnnscale.utils.atomic import write_json

    GRAPH["num_nodes"] = args.num_nodes
    suffix = "" if args.reorder == "none" else f"_{args.reorder}"
    args.graph_dir = args.graph_dir or str(ROOT / "bench" / "tmp" / "outofcore" / f"graph{suffix}")
    results = ROOT / "bench" / "results"
    args.out = args.out or str(
        results / ("outofcore.json" if args.reorder == "none" else "outofcore_reorder.json")
    )
    graph_dir = find_graph(Path(args.graph_dir), args.reorder)
    verify_graph_dir(graph_dir, "stamp")  # the stamps once here, so no run pays for the first hash
    scratch = Path(args.graph_dir).parent / f"runs_outofcore{suffix}"
    scratch.mkdir(parents=True, exist_ok=True)
    cap = int(args.cap_gb * 1e9)
    budget = [f"train.memory_budget={args.budget}"]
    caches = [float(x) for x in args.cache_gb.split(",")]
    plan = {
        "uncapped": ([], False),
        "capped_auto": ([], True),  # train.memory_budget=auto under the cap: what the plan says
        "capped": (budget, True),
        **{
            f"capped_cache{'' if i == 0 else f'_{gb:g}'}": ([*budget, f"train.cache_gb={gb}"], True)
            for i, gb in enumerate(caches)
        },
    }
    wanted = args.only.split(",") if args.only else list(plan)
    runs: dict = {}
    cgroup = MemoryCgroup(cap)
    try:
        for name in wanted:
            extra, capped = plan[name]
            if capped and cgroup.path is None:
                runs[name] = {"skipped": cgroup.why_not}
                continue
            runs[name] = run(name, graph_dir, scratch, args, extra, cgroup if capped else None)
            r = runs[name]
            print(f"{name}: " + json.dumps({k: r.get(k) for k in ("exit_code", "seeds_per_s", "disk_read_gb", "major_faults", "peak_anon_mb", "cache_hit_rate", "cgroup_peak_gb")}), flush=True)  # fmt: skip
    finally:
        if cgroup.path is not None:
            cgroup.remove()
    base = runs.get("uncapped", {}).get("seeds_per_s")
    for r in runs.values():
        if base and r.get("seeds_per_s"):
            r["seeds_per_s_vs_uncapped"] = round(r["seeds_per_s"] / base, 3)
    best = runs.get("capped_cache", {})
    result = {
        "graph": describe_graph(graph_dir),
        "setup": {
            "train": TRAIN,
            "batches": args.batches,
            "eval_batches": args.eval_batches,
            "eval_batch_size": args.eval_batch_size,
            "cap_gb": args.cap_gb,
            "cache_gb": args.cache_gb,
            "cgroup": cgroup.kind or cgroup.why_not,
            "drop_caches_writable": os.access("/proc/sys/vm/drop_caches", os.W_OK),
            "node_order": f"shard.reorder={node_order_of(graph_dir)}",
            "batch_cap": "BatchStream.limit on the train / val / test streams (no config key caps batches)",
        },  # fmt: skip
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },  # fmt: skip
        "runs": runs,
        "targets": {
            "capped_cache_completes": best.get("exit_code") == 0,
            "capped_cache_peak_anon_under_2_5_gb": (best.get("peak_anon_mb") or 1e9) < 2.5e9 / 2**20,
            "capped_cache_at_least_half_uncapped_seeds_per_s": (best.get("seeds_per_s_vs_uncapped") or 0)
            >= 0.5,
        },  # fmt: skip
    }
    write_json(args.out, result)
    print(json.dumps(result["targets"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
