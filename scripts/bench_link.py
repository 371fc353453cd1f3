"""Link-prediction benchmark: `gnnscale train +exp=sage_link` against two baselines on the same edge split.

For each graph and seed the edges are split 85 / 5 / 10 (the preset's task.val_fraction / test_fraction,
seeded by `seed`; graph_dir/edge_split/) and scored on the test edges, each positive (u, v) ranked against
the same seeded negatives (u, n) the trainer's evaluation draws (task.eval_negatives per batch):

  sage_link       GraphSAGE embeddings, dot decoder (configs/exp/sage_link.yaml)
  common_neigh    |N(u) ∩ N(n)| on the message-passing graph (train edges only)
  adamic_adar     Σ 1 / log deg(w) over the common neighbours w
  mlp_features    the same preset with model.arch=mlp: node features only, no message passing

Targets (mean over seeds): Cora test ROC-AUC >= 0.90, CiteSeer >= 0.88, and sage_link above both
baselines; on the default synthetic graph sage_link's Hits@50 clearly above both.

    .venv/bin/python scripts/bench_link.py                        # writes bench/results/link.json
    .venv/bin/python scripts/bench_link.py --seeds 1 --only cora
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_accuracy import CHECKS, all_met, build  # noqa: E402  (it sets DGLBACKEND)

GRAPHS = {
    "cora": {"data": CHECKS["cora"]["data"], "target_auc": 0.90},
    "citeseer": {"data": CHECKS["citeseer"]["data"], "target_auc": 0.88},
    # the default synthetic graph (20k nodes, avg degree 20): sampled fanouts, fewer epochs
    "synthetic": {
        "data": ["data=synthetic"],
        "train": ["sampler.fanouts=[10,5]", "train.batch_size=4096", "train.epochs=5"],
        "target_auc": None,
    },
}
METRICS = ("auc", "mrr", "hits@50")


def adjacency(split):
    """The message-passing graph (train edges only) as a 0/1 scipy CSR matrix."""
    import scipy.sparse as sp

    n = split.num_nodes
    a = sp.csr_matrix(
        (np.ones(len(split.indices)), (split.edge_dst(), np.asarray(split.indices))), shape=(n, n)
    )
    a.data[:] = 1.0  # duplicate edges count once
    return a


def heuristic_scores(a, pairs: np.ndarray, negatives, eval_bs: int, kind: str):
    """Common neighbours / Adamic-Adar of every positive and of (u, n) for its batch's negatives."""
    import scipy.sparse as sp
    import torch

    if kind == "adamic_adar":
        deg = np.asarray(a.sum(1)).ravel()
        w = np.where(deg > 1, 1.0 / np.log(np.maximum(deg, 2)), 0.0)
        left = a @ sp.diags(w)
    else:
        left = a
    pos, neg = [], []
    for i, lo in enumerate(range(0, pairs.shape[1], eval_bs)):
        u, v = pairs[0, lo : lo + eval_bs], pairs[1, lo : lo + eval_bs]
        cand = negatives(i).numpy()
        lu = left[u]
        pos.append(np.asarray(lu.multiply(a[v]).sum(1)).ravel())
        s = (lu @ a[cand].T).toarray().astype(np.float64)
        s[cand[None, :] == v[:, None]] = np.nan
        neg.append(s)
    return torch.from_numpy(np.concatenate(pos)), torch.from_numpy(np.concatenate(neg))


def run_graph(name: str, spec: dict, seeds: int, scratch: Path, extra: list[str]) -> dict:
    from gnnscale.config import compose_config
    from gnnscale.sampling.graph import csc_to_dgl
    from gnnscale.sampling.link import LinkEvalLoader
    from gnnscale.stages import train
    from gnnscale.storage.edge_split import ensure_edge_split
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.tasks.link_metrics import link_scores

    graph_dir = build(name, spec["data"], scratch)
    base = ["+exp=sage_link", *spec.get("train", []), *extra]
    runs = []
    for seed in range(seeds):
        row: dict = {"seed": seed}
        for model, more in (("sage_link", []), ("mlp_features", ["model.arch=mlp"])):
            cfg = compose_config(
                "train",
                [*base, *more, f"graph_dir={graph_dir}", f"run_dir={scratch / 'runs' / name / f'{model}{seed}'}",
                 f"seed={seed}", "overwrite=true"],
            )  # fmt: skip
            s = train.run(cfg)
            row[model] = {m: s[f"test_{m}"] for m in METRICS} | {"epoch_time_s": s["epoch_time_s"]}
        t = cfg.task
        split = ensure_edge_split(GraphDir(graph_dir), seed, float(t.val_fraction), float(t.test_fraction))
        eval_bs = int(cfg.train.eval_batch_size) or 4 * int(cfg.train.batch_size)
        g = csc_to_dgl(split.indptr, split.indices, split.num_nodes)
        test = np.asarray(split.test)
        loader = LinkEvalLoader(g, test, None, eval_bs, int(t.eval_negatives), seed, 2)
        a = adjacency(split)
        for kind in ("common_neigh", "adamic_adar"):
            pos, neg = heuristic_scores(a, test, loader.negatives, eval_bs, kind)
            row[kind] = {m: round(v, 4) for m, v in link_scores(pos, neg).items() if m in METRICS}
        runs.append(row)
        print(name, row, flush=True)
    models = ("sage_link", "mlp_features", "common_neigh", "adamic_adar")
    mean = {k: {m: round(statistics.mean(r[k][m] for r in runs), 4) for m in METRICS} for k in models}
    out = {
        "command": "gnnscale train " + " ".join(base) + f" graph_dir=<{name}> seed=<0..{seeds - 1}>",
        "mean": mean,
        "runs": runs,
    }
    best_baseline = max(mean[k]["auc"] for k in models[1:])
    best_hits = max(mean[k]["hits@50"] for k in models[1:])
    out["beats_baselines_auc"] = mean["sage_link"]["auc"] > best_baseline
    out["beats_baselines_hits@50"] = mean["sage_link"]["hits@50"] > best_hits
    if spec["target_auc"] is not None:
        out["target_auc"] = spec["target_auc"]
        out["met"] = mean["sage_link"]["auc"] >= spec["target_auc"] and out["beats_baselines_auc"]
    else:
        out["met"] = out["beats_baselines_hits@50"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="graphs to run (cora citeseer synthetic)")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "scratch" / "link"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "link.json"))
    ap.add_argument("overrides", nargs="*", help="extra train overrides, e.g. train.epochs=10")
    args = ap.parse_args()
    t0 = time.time()
    results: dict = {"seeds": args.seeds, "graphs": {}}
    for name, spec in GRAPHS.items():
        if args.only and name not in args.only:
            continue
        if name != "synthetic" and not Path(spec["data"][1].split("=", 1)[1]).is_dir():
            results["graphs"][name] = {"skipped": f"{spec['data'][1]} is absent", "met": False}
            continue
        results["graphs"][name] = run_graph(name, spec, args.seeds, Path(args.scratch), args.overrides)
    results["all_met"] = all_met(results["graphs"])
    results["wall_time_s"] = round(time.time() - t0, 1)
    from gnnscale.utils.atomic import write_json

    write_json(args.out, results)
    print(f"all targets met: {results['all_met']}; wrote {args.out}")


if __name__ == "__main__":
    main()
