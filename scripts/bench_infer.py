"""Inference benchmark: gnnscale's layer-wise inference beside a naive full-graph forward of the same model,
and `infer --update` beside a full layer-wise run on the updated graph.

Default: a 500k-node / ~10M-edge / 128-feature synthetic graph and a 3-layer GraphSAGE (hidden 256,
random weights: throughput and memory do not depend on the values). Every measurement runs in its own
freshly spawned process, so peak RSS (VmRSS) and peak anonymous memory (RssAnon, sampled every 20 ms:
heap that the kernel cannot reclaim, unlike the page cache of mmap'd files) belong to that run alone.

  naive        features loaded into RAM, every layer on the whole graph at once (eval, no_grad)
  layerwise    `gnnscale infer --layerwise` with the default memory budget (layers in page cache)
  disk         the same with infer.storage=disk: layers streamed from disk whatever the budget
  update       `gnnscale infer --update` for each --update-fracs F: F of the nodes get new features and
               F x --edge-per-feat more edges (defaults 0.1 %, 1 %, 5 % of nodes; 0.05 %, 0.5 %, 2.5 % edges)
  full_updated a full layer-wise run on that updated graph (what the update must equal, and beat)

How the numbers are made to hold on a shared, noisy machine:
  - naive / layerwise / disk run --repeat rounds; update / full run --update-repeat pairs per fraction.
    Odd rounds run the sides in reverse order, so no side always goes first (or always last).
  - Before every timed run, the files that run reads (the graph; for an update also the base run's
    layer files) are read once, so every side starts from the same warm page cache.
  - Ratios, never lone times: per repeat, of the medians and of the bests (minima), with min/max over
    the repeats and a plain reading: "above 1 in every repeat", "below 1 ..." or "on par".
  - Memory: peak RSS beside peak RssAnon. The layer-wise run keeps its layers in mmap'd page cache,
    which RssAnon leaves out but VmRSS counts; the naive run's activations are anonymous heap.

    .venv/bin/python scripts/bench_infer.py     # the issue's size, writes bench/results/infer.json (~12-15 min, 2 cores)
    .venv/bin/python scripts/bench_infer.py --num-nodes 20000 --repeat 2 --update-repeat 2 \\
        --scratch /tmp/bench_infer --out /tmp/infer_quick.json     # a quick look (~1-2 min)
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

    from gnnscale.models.checkpoint import load_model
    from gnnscale.sampling.graph import to_dgl_graph
    from gnnscale.storage.feature_store import FeatureStore
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.utils.memory import MemorySampler, measured_mb

    graph = GraphDir(args.graph)
    ck = load_model(args.ckpt)
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
        # measured_mb raises on an unreadable meter: the worker exits non-zero and spawn() stops the run.
        "peak_rss_mb": round(measured_mb(mem.peak_rss_mb, "naive peak VmRSS"), 1),
        "peak_anon_mb": round(measured_mb(mem.peak_anon_mb, "naive peak RssAnon"), 1),
    }


def worker_infer(args) -> dict:
    from gnnscale.config import compose_config
    from gnnscale.stages import infer
    from gnnscale.utils.memory import MemorySampler, measured_mb

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
        "peak_rss_mb": round(measured_mb(mem.peak_rss_mb, "infer peak VmRSS"), 1),
        "peak_anon_mb": round(measured_mb(mem.peak_anon_mb, "infer peak RssAnon"), 1),
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


def warm(*paths: Path) -> None:
    """Read every file under `paths` once, so the next run finds them in the page cache.

    Runs write gigabytes of layer files (some with O_DIRECT) and page cache is shared with other jobs,
    so whatever the previous run left there is a matter of chance; reading the inputs just before each
    timed run gives every side the same, warm start.
    """
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in files:
            with open(p, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def in_turn(r: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """Round r's running order: as given in even rounds, reversed in odd ones, so every pair alternates."""
    return sides if r % 2 == 0 else sides[::-1]


def spread(xs: list[float]) -> dict:
    """Median, minimum (the best, for times), maximum and every value of a list of times or sizes."""
    return {
        "median": round(median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
        "all": [round(x, 3) for x in xs],
    }


def ratio_block(num: list[float], den: list[float], meaning: str) -> dict:
    """num / den per repeat (same round), of the medians and of the bests, with the spread and a reading.

    The reading is "on par" unless every repeat's ratio lies on the same side of 1: with a handful of
    repeats on a shared machine, a median alone can land on either side by chance.
    """
    per = [round(a / b, 3) for a, b in zip(num, den, strict=True)]
    if min(per) > 1:
        reading = "above 1 in every repeat"
    elif max(per) < 1:
        reading = "below 1 in every repeat"
    else:
        reading = "on par: repeats on both sides of 1"
    return {
        "meaning": meaning,
        "repeats": len(per),
        "ratio_of_medians": round(median(num) / median(den), 3),
        "ratio_of_bests": round(min(num) / min(den), 3),
        "median_per_repeat": round(median(per), 3),
        "min_per_repeat": min(per),
        "max_per_repeat": max(per),
        "per_repeat": per,
        "reading": reading,
    }


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


def _detail(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in ("run_dir", "affected", "changes")}


class Bench:
    """The graph, the checkpoint and where runs go; launches one measured process per call."""

    def __init__(self, args, scratch: Path, graph_dir: Path, ckpt: Path):
        self.args, self.scratch, self.graph_dir, self.ckpt = args, scratch, graph_dir, ckpt
        self.res, self.runs = scratch / "results", scratch / "runs_infer"
        self.common = [f"ckpt={ckpt}", f"infer.batch_size={args.batch_size}"]

    def infer(self, name: str, *extra: str) -> dict:
        overrides = [*self.common, f"run_dir={self.runs / name}", *extra]
        return spawn("infer", self.res / f"{name}.json", overrides=json.dumps(overrides))

    def naive(self, r: int) -> dict:
        save = self.scratch / "naive"  # every round overwrites it; the last one is compared below
        return spawn("naive", self.res / f"naive_{r}.json", graph=self.graph_dir, ckpt=self.ckpt, save=save)

    def layerwise(self, name: str, r: int, *extra: str) -> dict:
        """Round 0's run is kept (the update's base, the equality checks); later rounds' are removed."""
        run_name = name if r == 0 else f"{name}_{r}"
        row = self.infer(run_name, f"graph_dir={self.graph_dir}", *extra)
        if r:
            shutil.rmtree(self.runs / run_name)
        return row


# ---------------------------------------------------------------- layer-wise vs naive (and disk)
def layerwise_rounds(b: Bench) -> tuple[dict[str, list[dict]], list[list[str]]]:
    """--repeat rounds of naive, layer-wise and disk-streamed runs, each on a freshly warmed graph."""
    rows: dict[str, list[dict]] = {"naive": [], "layerwise": [], "disk": []}
    orders = []
    for r in range(b.args.repeat):
        order = in_turn(r, ("naive", "layerwise", "disk"))
        orders.append(list(order))
        for side in order:
            warm(b.graph_dir, b.ckpt)
            if side == "naive":
                rows[side].append(b.naive(r))
            elif side == "layerwise":
                rows[side].append(b.layerwise("layerwise", r))
            else:
                rows[side].append(b.layerwise("disk", r, "infer.storage=disk"))
    return rows, orders


def best_with_lists(rows: list[dict], time_key: str, list_keys: tuple[str, ...]) -> dict:
    """The fastest run's record (as before), plus every run's value of each key in list_keys."""
    best = min(rows, key=lambda x: x[time_key])
    out = {k: v for k, v in best.items() if k != "run_dir"}
    for k in list_keys:
        out[f"{k}_all"] = [x[k] for x in rows]
    return out


def memory_block(rows: dict[str, list[dict]]) -> dict:
    """Peak RSS and peak RssAnon of every side, and both ratios to the naive run (medians over rounds)."""
    out: dict = {
        "note": (
            "peak_anon_mb leaves out page cache: the layer-wise run's layer files are mmap'd page cache, so "
            "they count in peak_rss_mb but not in peak_anon_mb, while the naive run's activations are "
            "anonymous heap and count in both. Quote both ratios."
        )
    }
    for side, rs in rows.items():
        out[side] = {
            "peak_rss_mb": spread([x["peak_rss_mb"] for x in rs]),
            "peak_anon_mb": spread([x["peak_anon_mb"] for x in rs]),
        }
    for side in ("layerwise", "disk"):
        for kind in ("rss", "anon"):
            key = f"peak_{kind}_mb"
            out[f"{kind}_{side}_over_naive"] = round(
                out[side][key]["median"] / out["naive"][key]["median"], 3
            )
    return out


# ---------------------------------------------------------------- infer --update vs a full run
def update_vs_full(b: Bench, feat_frac: float, num_layers: int) -> dict:
    """`infer --update` at one change size against a full layer-wise run on the updated graph.

    An untimed reference update writes the delta the updated graph is built from, and a reference full
    run on it gives the outputs the update must equal. Then --update-repeat timed pairs, the order
    switching every pair, each run on freshly warmed inputs: the update reads the original graph and the
    base run's layer files, the full run reads the updated graph.
    """
    args, runs, tag = b.args, b.runs, f"{feat_frac:g}"
    edge_frac = feat_frac * args.edge_per_feat
    changes_path = b.scratch / f"changes_{tag}.npz"
    changes = make_changes(b.graph_dir, changes_path, feat_frac, edge_frac, seed=1)
    base, updated = runs / "layerwise", b.scratch / f"graph_updated_{tag}"
    upd_args = (f"infer.changes={changes_path}", f"infer.base={base}")

    warm(b.graph_dir, base, b.ckpt)
    ref_update = b.infer(f"update_{tag}", *upd_args)
    spawn(
        "write_graph",
        b.res / f"write_graph_{tag}.json",
        graph=b.graph_dir,
        delta=runs / f"update_{tag}" / "graph_delta.npz",
        save=updated,
    )
    warm(updated, b.ckpt)
    b.infer(f"full_{tag}", f"graph_dir={updated}")
    eq, eq_z = {}, {}
    for i in range(1, num_layers + 1):
        for prefix, found in (("h", eq), ("z", eq_z)):
            upd_file = runs / f"update_{tag}" / "layers" / f"{prefix}_{i}.npy"
            if upd_file.is_file():
                found[f"{prefix}_{i}"] = max_abs_diff(
                    upd_file, runs / f"full_{tag}" / "layers" / f"{prefix}_{i}.npy"
                )
    shutil.rmtree(runs / f"update_{tag}")
    shutil.rmtree(runs / f"full_{tag}")

    updates, fulls, orders = [], [], []
    for r in range(args.update_repeat):
        order = in_turn(r, ("update", "full"))
        orders.append(list(order))
        for side in order:
            name = f"{side}_{tag}_{r}"
            if side == "update":
                warm(b.graph_dir, base, b.ckpt)
                updates.append(b.infer(name, *upd_args))
            else:
                warm(updated, b.ckpt)
                fulls.append(b.infer(name, f"graph_dir={updated}"))
            shutil.rmtree(runs / name)
    shutil.rmtree(updated)

    def times(rows: list[dict], key: str) -> list[float]:
        return [x[key] for x in rows]

    def speedup(key: str, what: str) -> dict:
        meaning = f"full run {what} / update {what}: > 1 = the update is faster"
        return ratio_block(times(fulls, key), times(updates, key), meaning)

    mu, mf = _medians(updates), _medians(fulls)
    return {
        "feat_frac": feat_frac,
        "edge_frac": edge_frac,
        "changes": changes,
        "applied": ref_update.get("changes"),
        "affected_per_layer": ref_update.get("affected"),
        "update": _detail(updates[0]),
        "full_on_updated_graph": _detail(fulls[0]),
        "runs": {
            "order": orders,
            "update": {k: times(updates, k) for k in ("infer_time_s", "infer_cpu_s", "stage_wall_s")},
            "full_on_updated_graph": {
                k: times(fulls, k) for k in ("infer_time_s", "infer_cpu_s", "stage_wall_s")
            },
            "update_layers_s": [_layer_seconds(x) for x in updates],
            "full_layers_s": [_layer_seconds(x) for x in fulls],
            "update_peak_rss_mb": times(updates, "peak_rss_mb"),
            "full_peak_rss_mb": times(fulls, "peak_rss_mb"),
        },
        "median": {"update": mu, "full_on_updated_graph": mf},
        "speedup": {
            "wall": speedup("infer_time_s", "compute wall s"),
            "cpu": speedup("infer_cpu_s", "compute CPU s"),
            "stage_wall": speedup("stage_wall_s", "stage wall s (load and publish included)"),
            "per_layer_median": [
                round(f / u, 3) for f, u in zip(mf["layers_s"], mu["layers_s"], strict=True)
            ],
        },
        "equality_max_abs_per_layer": eq,
        "equality_max_abs_conv_outputs": eq_z,
    }


def update_summary(inc: list[dict]) -> dict:
    """One line per change size, and the sizes at which the update beat the full run in every repeat."""
    rows = []
    for x in inc:
        s = x["speedup"]["wall"]
        rows.append(
            {
                "feat_frac": x["feat_frac"],
                "edge_frac": x["edge_frac"],
                "affected_row_fraction_per_layer": [a["fraction"] for a in x["affected_per_layer"] or []],
                **{k: s[k] for k in ("repeats", "ratio_of_medians", "ratio_of_bests", "per_repeat")},
                "min_max": [s["min_per_repeat"], s["max_per_repeat"]],
                "reading": s["reading"],
            }
        )
    return {
        "meaning": "full run s / update s (compute wall): > 1 = the update is faster",
        "by_change_size": rows,
        "update_faster_at_feat_fracs": [r["feat_frac"] for r in rows if r["reading"].startswith("above")],
        "update_slower_at_feat_fracs": [r["feat_frac"] for r in rows if r["reading"].startswith("below")],
        "on_par_at_feat_fracs": [r["feat_frac"] for r in rows if r["reading"].startswith("on par")],
    }


# ---------------------------------------------------------------- main
def parse_args():
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
    ap.add_argument(
        "--repeat", type=int, default=5, help="rounds of naive / layer-wise / disk runs (order alternates)"
    )
    ap.add_argument(
        "--update-fracs",
        default="0.001,0.01,0.05",
        help="comma-separated fractions of nodes whose features change, one update bench each",
    )
    ap.add_argument(
        "--edge-per-feat",
        type=float,
        default=0.5,
        help="added edges as a fraction of stored edges = this x the feature fraction",
    )
    ap.add_argument(
        "--update-repeat", type=int, default=5, help="update / full pairs per change size (order alternates)"
    )
    ap.add_argument("--skip-incremental", action="store_true")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "infer"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "infer.json"))
    ap.add_argument("--keep", action="store_true", help="keep the generated graph for the next run")
    return ap.parse_args()


def equality_checks(b: Bench) -> dict:
    """Largest absolute differences: layer-wise vs naive, disk-streamed vs in-memory (round 0's runs)."""
    runs, naive, L = b.runs, b.scratch / "naive", b.args.layers
    return {
        "embeddings_layerwise_vs_naive": max_abs_diff(
            runs / "layerwise" / "embeddings.npy", naive / "embeddings.npy"
        ),
        "logits_layerwise_vs_naive": max_abs_diff(
            runs / "layerwise" / "layers" / f"h_{L}.npy", naive / "logits.npy"
        ),
        "embeddings_disk_vs_layerwise": max_abs_diff(
            runs / "disk" / "embeddings.npy", runs / "layerwise" / "embeddings.npy"
        ),
    }


def throughput_blocks(rows: dict[str, list[dict]], orders: list[list[str]]) -> dict:
    """Naive vs layer-wise (wall, CPU, with the naive load) and disk vs memory, round by round."""
    naive, lw = rows["naive"], rows["layerwise"]
    lw_t = [x["infer_time_s"] for x in lw]
    return {
        "order": orders,
        "wall": ratio_block(
            [x["forward_s"] for x in naive],
            lw_t,
            "naive forward s / layer-wise s: > 1 = layer-wise is faster",
        ),
        "cpu": ratio_block(
            [x["forward_cpu_s"] for x in naive],
            [x["infer_cpu_s"] for x in lw],
            "naive forward CPU s / layer-wise CPU s (all threads): > 1 = layer-wise uses less CPU",
        ),
        # The naive side's load (features into RAM, graph build) added: what a user waits for end to end.
        "wall_with_naive_load": ratio_block(
            [x["total_s"] for x in naive], lw_t, "naive load + forward s / layer-wise s"
        ),
        "disk_vs_memory": ratio_block(
            [x["infer_time_s"] for x in rows["disk"]],
            lw_t,
            "disk-streamed layer-wise s / in-memory layer-wise s: > 1 = disk is slower",
        ),
    }


def side_records(rows: dict[str, list[dict]]) -> dict:
    """Each side's fastest run in full, with every round's times and memory beside it."""
    mem = ("peak_rss_mb", "peak_anon_mb")
    naive = best_with_lists(rows["naive"], "forward_s", ("forward_s", "forward_cpu_s", "total_s", *mem))
    naive["forward_layers_s_median"] = [
        round(median(x), 3) for x in zip(*(x["forward_layers_s"] for x in rows["naive"]), strict=True)
    ]
    lw = best_with_lists(rows["layerwise"], "infer_time_s", ("infer_time_s", "infer_cpu_s", *mem))
    lw["layers_s_median"] = [
        round(median(x), 3) for x in zip(*(_layer_seconds(x) for x in rows["layerwise"]), strict=True)
    ]
    disk = best_with_lists(rows["disk"], "infer_time_s", ("infer_time_s", "infer_cpu_s", *mem))
    return {"naive_full_graph": naive, "layerwise": lw, "layerwise_disk": disk}


def headline_ratios(memory: dict, throughput: dict) -> dict:
    """The headline numbers in one place; each comes from a block that has its spread."""
    return {
        "anon_median_layerwise_over_naive": memory["anon_layerwise_over_naive"],
        "rss_median_layerwise_over_naive": memory["rss_layerwise_over_naive"],
        "anon_median_disk_over_naive": memory["anon_disk_over_naive"],
        "rss_median_disk_over_naive": memory["rss_disk_over_naive"],
        "throughput_median_wall": throughput["wall"]["ratio_of_medians"],
        "throughput_best_wall": throughput["wall"]["ratio_of_bests"],
        "throughput_per_repeat_wall": throughput["wall"]["per_repeat"],
        "throughput_reading": throughput["wall"]["reading"],
        "throughput_median_cpu": throughput["cpu"]["ratio_of_medians"],
        "throughput_median_wall_with_naive_load": throughput["wall_with_naive_load"]["ratio_of_medians"],
        "disk_slowdown_median": throughput["disk_vs_memory"]["ratio_of_medians"],
        "disk_slowdown_best": throughput["disk_vs_memory"]["ratio_of_bests"],
    }


def setup_info(args, meta: dict) -> dict:
    return {
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
            "num_layers": args.layers,
            "weights": "random (seed 0)",
        },
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "update_repeat": args.update_repeat,
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "method": (
            "every run in a fresh process; the files each run reads are read just before it (warm page "
            "cache); the order of the sides reverses every other round; ratios per round, of the medians "
            "and of the bests"
        ),
    }


def targets(results: dict) -> dict:
    ratios, equality = results["ratios"], results["equality_max_abs"]
    out = {
        "anon_at_most_40pct_of_naive": ratios["anon_median_layerwise_over_naive"] <= 0.40,
        "throughput_at_least_0.8x_naive_forward": ratios["throughput_median_wall"] >= 0.8,
        "layerwise_equals_naive_1e-4": max(equality.values()) <= 1e-4,
    }
    if "incremental" in results:
        inc = results["incremental"]
        out["incremental_equals_full_1e-5"] = (
            max(v for x in inc for v in x["equality_max_abs_per_layer"].values()) <= 1e-5
        )
        # Faster = the full run took longer than the update in every repeat, per change size.
        out["incremental_faster_than_full"] = {
            f"{x['feat_frac']:g}": x["speedup"]["wall"]["reading"].startswith("above") for x in inc
        }
    return out


def main() -> None:
    args = parse_args()
    if args.worker:
        Path(args.result).write_text(json.dumps(WORKERS[args.worker](args)))
        return
    fracs = [float(x) for x in args.update_fracs.split(",") if x.strip()]

    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for stale in ["runs_infer", "naive", "results", *(p.name for p in scratch.glob("graph_updated*"))]:
        shutil.rmtree(scratch / stale, ignore_errors=True)
    (scratch / "results").mkdir()
    t0 = time.time()
    graph_dir = build_graph(scratch, args)
    ckpt = make_ckpt(scratch, graph_dir, args)
    meta = json.loads((graph_dir / "meta.json").read_text())
    graph_info = {
        "nodes": meta["num_nodes"],
        "edges": meta["num_edges"],
        "build_s": round(time.time() - t0, 1),
    }
    print(json.dumps({"graph": graph_info}), flush=True)
    b = Bench(args, scratch, graph_dir, ckpt)

    rows, orders = layerwise_rounds(b)
    equality = equality_checks(b)
    print(json.dumps({"equality": equality}), flush=True)
    shutil.rmtree(scratch / "naive")
    shutil.rmtree(b.runs / "disk")
    throughput, memory = throughput_blocks(rows, orders), memory_block(rows)
    results: dict = {
        **setup_info(args, meta),
        **side_records(rows),
        "throughput": throughput,
        "memory": memory,
        "equality_max_abs": equality,
        "ratios": headline_ratios(memory, throughput),
    }
    print(json.dumps({"ratios": results["ratios"]}), flush=True)
    if not args.skip_incremental:
        inc = []
        for frac in fracs:
            inc.append(update_vs_full(b, frac, args.layers))
            s = inc[-1]["speedup"]["wall"]
            line = {k: s[k] for k in ("ratio_of_medians", "ratio_of_bests", "per_repeat", "reading")}
            print(json.dumps({f"update_{frac:g}": line, "equality": inc[-1]["equality_max_abs_per_layer"]}))
        results["incremental"] = inc
        results["incremental_summary"] = update_summary(inc)
    results["targets"] = targets(results)
    if meta["num_nodes"] < 500_000:
        results["note"] = (
            "the memory and throughput targets are set for the 500k-node graph; at this size the ~300 MB "
            "process baseline (torch + dgl) dominates peak memory, so only the equality results carry over"
        )
    results["bench_wall_s"] = round(time.time() - t0, 1)
    from gnnscale.utils.atomic import write_json

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, results)
    print(json.dumps({"targets": results["targets"]}), flush=True)
    shutil.rmtree(b.runs, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
