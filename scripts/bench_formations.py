"""Formations benchmark: every sampler's `+exp=` preset as is, on real and synthetic graphs, side by side.

Per graph and formation: the test metric (mean ± std over --seeds), the median epoch time, the sampled
nodes (input rows gathered) and edges (message-passing edges, every layer) per training batch, and the
peak anonymous memory of the train stage. Each run is a fresh child process (spawned), one at a time.

Graphs (built through the real shard + build-csr stages into --scratch):
  cora        Planetoid Cora, public split (140 / 500 / 1,000), accuracy
  tolokers    het_tolokers split 0, ROC-AUC (binary, 22% positive)
  synthetic   gnnscale's default synthetic graph (20k nodes), accuracy; also the features-only MLP
  skew200k    a 200k-node synthetic graph with skewed degrees (power-law exponent 2.1), accuracy

Real graphs are read from ../shared/data (their public sources: Planetoid, Kimiyoung/planetoid on GitHub;
tolokers, yandex-research/heterophilous-graphs). Per-graph overrides (fewer epochs on the large graph)
are listed in the JSON next to each result.

    .venv/bin/python scripts/bench_formations.py                      # bench/results/formations.{json,md}
    .venv/bin/python scripts/bench_formations.py --graphs cora --formations neighbor,full --seeds 0
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DGLBACKEND", "pytorch")
SHARED = ROOT.parent / "shared" / "data"

from gnnscale.sampling import PRESETS as FORMATION_PRESETS  # noqa: E402

# formation -> its +exp= preset (run as is; per-graph overrides below only shorten the large graph)
PRESETS = {
    **FORMATION_PRESETS,
    "two_phase": "two_phase",
    "mlp": "sage_2hop",  # the features-only baseline: sage_2hop's settings with model.arch=mlp
}
EXTRA = {"mlp": ["model.arch=mlp"]}

GRAPHS = {
    "cora": {
        "shard": ["data=planetoid", f"data.path={SHARED / 'planetoid_cora'}"],
        "metric": "acc",
        "train": [],
    },
    "tolokers": {
        "shard": ["data=npz", f"data.path={SHARED / 'het_tolokers' / 'tolokers.npz'}", "data.split_index=0"],
        "metric": "roc_auc",
        "train": ["train.metric=roc_auc", "train.epochs=60", "train.patience=20"],
    },
    "synthetic": {"shard": [], "metric": "acc", "train": ["train.epochs=20", "train.patience=0"]},
    "skew200k": {
        "shard": [
            "data.num_nodes=200000",
            "data.avg_degree=15",
            "data.power_law_exponent=2.1",
            "data.name=skew200k",
        ],
        "metric": "acc",
        "train": ["train.epochs=4", "train.patience=0", "train.eval_every=4"],
    },
}
# Full-graph training takes one step per epoch: it needs more epochs than the mini-batch formations.
FULL_EPOCHS = {"synthetic": 200, "skew200k": 60, "tolokers": 300}


def build_graph(name: str, scratch: Path) -> Path:
    from gnnscale.config import compose_config
    from gnnscale.stages import build_csr, shard

    graph_dir = scratch / "graphs" / name
    if (graph_dir / "csc").is_dir() and (graph_dir / "meta.json").is_file():
        return graph_dir
    spec = GRAPHS[name]["shard"]
    runs = scratch / "runs" / name
    shard.run(
        compose_config(
            "shard", [*spec, f"graph_dir={graph_dir}", f"run_dir={runs / 'shard'}", "overwrite=true"]
        )
    )
    build_csr.run(compose_config("build_csr", [f"graph_dir={graph_dir}", f"run_dir={runs / 'csc'}"]))
    return graph_dir


def skipped(graph: str, formation: str) -> bool:
    """The MLP baseline runs where its gap to the GNNs is the question; two_phase only on Cora, whose
    preset epochs it keeps (its phases fix the run's epochs, so the other graphs' train.epochs clash)."""
    return (formation == "mlp" and graph == "tolokers") or (formation == "two_phase" and graph != "cora")


def overrides_for(graph: str, formation: str) -> list[str]:
    extra = list(GRAPHS[graph]["train"]) + EXTRA.get(formation, [])
    if formation == "full" and graph in FULL_EPOCHS:
        extra = [o for o in extra if not o.startswith(("train.epochs=", "train.eval_every="))]
        extra.append(f"train.epochs={FULL_EPOCHS[graph]}")
    return extra


def batch_sizes(run_dir: Path, k: int = 5) -> dict:
    """Mean input nodes and message-passing edges over k training batches of the run's own sampler."""
    import numpy as np
    from omegaconf import OmegaConf

    from gnnscale.sampling import build_loader
    from gnnscale.training.build import build_samplers
    from gnnscale.training.data import load_train_data
    from gnnscale.training.seeding import reseed

    cfg = OmegaConf.load(run_dir / "config.yaml")
    data = load_train_data(cfg.graph_dir)
    samplers = build_samplers(cfg, data, run_dir / "sampler")
    train = samplers["train"][0] if isinstance(samplers["train"], list) else samplers["train"]
    reseed(0)
    loader = build_loader(data.g, data.splits["train"], train, int(cfg.train.batch_size), shuffle=True)
    nodes, edges = [], []
    for b in itertools.islice(loader, k):
        nodes.append(len(b.input_nodes))
        edges.append(sum(s.num_edges() for s in b.blocks) if b.blocks is not None else b.subgraph.num_edges())
    return {"nodes_per_batch": float(np.mean(nodes)), "edges_per_batch": float(np.mean(edges))}


def train_child(graph_dir: str, preset: str, extra: list, seed: int, run_dir: str, q) -> None:
    from gnnscale.config import compose_config
    from gnnscale.stages import train

    overrides = [
        f"+exp={preset}",
        f"graph_dir={graph_dir}",
        f"run_dir={run_dir}",
        "overwrite=true",
        f"seed={seed}",
    ]
    s = train.run(compose_config("train", [*overrides, *extra]))
    m = s["metric"]
    q.put(
        {
            "test": s[f"test_{m}"],
            "best_val": s[f"best_val_{m}"],
            "epochs_run": s["epochs_run"],
            "epoch_time_s": s["epoch_time_s"],
            "peak_anon_mb": s.get("peak_anon_mb"),
            "peak_rss_mb": s.get("peak_rss_mb"),
            **batch_sizes(Path(run_dir)),
        }
    )


def in_child(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    while True:
        try:
            result = q.get(timeout=5)
            break
        except queue.Empty:
            if not p.is_alive():
                return {"error": f"child exited with code {p.exitcode}"}
    p.join()
    return result


def row(graph: str, formation: str, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"graph": graph, "formation": formation, "error": runs[0]["error"]}
    tests = [r["test"] for r in ok]

    def med(key: str):
        xs = [r[key] for r in ok if r.get(key) is not None]
        return round(statistics.median(xs), 4) if xs else None

    return {
        "graph": graph,
        "formation": formation,
        "preset": PRESETS[formation],
        "overrides": overrides_for(graph, formation),
        "metric": GRAPHS[graph]["metric"],
        "test_mean": round(statistics.mean(tests), 4),
        "test_std": round(statistics.pstdev(tests), 4),
        "test_per_seed": tests,
        "epoch_time_s": med("epoch_time_s"),
        "nodes_per_batch": med("nodes_per_batch"),
        "edges_per_batch": med("edges_per_batch"),
        "peak_anon_mb": med("peak_anon_mb"),
        "epochs_run": [r["epochs_run"] for r in ok],
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| graph | formation | test metric (mean ± std) | epoch time s | nodes / batch | edges / batch | peak anon MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['graph']} | {r['formation']} | error: {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['graph']} | {r['formation']} | {r['metric']} {r['test_mean']:.3f} ± {r['test_std']:.3f} | "
            f"{r['epoch_time_s']} | {r['nodes_per_batch']:,.0f} | {r['edges_per_batch']:,.0f} | {r['peak_anon_mb']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="cora,tolokers,synthetic,skew200k")
    ap.add_argument("--formations", default=",".join(PRESETS))
    ap.add_argument("--seeds", default="0,1,2", help="seeds per formation on cora (one seed elsewhere)")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "formations"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "formations.json"))
    args = ap.parse_args()
    scratch = Path(args.scratch)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    t0 = time.time()
    for graph in args.graphs.split(","):
        graph_dir = build_graph(graph, scratch)
        for formation in args.formations.split(","):
            if skipped(graph, formation):
                continue
            runs = []
            for seed in seeds if graph == "cora" else seeds[:1]:
                run_dir = scratch / "runs" / graph / f"{formation}-{seed}"
                runs.append(
                    in_child(
                        train_child,
                        str(graph_dir),
                        PRESETS[formation],
                        overrides_for(graph, formation),
                        seed,
                        str(run_dir),
                    )
                )
                print(f"{graph} {formation} seed {seed}: {runs[-1]}", flush=True)
            rows.append(row(graph, formation, runs))
            write(Path(args.out), rows, t0)  # after every row: a long run interrupted keeps what it measured
    print(markdown(rows))


def write(out: Path, rows: list[dict], t0: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    result = {
        "what": "each formation's +exp= preset as is (per-graph overrides listed), one child process per run",
        "host": {"cpus": os.cpu_count()},
        "wall_s": round(time.time() - t0, 1),
        "rows": rows,
        "table_md": table,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
