"""Cluster-GCN speed: gnnscale's `sampler=cluster_gcn` vs DGL's own Cluster-GCN recipe, same parts, batch, model.

The 500k-node / ~10M-edge synthetic graph of bench_train.py (through the real shard + build-csr stages).
Both sides train the same 2-layer GraphSAGE (mean, hidden 256, dropout 0.5, Adam lr 0.003, no schedule,
no clipping) on batches of --clusters-per-batch random clusters of the same METIS partition (gnnscale's
`gnnscale partition` assignment, handed to DGL's sampler through its cache file), loss on the training
nodes inside each batch, then score test accuracy over all neighbours.

  dgl_cluster_gcn   DGL's documented recipe: dgl.graph from the edge list, features, labels and the train
                    mask in g.ndata, dgl.dataloading.ClusterGCNSampler(prefetch_ndata=[...]) +
                    dgl.dataloading.DataLoader over the cluster ids (shuffle=True)
  gnnscale          `gnnscale train sampler=cluster_gcn` with the same settings (norm none: each batch goes to
                    the model as blocks over the rows the loss reads, sampling/prune.py; same loss)

Fresh child process per side and round, order alternating, --repeats rounds; quoted: per-round ratios of
mean epoch times with their median and spread (bench_train.py's method), test accuracy of both sides.

    .venv/bin/python scripts/bench_cluster_gcn.py                 # bench/results/cluster_gcn.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DGLBACKEND", "pytorch")

from bench_train import (  # noqa: E402
    HIDDEN,
    LR,
    build_graph,
    child_memory,
    in_child,
    in_turn,
    plain_graph,
    plain_sage,
    ratio_block,
    same_model_run,
    warm,
)


def dgl_side(graph_dir: str, cache: str, num_parts: int, per_batch: int, epochs: int, seed: int, q) -> None:
    from gnnscale.utils.memory import MemorySampler

    with MemorySampler(0.05) as mem:
        result = dgl_loop(graph_dir, cache, num_parts, per_batch, epochs, seed)
    q.put({**result, **child_memory(mem.peak_rss_mb, mem.peak_anon_mb)})


def dgl_loop(graph_dir: str, cache: str, num_parts: int, per_batch: int, epochs: int, seed: int) -> dict:
    import dgl
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    dgl.seed(seed)
    g, _, test_ids, num_classes = plain_graph(graph_dir)
    model = plain_sage(g.ndata["feat"].shape[1], HIDDEN, num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sampler = dgl.dataloading.ClusterGCNSampler(
        g, num_parts, cache_path=cache, prefetch_ndata=["feat", "label", "train_mask"]
    )
    loader = dgl.dataloading.DataLoader(
        g, torch.arange(num_parts), sampler, batch_size=per_batch, shuffle=True
    )
    epoch_times, epoch_cpu, losses = [], [], []
    for _ in range(epochs):
        model.train()
        t0, c0, total, n = time.perf_counter(), time.process_time(), 0.0, 0
        for sg in loader:
            mask = sg.ndata["train_mask"].bool()
            out = model([sg, sg], sg.ndata["feat"])
            y = sg.ndata["label"][mask]
            loss = F.cross_entropy(out[mask], y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + float(loss) * len(y), n + len(y)
        epoch_times.append(time.perf_counter() - t0)
        epoch_cpu.append(time.process_time() - c0)
        losses.append(total / max(n, 1))
    model.eval()
    full = dgl.dataloading.MultiLayerFullNeighborSampler(
        2, prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )
    correct = seen = 0
    with torch.no_grad():
        for _, _, blocks in dgl.dataloading.DataLoader(g, test_ids, full, batch_size=4096):
            pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
            correct += int((pred == blocks[-1].dstdata["label"]).sum())
            seen += len(pred)
    return {"epoch_time_s": epoch_times, "epoch_cpu_s": epoch_cpu, "loss": losses, "test_acc": correct / seen}


def gnnscale_side(
    graph_dir: str, num_parts: int, per_batch: int, epochs: int, seed: int, run_dir: str, q
) -> None:
    from gnnscale.config import compose_config
    from gnnscale.stages import train

    overrides = [
        *same_model_run(graph_dir, run_dir, seed, epochs),
        "sampler=cluster_gcn",
        f"sampler.num_parts={num_parts}",
        f"sampler.clusters_per_batch={per_batch}",
        "train.diagnostics=false",
        "train.eval_batch_size=4096",
    ]
    summary = train.run(compose_config("train", overrides))
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    q.put(
        {
            "epoch_time_s": [r["epoch_time_s"] for r in records],
            "epoch_cpu_s": [r["epoch_cpu_s"] for r in records],
            "loss": [r["loss"] for r in records],
            "test_acc": summary["test_acc"],
            "time_split_s": {
                k: [r[k] for r in records] for k in ("sample_s", "gather_s", "forward_s", "backward_s")
            },
            **child_memory(summary.get("peak_rss_mb"), summary.get("peak_anon_mb")),
        }
    )


def dgl_cache(graph_dir: Path, num_parts: int, scratch: Path) -> Path:
    """gnnscale's METIS assignment in the form DGL's ClusterGCNSampler caches its own: both use these parts."""
    import numpy as np
    import torch

    from gnnscale.partition import ensure_partition
    from gnnscale.storage.graph_dir import GraphDir

    parts = np.asarray(ensure_partition(GraphDir(graph_dir), "metis", num_parts, 0))
    order = torch.from_numpy(np.argsort(parts, kind="stable"))
    offset = torch.from_numpy(np.insert(np.cumsum(np.bincount(parts, minlength=num_parts)), 0, 0))
    path = scratch / f"dgl_cluster_gcn_{num_parts}.pkl"
    with open(path, "wb") as fh:
        pickle.dump((offset, order), fh)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=500_000)
    ap.add_argument("--avg-degree", type=float, default=20.25)
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--num-classes", type=int, default=16)
    ap.add_argument("--num-parts", type=int, default=500)
    ap.add_argument("--clusters-per-batch", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "train"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cluster_gcn.json"))
    args = ap.parse_args()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    graph_dir = scratch / f"graph_{args.num_nodes}"
    graph = build_graph(graph_dir, args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes)
    cache = dgl_cache(graph_dir, args.num_parts, scratch)
    sides = ("gnnscale", "dgl_cluster_gcn")
    rounds = []
    for r in range(args.repeats):
        row = {}
        for side in in_turn(r, sides):
            warm(graph_dir)
            if side == "gnnscale":
                row[side] = in_child(
                    gnnscale_side, str(graph_dir), args.num_parts, args.clusters_per_batch, args.epochs,
                    args.seed, str(scratch / "run_cluster_gcn"),
                )  # fmt: skip
            else:
                row[side] = in_child(
                    dgl_side, str(graph_dir), str(cache), args.num_parts, args.clusters_per_batch,
                    args.epochs, args.seed,
                )  # fmt: skip
            print(f"[{r + 1}] {side}: epochs {[round(x, 2) for x in row[side]['epoch_time_s']]} s, "
                  f"test acc {row[side]['test_acc']:.4f}", flush=True)  # fmt: skip
        rounds.append(row)

    def med(side: str, key: str = "epoch_time_s") -> float:
        return statistics.median([x for p in rounds for x in p[side][key]])

    result = {
        "what": "gnnscale sampler=cluster_gcn vs DGL ClusterGCNSampler + DataLoader, same parts, batch and model",
        "graph": graph,
        "settings": {
            k: getattr(args, k) for k in ("num_parts", "clusters_per_batch", "epochs", "repeats", "seed")
        },
        "threads": os.cpu_count(),
        "rounds": rounds,
        "gnnscale_over_dgl": ratio_block(
            rounds, "gnnscale", "dgl_cluster_gcn", "gnnscale / DGL epoch time: < 1 = gnnscale is faster"
        ),
        "gnnscale_cpu_over_dgl": ratio_block(
            rounds, "gnnscale", "dgl_cluster_gcn", "CPU s per epoch, all threads", key="epoch_cpu_s"
        ),
        "median_epoch_s": {s: round(med(s), 3) for s in sides},
        "test_acc": {s: [p[s]["test_acc"] for p in rounds] for s in sides},
        "target": "gnnscale epoch time <= 0.8 x DGL's recipe at equal accuracy",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("gnnscale_over_dgl", "median_epoch_s", "test_acc")}, indent=2))


if __name__ == "__main__":
    main()
