"""Pages touched per sampled batch under each node order: a disk- and cache-free locality measure.

For graph_dirs sharded with different shard.reorder, draws the same batches (the same user node ids as
seeds, 2-hop neighbour sampling with fanouts [15, 10] on the CSC) and counts the distinct 4 KiB pages of a
feature file (row_bytes per row, default 512 = 128 float32) and of csc/indices.npy (int64) the batch
touches. Fewer pages = fewer reads once the graph is larger than the page cache.

    .venv/bin/python scripts/bench_reorder_pages.py GRAPH_DIR [GRAPH_DIR...] [--batches 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gnnscale.storage.csc import open_csc  # noqa: E402
from gnnscale.storage.graph_dir import GraphDir  # noqa: E402

PAGE = 4096


def sample(indptr, indices, nodes, fanout, rng):
    """Up to `fanout` in-neighbours per node (with replacement, as a cheap stand-in for DGL's draw)."""
    start, deg = indptr[nodes], indptr[nodes + 1] - indptr[nodes]
    has = deg > 0
    start, deg = start[has], deg[has]
    pos = start[:, None] + (rng.random((len(start), fanout)) * deg[:, None]).astype(np.int64)
    return np.unique(indices[pos.ravel()]), pos.ravel()


def measure(graph_dir: Path, seeds_user: list[np.ndarray], row_bytes: int, seed: int) -> dict:
    g = GraphDir(graph_dir)
    indptr, indices = (np.asarray(a) for a in open_csc(g))
    order = g.node_order
    rng = np.random.default_rng(seed)
    feat_pages, csc_pages, inputs, seen = [], [], [], set()
    for batch in seeds_user:
        seeds = order.to_graph(batch)
        hop1, pos1 = sample(indptr, indices, seeds, 15, rng)
        frontier = np.union1d(seeds, hop1)
        hop2, pos2 = sample(indptr, indices, frontier, 10, rng)
        nodes = np.union1d(frontier, hop2)
        pages = np.unique(nodes * row_bytes // PAGE)
        feat_pages.append(len(pages))
        seen.update(pages.tolist())
        csc_pages.append(len(np.unique(np.concatenate([pos1, pos2]) * indices.itemsize // PAGE)))
        inputs.append(len(nodes))
    return {
        "graph_dir": str(graph_dir),
        "node_order": order.method,
        "input_nodes_per_batch": round(float(np.mean(inputs))),
        "feature_pages_per_batch": round(float(np.mean(feat_pages))),
        "feature_mb_per_batch": round(float(np.mean(feat_pages)) * PAGE / 1e6, 2),
        # the feature working set of all batches together: what a page cache must hold to re-read nothing
        "feature_pages_all_batches": len(seen),
        "csc_pages_per_batch": round(float(np.mean(csc_pages))),
        "csc_mb_per_batch": round(float(np.mean(csc_pages)) * PAGE / 1e6, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graph_dirs", nargs="+")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--row-bytes", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    g0 = GraphDir(args.graph_dirs[0])
    # the same seeds (user ids, the unordered graph's train split) for every order
    train_user = np.sort(g0.node_order.to_user(g0.split_ids("train").numpy()))
    rng = np.random.default_rng(args.seed)
    seeds = [rng.choice(train_user, args.batch_size, replace=False) for _ in range(args.batches)]
    rows = [measure(Path(d), seeds, args.row_bytes, args.seed) for d in args.graph_dirs]
    for r in rows:
        print(json.dumps(r))
    if args.out:
        Path(args.out).write_text(json.dumps({"batches": args.batches, "batch_size": args.batch_size,
                                              "row_bytes": args.row_bytes, "fanouts": [15, 10], "runs": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
