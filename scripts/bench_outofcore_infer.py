"""Out-of-core inference benchmark: `gnnscale infer --layerwise` on a graph larger than its memory limit.

The graph and cap are bench_outofcore.py's (--preset; 5m: 5M nodes / 199M edges / 128 float32 features
in a 3 GB cgroup), built there once. The model is `+exp=sage_2hop`'s (GraphSAGE mean, 128 -> 256 -> 16,
batch norm), with untrained weights: what inference costs does not depend on their values, and no
full-graph training fits. Each run is the real infer stage with its defaults (infer.memory_budget=auto,
infer.storage=auto), in a fresh child process with the page cache dropped first:

  uncapped   no memory limit: the layers are held in memory, each read in place
  capped     inside a --cap-gb memory cgroup: the first layer's input (the features) is streamed by
             destination tiles (inference/tiled.py), the second computed from projections

--rounds times in alternating order. Per run: the stage's compute time (infer_time_s), nodes/s, bytes
read from disk (/proc/self/io read_bytes, O_DIRECT included), peak anonymous memory against the budget,
the cgroup's peak, each layer's time and how its input was read. The capped run's embeddings and
predictions must equal the uncapped run's of the same round, bit for bit. The disk probe
(storage/disk_probe.py) is rerun before each round and recorded with it.

    .venv/bin/python scripts/bench_outofcore_infer.py            # bench/results/outofcore_infer.json
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_outofcore import GRAPH, PRESETS, _median, _proc_io, describe_graph, drop_page_cache, find_graph  # noqa: E402
from bench_train import child_memory  # noqa: E402

from tests.cgroups import MemoryCgroup  # noqa: E402

MODEL = {"hidden": 256, "num_layers": 2, "norm": "batch", "aggregator": "mean"}  # +exp=sage_2hop's


def child(spec: dict) -> None:
    """One infer run through the real stage; writes spec['out'] (JSON)."""
    import gnnscale.stages.infer as stage
    from gnnscale.config import compose_config
    from gnnscale.utils.memlimit import resolve_budget
    from gnnscale.utils.memory import MemorySampler

    cfg = compose_config(
        "infer", [f"ckpt={spec['ckpt']}", f"graph_dir={spec['graph_dir']}", f"run_dir={spec['run_dir']}"]
    )
    io0, t0 = _proc_io(), time.perf_counter()
    with MemorySampler(0.05) as mem:
        summary = stage.run(cfg)
    io1 = _proc_io()
    budget = resolve_budget("auto", "infer.memory_budget").bytes / 1e6  # what the stage planned with
    out = {
        "infer_time_s": summary["infer_time_s"],
        "nodes_per_s": summary["nodes_per_s"],
        "wall_time_s": round(time.perf_counter() - t0, 1),
        "disk_read_gb": round((io1[0] - io0[0]) / 1e9, 3),
        "major_faults": io1[1] - io0[1],
        "layers": summary["layers"],
        "storage": summary["storage"],
        **child_memory(mem.peak_rss_mb, mem.peak_anon_mb),
        "budget_mb": budget,
        "peak_anon_within_budget": (mem.peak_anon_mb or 0) <= budget,
    }  # fmt: skip
    Path(spec["out"]).write_text(json.dumps(out))


def run(name: str, graph_dir: Path, ckpt: Path, scratch: Path, args, cgroup: MemoryCgroup | None) -> dict:
    dropped = drop_page_cache(graph_dir)
    spec = {"graph_dir": str(graph_dir), "ckpt": str(ckpt), "run_dir": str(scratch / f"run_{name}"),
            "out": str(scratch / f"{name}.json")}  # fmt: skip
    Path(spec["out"]).unlink(missing_ok=True)
    shutil.rmtree(spec["run_dir"], ignore_errors=True)
    if cgroup is not None:
        cgroup.reset_peak()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        preexec_fn=cgroup.join if cgroup is not None else None,
        capture_output=True, text=True, timeout=args.run_timeout,
    )  # fmt: skip
    row = {"page_cache_dropped": dropped, "exit_code": proc.returncode,
           "load_avg_1min_after": round(os.getloadavg()[0], 2)}  # fmt: skip
    if cgroup is not None:
        row["cap_gb"] = round(cgroup.limit_bytes / 1e9, 2)
        peak = cgroup.peak_bytes()
        row["cgroup_peak_gb"] = round(peak / 1e9, 3) if peak is not None else None
    if proc.returncode != 0 or not Path(spec["out"]).is_file():
        row["error"] = (proc.stderr or proc.stdout)[-1500:]
        return row
    row.update(json.loads(Path(spec["out"]).read_text()))
    return row


def same_outputs(a: Path, b: Path, chunk: int = 1 << 19) -> bool:
    """embeddings.npy and predictions.npy of two run dirs equal, compared a slice at a time."""
    for name in ("embeddings.npy", "predictions.npy"):
        x, y = np.load(a / name, mmap_mode="r"), np.load(b / name, mmap_mode="r")
        if x.shape != y.shape or not all(
            np.array_equal(x[i : i + chunk], y[i : i + chunk]) for i in range(0, len(x), chunk)
        ):
            return False
    return True


def summarise(rounds: list[dict]) -> dict:
    ratios = [
        round(r["capped"]["nodes_per_s"] / r["uncapped"]["nodes_per_s"], 3)
        for r in rounds
        if r.get("capped", {}).get("nodes_per_s") and r.get("uncapped", {}).get("nodes_per_s")
    ]
    capped = [r["capped"] for r in rounds if r.get("capped", {}).get("nodes_per_s")]
    return {
        "capped_vs_uncapped_per_round": ratios,
        "capped_vs_uncapped_median": _median(ratios),
        "uncapped_infer_time_s_median": _median([r["uncapped"].get("infer_time_s") for r in rounds if r.get("uncapped")]),
        "capped_infer_time_s_median": _median([c["infer_time_s"] for c in capped]),
        "outputs_equal_every_round": bool(rounds) and all(r.get("outputs_equal") for r in rounds),
        "capped_peak_anon_within_budget": bool(capped) and all(c["peak_anon_within_budget"] for c in capped),
        "capped_disk_read_gb_median": _median([c["disk_read_gb"] for c in capped]),
        "capped_runs_failed": sum(1 for r in rounds if r.get("capped", {}).get("exit_code")),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="5m", choices=sorted(PRESETS), help="the graph and its cap")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap-gb", type=float, help="the cgroup's limit (default: the preset's)")
    ap.add_argument("--run-timeout", type=int, default=1800)
    ap.add_argument("--out", help="default bench/results/outofcore_infer[_<preset>].json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from gnnscale.storage.disk_probe import probe_disk
    from gnnscale.utils.atomic import write_json
    from tests.test_infer_support import make_ckpt

    GRAPH.update(PRESETS[args.preset])
    cap_gb = args.cap_gb or GRAPH["cap_gb"]
    suffix = "" if args.preset == "5m" else f"_{args.preset}"
    graph_dir = find_graph(ROOT / "bench" / "tmp" / "outofcore" / f"graph{suffix}")
    out = Path(args.out or ROOT / "bench" / "results" / f"outofcore_infer{suffix}.json")
    scratch = ROOT / "bench" / "tmp" / "outofcore" / f"runs_infer{suffix}"
    ckpt = scratch / "ckpt" / "checkpoints" / "last.pt"
    if not ckpt.is_file():
        make_ckpt(scratch / "ckpt", graph_dir, steps=0, **MODEL)
    rounds: list[dict] = []
    cgroup = MemoryCgroup(int(cap_gb * 1e9))
    try:
        for i in range(args.rounds):
            probe = probe_disk(graph_dir, refresh=True)
            order = ["uncapped", "capped"] if i % 2 == 0 else ["capped", "uncapped"]
            runs: dict = {}
            for name in order:
                if name == "capped" and cgroup.path is None:
                    runs[name] = {"skipped": cgroup.why_not}
                    continue
                runs[name] = run(name, graph_dir, ckpt, scratch, args, cgroup if name == "capped" else None)
                r = runs[name]
                print(f"round {i + 1} {name}: " + json.dumps({k: r.get(k) for k in ("exit_code", "infer_time_s", "disk_read_gb", "peak_anon_mb", "cgroup_peak_gb", "error")}), flush=True)  # fmt: skip
            ok = all(runs[k].get("exit_code") == 0 for k in runs)
            equal = ok and same_outputs(scratch / "run_uncapped", scratch / "run_capped")
            rounds.append({"order": order, "disk": probe, "outputs_equal": equal, **runs})
            print(f"round {i + 1}: outputs equal {equal}", flush=True)
    finally:
        if cgroup.path is not None:
            cgroup.remove()
        for name in ("uncapped", "capped"):
            shutil.rmtree(scratch / f"run_{name}", ignore_errors=True)
    summary = summarise(rounds)
    write_json(
        out,
        {
            "graph": describe_graph(graph_dir),
            "setup": {
                "preset": args.preset,
                "model": {**MODEL, "arch": "sage", "weights": "untrained (the cost does not depend on them)"},
                "memory_settings": "defaults: infer.memory_budget=auto, infer.storage=auto",
                "rounds": args.rounds,
                "cap_gb": cap_gb,
                "cgroup": cgroup.kind or cgroup.why_not,
                "drop_caches_writable": os.access("/proc/sys/vm/drop_caches", os.W_OK),
            },
            "machine": {
                "cpus": len(os.sched_getaffinity(0)),
                "platform": platform.platform(),
                "python": platform.python_version(),
            },  # fmt: skip
            "summary": summary,
            "rounds": rounds,
        },
    )
    print(json.dumps(summary))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
