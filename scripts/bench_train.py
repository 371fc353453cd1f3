"""Training-speed benchmark: gnnscale's train stage vs a plain DGL loop, same graph, model and sampler.

Synthetic graph (through the real shard + build-csr stages): 500k nodes, ~10M directed edges,
128 float32 features, 16 classes. Every side trains the same 2-layer GraphSAGE (mean, hidden 256,
dropout 0.5, Adam lr 0.003, no schedule, no clipping) with NeighborSampler fanouts [15, 10],
batch 1024, 2 epochs, then scores test accuracy with sampled [15, 10] blocks.

  plain_dgl          DGL's documented recipe: dgl.graph from the edge list, features in g.ndata,
                     NeighborSampler(prefetch_node_feats=["feat"]), DataLoader(shuffle=True)
  gnnscale           `gnnscale train` as configured by default (train.prefetch=-1: auto, inline on CPU)
  gnnscale_prefetch  the same with train.prefetch=1: features gathered one batch ahead by a background
                     thread (--no-prefetch-variant leaves it out)
  gnnscale_base      with --base-src DIR: `gnnscale train` from another source tree (an earlier commit,
                     e.g. `git worktree add /tmp/base REV`), to compare a change with what came before

Each side runs in a fresh child process (spawned), so none inherits another's heap; the graph's files
are read just before each child starts, so each finds the same warm page cache. Epoch time = the
training loop of one epoch (evaluation excluded everywhere). Shared hosts are noisy (the same epoch
varies by 20 %), so the sides run --repeats rounds and the order reverses every other round (no side
always goes first). Quoted: per-round ratios of mean epoch times, their median and min/max, the ratio
of the medians and of the bests, with the number of rounds; and, as before, the ratio of the median
epoch times over all epochs. Peak RSS (ru_maxrss of the child) and peak RssAnon (sampled) of each side.

    .venv/bin/python scripts/bench_train.py                 # writes bench/results/train.json (~15-20 min)
    .venv/bin/python scripts/bench_train.py --num-nodes 20000 --repeats 2 --epochs 1 --no-bf16 \\
        --scratch /tmp/bench_train --out /tmp/train_quick.json       # a quick look (~1-2 min)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DGLBACKEND", "pytorch")

FANOUTS = [15, 10]
HIDDEN, DROPOUT, LR, BATCH = 256, 0.5, 0.003, 1024


def build_graph(
    graph_dir: Path, num_nodes: int, avg_degree: float, feat_dim: int, num_classes: int, extra: tuple = ()
) -> dict:
    """The synthetic graph through shard + build-csr, reused when its data settings (extra: more data.*
    overrides, recorded in graph_dir/bench_data.json) are the same."""
    from gnnscale.config import compose_config
    from gnnscale.stages import build_csr, shard

    data = [
        f"data.num_nodes={num_nodes}",
        f"data.avg_degree={avg_degree}",
        f"data.feat_dim={feat_dim}",
        f"data.num_classes={num_classes}",
        *extra,
    ]
    meta_path, stamp = graph_dir / "meta.json", graph_dir / "bench_data.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    same_extra = json.loads(stamp.read_text()) == list(extra) if stamp.is_file() else not extra
    if not ("csc" in meta and meta["num_nodes"] == num_nodes and meta["feat_dim"] == feat_dim and same_extra):
        runs = graph_dir.parent / "runs"
        shard.run(
            compose_config(
                "shard", [f"graph_dir={graph_dir}", f"run_dir={runs / 'shard'}", "overwrite=true", *data]
            )
        )
        build_csr.run(compose_config("build_csr", [f"graph_dir={graph_dir}", f"run_dir={runs / 'csc'}"]))
        stamp.write_text(json.dumps(list(extra)))
    meta = json.loads(meta_path.read_text())
    return {
        "graph_dir": str(graph_dir),
        **{k: meta[k] for k in ("num_nodes", "num_edges", "feat_dim", "num_classes", "splits")},
    }


def child_memory(sampled_rss_mb, sampled_anon_mb) -> dict:
    """Peak memory of this child: ru_maxrss over its whole life, and the sampled VmRSS / RssAnon peaks."""
    import resource

    def mb(x):
        return None if x is None else round(x, 1)

    return {
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_mb": mb(sampled_rss_mb),
        "peak_anon_mb": mb(sampled_anon_mb),
    }


def plain_dgl(graph_dir: str, epochs: int, seed: int, queue) -> None:
    """The reference, metered by the same 50 ms memory sampler gnnscale's train stage runs."""
    from gnnscale.utils.memory import MemorySampler

    with MemorySampler(0.05) as mem:
        result = plain_loop(graph_dir, epochs, seed)
    queue.put({**result, **child_memory(mem.peak_rss_mb, mem.peak_anon_mb)})


def plain_graph(graph_dir: str):
    """(DGL graph with feat / label / train_mask in ndata, train ids, test ids, classes): everything in memory,
    as DGL's examples load a graph."""
    import dgl
    import torch

    from gnnscale.storage.graph_dir import GraphDir

    gd = GraphDir(graph_dir)
    shards = [gd.shard(i) for i in range(gd.num_shards)]

    def cat(key: str):
        return torch.cat([s[key] for s in shards]).clone()

    g = dgl.graph((cat("src"), cat("dst")), num_nodes=gd.num_nodes)
    g.ndata["feat"], g.ndata["label"], g.ndata["train_mask"] = cat("feat"), cat("label"), cat("train_mask")
    test_ids = cat("test_mask").nonzero().flatten()
    return g, g.ndata["train_mask"].nonzero().flatten(), test_ids, int(gd.meta["num_classes"])


def plain_sage(in_dim: int, hidden: int, out_dim: int):
    """The baselines' model: 2-layer GraphSAGE (mean), ReLU and dropout between, on blocks or subgraphs."""
    import dgl.nn as dglnn
    import torch
    from torch import nn

    class PlainSage(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                [dglnn.SAGEConv(in_dim, hidden, "mean"), dglnn.SAGEConv(hidden, out_dim, "mean")]
            )
            self.dropout = nn.Dropout(DROPOUT)

        def forward(self, blocks, x):
            h = self.dropout(torch.relu(self.layers[0](blocks[0], x)))
            return self.layers[1](blocks[1], h)

    return PlainSage()


def plain_loop(graph_dir: str, epochs: int, seed: int) -> dict:
    """A straightforward DGL mini-batch loop, everything in memory."""
    import dgl
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    dgl.seed(seed)
    g, train_ids, test_ids, num_classes = plain_graph(graph_dir)
    model = plain_sage(g.ndata["feat"].shape[1], HIDDEN, num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sampler = dgl.dataloading.NeighborSampler(
        FANOUTS, prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )
    loader = dgl.dataloading.DataLoader(g, train_ids, sampler, batch_size=BATCH, shuffle=True)
    epoch_times, epoch_cpu, losses = [], [], []
    for _ in range(epochs):
        model.train()
        t0, c0, total, n = time.perf_counter(), time.process_time(), 0.0, 0
        for _, _, blocks in loader:
            x, y = blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + float(loss) * len(y), n + len(y)
        epoch_times.append(time.perf_counter() - t0)
        epoch_cpu.append(time.process_time() - c0)
        losses.append(total / n)
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        test_loader = dgl.dataloading.DataLoader(g, test_ids, sampler, batch_size=4 * BATCH, shuffle=False)
        for _, _, blocks in test_loader:
            pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
            correct += int((pred == blocks[-1].dstdata["label"]).sum())
            seen += len(pred)
    return {
        "epoch_time_s": epoch_times,
        "epoch_cpu_s": epoch_cpu,
        "loss": losses,
        "test_acc": correct / seen,
        "threads": torch.get_num_threads(),
    }


def same_model_run(graph_dir: str, run_dir: str, seed: int, epochs: int) -> list[str]:
    """`gnnscale train` overrides for the baselines' model and optimiser (plain_sage, Adam at LR, no schedule,
    no clipping, no early stop), evaluated once at the end."""
    return [
        f"graph_dir={graph_dir}",
        f"run_dir={run_dir}",
        "overwrite=true",
        f"seed={seed}",
        "model=sage",
        f"model.hidden={HIDDEN}",
        f"model.dropout={DROPOUT}",
        "model.norm=none",
        "model.aggregator=mean",
        f"train.epochs={epochs}",
        f"train.lr={LR}",
        "train.schedule=none",
        "train.grad_clip=0",
        "train.weight_decay=0",
        "train.patience=0",
        f"train.eval_every={epochs}",
    ]


def gnnscale_train(graph_dir: str, epochs: int, seed: int, run_dir: str, extra: list, queue) -> None:
    from gnnscale.config import compose_config
    from gnnscale.stages import train

    overrides = [
        *same_model_run(graph_dir, run_dir, seed, epochs),
        f"sampler.fanouts=[{','.join(map(str, FANOUTS))}]",
        f"train.batch_size={BATCH}",
        *extra,
    ]
    summary = train.run(compose_config("train", overrides))
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    split = {
        k: [r[k] for r in records]
        for k in ("sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s")
    }
    queue.put(
        {
            "epoch_time_s": [r["epoch_time_s"] for r in records],
            "epoch_cpu_s": [r["epoch_cpu_s"] for r in records],
            "loss": [r["loss"] for r in records],
            "test_acc": summary["test_acc"],
            "time_split_s": split,
            "feature_cache": summary["feature_cache"],
            "precision": summary["precision"],
            "threads": summary["num_threads"],
            "prefetch": summary.get("prefetch"),
            "overrides": extra,
            # The stage's own sampler covers the training loop (features are already loaded by then).
            **child_memory(summary.get("peak_rss_mb"), summary.get("peak_anon_mb")),
        }
    )


def gnnscale_base_train(src: str, graph_dir: str, epochs: int, seed: int, run_dir: str, queue) -> None:
    """gnnscale_train with the gnnscale of another source tree (this spawned child has not imported any)."""
    sys.path.insert(0, src)
    gnnscale_train(graph_dir, epochs, seed, run_dir, [], queue)


def in_child(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    while True:  # a child that dies before reporting would otherwise leave q.get() waiting forever
        try:
            result = q.get(timeout=5)
            break
        except queue.Empty:
            if not p.is_alive():
                raise SystemExit(f"{target.__name__} child exited with code {p.exitcode}") from None
    p.join()
    return result


def warm(graph_dir: Path) -> None:
    """Read the graph's files, so every child starts with them in the page cache (gnnscale samples from
    the mmap'd CSC during its epochs; the plain loop reads the shards once, before its epochs)."""
    for p in sorted(x for x in graph_dir.rglob("*") if x.is_file()):
        with open(p, "rb") as fh:
            while fh.read(1 << 24):
                pass


def in_turn(r: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """Round r's running order: as given in even rounds, reversed in odd ones, so every pair alternates."""
    return sides if r % 2 == 0 else sides[::-1]


def run_side(side: str, graph_dir: Path, scratch: Path, args) -> dict:
    warm(graph_dir)
    if side == "plain_dgl":
        return in_child(plain_dgl, str(graph_dir), args.epochs, args.seed)
    if side == "gnnscale_base":
        run_dir = str(scratch / "run_base")
        return in_child(gnnscale_base_train, args.base_src, str(graph_dir), args.epochs, args.seed, run_dir)
    extra = ["train.prefetch=1"] if side == "gnnscale_prefetch" else []
    return in_child(
        gnnscale_train, str(graph_dir), args.epochs, args.seed, str(scratch / f"run_{side}"), extra
    )


def _mean(xs: list[float]) -> float:
    return statistics.mean(xs)


def ratio_block(pairs: list[dict], num: str, den: str, meaning: str, key: str = "epoch_time_s") -> dict:
    """num / den of each round's mean epoch time, of the medians and of the bests over rounds, the spread.

    The reading is "on par" unless every round's ratio lies on the same side of 1.
    """
    a = [_mean(p[num][key]) for p in pairs]
    b = [_mean(p[den][key]) for p in pairs]
    per = [round(x / y, 3) for x, y in zip(a, b, strict=True)]
    if max(per) < 1:
        reading = "below 1 in every round"
    elif min(per) > 1:
        reading = "above 1 in every round"
    else:
        reading = "on par: rounds on both sides of 1"
    return {
        "meaning": meaning,
        "repeats": len(per),
        "ratio_of_medians": round(statistics.median(a) / statistics.median(b), 3),
        "ratio_of_bests": round(min(a) / min(b), 3),
        "median_per_pair": round(statistics.median(per), 3),
        "min_per_pair": min(per),
        "max_per_pair": max(per),
        "per_pair": per,
        "reading": reading,
    }


def memory_spread(pairs: list[dict], side: str) -> dict:
    """Median, min and max over rounds of each memory figure (values a meter could not read left out)."""
    out = {}
    for key in ("max_rss_mb", "peak_rss_mb", "peak_anon_mb"):
        xs = [p[side].get(key) for p in pairs if p[side].get(key) is not None]
        if xs:
            out[key] = {"median": round(statistics.median(xs), 1), "min": min(xs), "max": max(xs), "all": xs}
    return out


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=500_000)
    ap.add_argument("--avg-degree", type=float, default=20.25)  # ~10M directed edges after de-duplication
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--num-classes", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="rounds of every side, order alternating (shared hosts are noisy)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 measurement")
    ap.add_argument(
        "--no-prefetch-variant",
        action="store_true",
        help="skip the gnnscale train.prefetch=1 (background gather thread) side",
    )
    ap.add_argument("--base-src", help="also run `gnnscale train` from this source tree (side gnnscale_base)")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "tmp" / "train"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "train.json"))
    return ap.parse_args()


def one_round(r: int, sides: tuple[str, ...], graph_dir: Path, scratch: Path, args) -> dict:
    """Every side once, in round r's order, and this round's ratios (of mean epoch times)."""
    order = in_turn(r, sides)
    row: dict = {"order": list(order)}
    for side in order:
        got = row[side] = run_side(side, graph_dir, scratch, args)
        print(
            f"[{r + 1}] {side}: epochs {[round(x, 2) for x in got['epoch_time_s']]} s, "
            f"test acc {got['test_acc']:.4f}, max RSS {got['max_rss_mb']} MB",
            flush=True,
        )

    def mean_of(side: str, key: str = "epoch_time_s") -> float:
        return _mean(row[side][key])

    row["ratio_wall"] = round(mean_of("gnnscale") / mean_of("plain_dgl"), 3)
    row["ratio_cpu"] = round(mean_of("gnnscale", "epoch_cpu_s") / mean_of("plain_dgl", "epoch_cpu_s"), 3)
    if "gnnscale_prefetch" in row:
        row["prefetch_over_default_wall"] = round(mean_of("gnnscale_prefetch") / mean_of("gnnscale"), 3)
        row["prefetch_over_plain_wall"] = round(mean_of("gnnscale_prefetch") / mean_of("plain_dgl"), 3)
    return row


def ratio_blocks(pairs: list[dict], sides: tuple[str, ...]) -> dict:
    blocks = {
        "gnnscale_over_plain": ratio_block(
            pairs, "gnnscale", "plain_dgl", "gnnscale / plain epoch time: < 1 = gnnscale is faster"
        ),
        "gnnscale_cpu_over_plain": ratio_block(
            pairs,
            "gnnscale",
            "plain_dgl",
            "gnnscale / plain CPU s per epoch (all threads): < 1 = gnnscale uses less CPU",
            key="epoch_cpu_s",
        ),
    }
    if "gnnscale_base" in sides:
        blocks["base_over_plain"] = ratio_block(
            pairs, "gnnscale_base", "plain_dgl", "the --base-src tree's gnnscale / plain epoch time"
        )
        blocks["gnnscale_over_base"] = ratio_block(
            pairs,
            "gnnscale",
            "gnnscale_base",
            "this tree / the --base-src tree, epoch time: < 1 = faster now",
        )
    if "gnnscale_prefetch" in sides:
        blocks["prefetch_over_default"] = ratio_block(
            pairs,
            "gnnscale_prefetch",
            "gnnscale",
            "train.prefetch=1 / default (inline) epoch time: > 1 = the gather thread is slower",
        )
        blocks["prefetch_over_plain"] = ratio_block(
            pairs, "gnnscale_prefetch", "plain_dgl", "train.prefetch=1 / plain epoch time"
        )
    return blocks


def summarize(args, graph: dict, sides: tuple[str, ...], pairs: list[dict], bf16: dict | None) -> dict:
    """train.json: the rounds as run, the ratios with their spread, memory, accuracy, the target."""

    def med(side: str, key: str = "epoch_time_s") -> float:
        """The median over every epoch of every round: a spike in one epoch moves it little."""
        return round(statistics.median(x for p in pairs for x in p[side][key]), 3)

    ratio = med("gnnscale") / med("plain_dgl")
    acc = {side: round(statistics.median(p[side]["test_acc"] for p in pairs), 4) for side in sides}
    blocks = ratio_blocks(pairs, sides)
    main_block = blocks["gnnscale_over_plain"]
    result = {
        "graph": graph,
        "setup": {
            "fanouts": FANOUTS,
            "batch_size": BATCH,
            "hidden": HIDDEN,
            "dropout": DROPOUT,
            "lr": LR,
            "epochs": args.epochs,
            "repeats": args.repeats,
            "sides": list(sides),
            "order": "reversed every other round",
            "model": "2-layer SAGE (mean)",
        },
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
        },
        "pairs": pairs,
        "repeats": args.repeats,
        "epoch_time_s": {side: med(side) for side in sides},
        "epoch_cpu_s": {side: med(side, "epoch_cpu_s") for side in sides},
        "ratio_gnnscale_over_plain": round(ratio, 3),
        "ratio_cpu_gnnscale_over_plain": round(
            med("gnnscale", "epoch_cpu_s") / med("plain_dgl", "epoch_cpu_s"), 3
        ),
        "ratio_per_pair": [p["ratio_wall"] for p in pairs],
        "ratio_cpu_per_pair": [p["ratio_cpu"] for p in pairs],
        "ratio_median_per_pair": main_block["median_per_pair"],
        "ratio_min_max": [main_block["min_per_pair"], main_block["max_per_pair"]],
        "ratios": blocks,
        "gnnscale_time_split_s": _split(pairs[-1]["gnnscale"]),
        "memory": {side: memory_spread(pairs, side) for side in sides},
        "target_ratio": 0.8,
        "target_met": ratio <= 0.8 and acc["gnnscale"] >= acc["plain_dgl"] - 0.01,
        "test_acc": acc,
    }
    if "gnnscale_base" in sides:
        result["base_src"] = args.base_src
        result["ratio_base_over_plain"] = round(med("gnnscale_base") / med("plain_dgl"), 3)
        result["ratio_gnnscale_over_base"] = round(med("gnnscale") / med("gnnscale_base"), 3)
    if "gnnscale_prefetch" in sides:
        result["ratio_prefetch_over_default"] = round(med("gnnscale_prefetch") / med("gnnscale"), 3)
        result["ratio_prefetch_over_plain"] = round(med("gnnscale_prefetch") / med("plain_dgl"), 3)
        result["gnnscale_prefetch_time_split_s"] = _split(pairs[-1]["gnnscale_prefetch"])
    if bf16 is not None:
        result["gnnscale_bf16"] = bf16
        result["bf16_over_fp32_epoch_time"] = round(bf16["epoch_time_s"][0] / med("gnnscale"), 3)
        result["bf16_note"] = "one 1-epoch bf16 run against the median fp32 epoch: no repeats, no spread"
    return result


def _split(run: dict) -> dict:
    return {k: round(_mean(v), 3) for k, v in run["time_split_s"].items()}


def main() -> None:
    args = parse_args()
    scratch = Path(args.scratch)
    graph_dir = scratch / "graph"
    scratch.mkdir(parents=True, exist_ok=True)
    graph = build_graph(graph_dir, args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes)
    print(f"graph: {graph['num_nodes']:,} nodes, {graph['num_edges']:,} edges", flush=True)

    # Every side once per round, each in a fresh process, so a slow minute on a shared host lands on
    # all sides of one round; the order reverses every other round so no side always runs first.
    sides = ("plain_dgl", "gnnscale") + (() if args.no_prefetch_variant else ("gnnscale_prefetch",))
    if args.base_src:
        sides += ("gnnscale_base",)
    pairs = [one_round(r, sides, graph_dir, scratch, args) for r in range(args.repeats)]
    bf16 = None
    if not args.no_bf16:
        warm(graph_dir)
        bf16 = in_child(
            gnnscale_train, str(graph_dir), 1, args.seed, str(scratch / "run_bf16"), ["precision=bf16"]
        )
        print(f"gnnscale bf16: epoch {bf16['epoch_time_s']} s, test acc {bf16['test_acc']:.4f}", flush=True)
    result = summarize(args, graph, sides, pairs, bf16)
    from gnnscale.utils.atomic import write_json

    write_json(args.out, result)
    for key in ("epoch_time_s", "ratio_gnnscale_over_plain", "ratio_per_pair", "test_acc", "target_met"):
        print(json.dumps({key: result[key]}))
    for name, b in result["ratios"].items():
        print(
            json.dumps(
                {name: {x: b[x] for x in ("ratio_of_medians", "ratio_of_bests", "per_pair", "reading")}}
            )
        )
    if bf16 is not None:
        print(f"bf16 / fp32 epoch time: {result['bf16_over_fp32_epoch_time']} (one run)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
