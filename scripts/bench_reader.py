"""FeatureReader vs the mmap gather, with the page cache dropped before every read.

A synthetic graph (through the real shard + build-csr stages, reused when present) of 2M nodes x 128
float32 features (1 GB of features, 512-byte rows) in bench/tmp/reader/. Row sets, sorted and unique as
the training side hands them over: sparse (50k random rows, 2.5 %) and dense (500k and 1M rows).

For every set: FeatureReader with O_DIRECT and buffered, in_flight 1/4/16/32, gap_bytes 4K/64K/256K
(max_request_bytes 4 MiB, buffer 64 MiB), then a max_request_bytes sweep at the best of those; against
FeatureStore.gather over the shards' mmaps after madvise(MADV_RANDOM) (what train does when the graph
exceeds the page cache) and with the kernel's default read-around. Each read runs --repeats times, in
a shuffled order (the disk is shared and noisy; the median is quoted), after `sync; echo 1 >
/proc/sys/vm/drop_caches`. Quoted per read: MB/s of useful rows, and read amplification = bytes this
process read from the disk (/proc/self/io read_bytes) / useful bytes. The disk probe (probe_disk,
refreshed) runs before and after, as the yardstick. Rows are checked bit-equal to the mmap gather.

    .venv/bin/python scripts/bench_reader.py                    # bench/results/reader.json (~15 min)
    .venv/bin/python scripts/bench_reader.py --quick --out /tmp/reader_quick.json   # a quick look
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DGLBACKEND", "pytorch")

import torch  # noqa: E402

from gnnscale.storage.disk_probe import probe_disk  # noqa: E402
from gnnscale.storage.feature_reader import FeatureReader  # noqa: E402
from gnnscale.storage.feature_store import FeatureStore  # noqa: E402
from gnnscale.storage.graph_dir import GraphDir  # noqa: E402


def drop_caches() -> bool:
    """Empty the page cache (root only): every read then comes from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def disk_read_bytes() -> int:
    """Bytes this process (all its threads) caused to be read from storage, page faults included."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def row_sets(num_nodes: int, sparse: int, dense: list[int], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sizes = {f"sparse_{sparse // 1000}k": sparse, **{f"dense_{n // 1000}k": n for n in dense}}
    return {
        name: torch.sort(torch.randperm(num_nodes, generator=gen)[:n]).values for name, n in sizes.items()
    }


def timed(fn) -> tuple[float, int]:
    """(seconds, disk bytes read) of fn() from an empty page cache."""
    drop_caches()
    before, t0 = disk_read_bytes(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, disk_read_bytes() - before


def reader_case(direct: bool, in_flight: int, gap: int, max_request: int) -> dict:
    return {
        "method": "reader",
        "direct": direct,
        "in_flight": in_flight,
        "gap_bytes": gap,
        "max_request_bytes": max_request,
    }


def run_case(case: dict, graph: GraphDir, ids: torch.Tensor) -> tuple[float, int, dict]:
    """One timed read; returns (seconds, disk bytes, extra facts)."""
    if case["method"] == "mmap":
        # a fresh mapping each time: pages mapped by a live mapping survive drop_caches
        store = FeatureStore(GraphDir(graph.path))
        store.advise(case["advice"])
        secs, disk = timed(lambda: store.gather(ids))
        del store
        gc.collect()
        return secs, disk, {}
    kw = {k: case[k] for k in ("direct", "in_flight", "gap_bytes", "max_request_bytes")}
    with FeatureReader(graph, **kw) as reader:
        secs, disk = timed(lambda: reader.read_rows(ids))
        return secs, disk, {"requests": reader.stats["requests"], "reader_bytes": reader.stats["bytes_read"]}


def measure(cases: list[dict], graph: GraphDir, sets: dict, row_bytes: int, repeats: int, seed: int) -> list:
    """Every (set, case) `repeats` times, in an order shuffled per round; medians per (set, case)."""
    runs = {}
    rng = random.Random(seed)
    jobs = [(name, i) for name in sets for i in range(len(cases))]
    for rnd in range(repeats):
        rng.shuffle(jobs)
        for k, (name, i) in enumerate(jobs):
            secs, disk, extra = run_case(cases[i], graph, sets[name])
            runs.setdefault((name, i), []).append((secs, disk, extra))
            print(
                f"  round {rnd + 1}/{repeats} {k + 1}/{len(jobs)} {name} {label(cases[i])}: {secs:.2f}s",
                flush=True,
            )
    out = []
    for (name, i), got in sorted(runs.items()):
        useful = len(sets[name]) * row_bytes
        secs = statistics.median(g[0] for g in got)
        disk = statistics.median(g[1] for g in got)
        out.append(
            {
                "set": name,
                **cases[i],
                "seconds_median": round(secs, 3),
                "seconds_all": [round(g[0], 3) for g in got],
                "useful_mb_s": round(useful / secs / 1e6, 1),
                # the best round: on a shared disk the least disturbed one
                "useful_mb_s_best": round(useful / min(g[0] for g in got) / 1e6, 1),
                "read_amplification": round(disk / useful, 2),
                **got[0][2],
            }
        )
    return out


def label(case: dict) -> str:
    if case["method"] == "mmap":
        return f"mmap[{case['advice']}]"
    mode = "direct" if case["direct"] else "buffered"
    return f"reader[{mode} x{case['in_flight']} gap {case['gap_bytes'] >> 10}K req {case['max_request_bytes'] >> 10}K]"


def check_equal(graph: GraphDir, sets: dict) -> bool:
    store = FeatureStore(GraphDir(graph.path))  # its own mapping, dropped on return
    with FeatureReader(graph) as reader:
        return all(torch.equal(reader.read_rows(ids), store.gather(ids)) for ids in sets.values())


def choose_defaults(results: list[dict], sets: dict, direct: bool | None = None) -> dict:
    """The reader setting (among O_DIRECT or buffered ones when `direct` says which) whose worst ratio
    to the best reader result of each set is highest: one default never far from the best, sparse or
    dense."""
    best = {
        s: max(r["useful_mb_s"] for r in results if r["set"] == s and r["method"] == "reader") for s in sets
    }
    scores = {}
    for r in results:
        if r["method"] != "reader" or (direct is not None and r["direct"] != direct):
            continue
        key = (r["direct"], r["in_flight"], r["gap_bytes"], r["max_request_bytes"])
        scores.setdefault(key, {})[r["set"]] = r["useful_mb_s"] / best[r["set"]]
    full = {k: min(v.values()) for k, v in scores.items() if len(v) == len(sets)}
    key = max(full, key=full.get)
    return {
        "direct": key[0],
        "in_flight": key[1],
        "gap_bytes": key[2],
        "max_request_bytes": key[3],
        "worst_fraction_of_best": round(full[key], 3),
    }


def summary(results: list[dict], sets: dict) -> dict:
    out = {}
    for s in sets:
        mine = [r for r in results if r["set"] == s]
        best = max((r for r in mine if r["method"] == "reader"), key=lambda r: r["useful_mb_s"])
        mmap = {r["advice"]: r for r in mine if r["method"] == "mmap"}
        out[s] = {
            "best_reader": label(best),
            "best_reader_mb_s": best["useful_mb_s"],
            "best_reader_amplification": best["read_amplification"],
            "mmap_random_mb_s": mmap["random"]["useful_mb_s"],
            "mmap_random_amplification": mmap["random"]["read_amplification"],
            "mmap_normal_mb_s": mmap["normal"]["useful_mb_s"],
            "mmap_normal_amplification": mmap["normal"]["read_amplification"],
            "speedup_vs_mmap_random": round(best["useful_mb_s"] / mmap["random"]["useful_mb_s"], 1),
            "best_reader_mb_s_best_round": max(
                r["useful_mb_s_best"] for r in mine if r["method"] == "reader"
            ),
            "mmap_random_mb_s_best_round": mmap["random"]["useful_mb_s_best"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=2_000_000)
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--sparse", type=int, default=50_000)
    ap.add_argument("--dense", type=int, nargs="+", default=[500_000, 1_000_000])
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--gaps", type=int, nargs="+", default=[4 << 10, 64 << 10, 256 << 10])
    ap.add_argument("--max-requests", type=int, nargs="+", default=[256 << 10, 1 << 20, 4 << 20, 16 << 20])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probe-seconds", type=float, default=1.5)
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "reader"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "reader.json"))
    ap.add_argument("--quick", action="store_true", help="200k nodes, 1 round, fewer settings")
    args = ap.parse_args()
    if args.quick:
        args.num_nodes, args.sparse, args.dense, args.repeats = 200_000, 5_000, [50_000], 1
        args.in_flight, args.gaps, args.max_requests = [1, 16], [4 << 10, 64 << 10], [1 << 20]
        args.probe_seconds = 0.3

    from bench_train import build_graph

    scratch = Path(args.scratch)
    t0 = time.time()
    graph_dir = scratch / ("graph_quick" if args.quick else "graph")  # the quick one never replaces it
    info = build_graph(graph_dir, args.num_nodes, 2, args.feat_dim, 16)
    graph = GraphDir(graph_dir)
    sets = row_sets(graph.num_nodes, args.sparse, args.dense, args.seed)
    row_bytes = args.feat_dim * 4
    dropped = drop_caches()
    probe_before = probe_disk(graph.path, seconds=args.probe_seconds, refresh=True)
    print("disk probe:", json.dumps(probe_before), flush=True)
    equal = check_equal(graph, sets)
    gc.collect()
    print("rows bit-equal to the mmap gather:", equal, flush=True)

    default_request = 4 << 20
    grid = [
        reader_case(d, f, g, default_request)
        for d, f, g in itertools.product([True, False], args.in_flight, args.gaps)
    ]
    mmap_cases = [{"method": "mmap", "advice": a} for a in ("random", "normal")]
    loads = [os.getloadavg()[0]]
    results = measure(grid + mmap_cases, graph, sets, row_bytes, args.repeats, args.seed)
    loads.append(os.getloadavg()[0])
    # O_DIRECT is the default whatever the uncapped numbers say (under a memory cap buffered reads
    # fill the page cache the sampler's CSC pages need): the request sizes are swept at its best
    # setting, in both modes
    first = choose_defaults(results, sets, direct=True)
    sweep = [
        reader_case(d, first["in_flight"], first["gap_bytes"], m)
        for d in (True, False)
        for m in args.max_requests
        if m != default_request
    ]
    if sweep:
        results += measure(sweep, graph, sets, row_bytes, args.repeats, args.seed + 1)
    loads.append(os.getloadavg()[0])
    probe_after = probe_disk(graph.path, seconds=args.probe_seconds, refresh=True)
    report = {
        "what": "FeatureReader vs mmap gather, page cache dropped before every read; medians of repeats",
        "graph": {
            **info,
            "feature_bytes": graph.num_nodes * args.feat_dim * 4,
            "row_bytes": args.feat_dim * 4,
        },
        "sets": {name: len(ids) for name, ids in sets.items()},
        "page_cache_dropped": dropped,
        "rows_bit_equal_to_mmap_gather": equal,
        "repeats": args.repeats,
        "disk_probe_before": probe_before,
        "disk_probe_after": probe_after,
        "load_average_1min": [round(x, 2) for x in loads],
        "summary": summary(results, sets),
        "defaults_chosen": choose_defaults(results, sets, direct=True),
        "best_buffered": choose_defaults(results, sets, direct=False),
        "results": results,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "wall_s": round(time.time() - t0, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"summary": report["summary"], "defaults_chosen": report["defaults_chosen"]}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
