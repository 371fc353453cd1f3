"""Link-prediction benchmark: `gnnscale train +exp=sage_link` against two baselines on the same edge split.

For each graph and seed the edges are split 85 / 5 / 10 (the preset's task.val_fraction / test_fraction,
seeded by `seed`; graph_dir/edge_split/) and scored on the test edges, each positive (u, v) ranked against
the same seeded negatives (u, n) the trainer's evaluation draws (task.eval_negatives per batch):

  sage_link       GraphSAGE embeddings, dot decoder + pair counts (configs/exp/sage_link.yaml)
  common_neigh    |N(u) ∩ N(n)| on the message-passing graph (train edges only)
  adamic_adar     Σ 1 / log deg(w) over the common neighbours w
  resource_alloc  Σ 1 / deg(w) over the common neighbours w
  mlp_features    the same preset with model.arch=mlp: node features only (no degree column, no pair
                  counts), no message passing

Recommendation (REC_K = 20): sage_link's embeddings inferred on the split's message-passing graph
(`infer infer.edge_split=...`), then `recommend`: recall@20 and NDCG@20 of every node's held-out test
partners for the re-ranked list (index top 100 + 100 friends of friends, scored by the decoder), the
inner product alone (recommend.rerank=off), and friends of friends ranked by common neighbours.

The heuristics are computed here with scipy, apart from the trainer's own (its summary's
test_heuristics, kept as reported_heuristics: the two should agree). Targets (mean over seeds), per
graph: sage_link's test MRR and Hits@10 >= the best of CN / AA / RA, its recommend recall@20 >= friends of
friends', its ROC-AUC not below AUC_BEFORE
(the preset before pair counts), and Cora ROC-AUC >= 0.90, CiteSeer >= 0.88.

Time budget (graph synthetic40k: 40k nodes, average degree 15, i.e. ~300k undirected edges): seed 0 of the
preset as shipped, the model alone; target: its best validation epoch reached within BUDGET_S = 600 s of
training and evaluation on 2 cores (time_to_best_s, from metrics.jsonl), epochs and times recorded.

Speed (graph synthetic500k: 500k nodes, ~10M directed edges, 128 features, built through shard +
build-csr under bench/tmp/link/): gnnscale's link training against a plain DGL edge-prediction loop in the
same run, each side in its own spawned child, on the same edge split, model (2-layer SAGEConv, gcn
aggregator, hidden 256, dropout 0.5), dot decoder, BCE, 1 uniform negative per positive, fanouts [15, 10],
batch 1024, Adam lr 0.005 / weight decay 5e-4, no schedule, no clipping, the same torch thread count and
no sampling workers:

  plain_dgl   dgl.graph of the message-passing edges (features in ndata), NeighborSampler(prefetch
              feat) wrapped in as_edge_prediction_sampler(exclude="reverse_id", negative_sampler=
              Uniform(1)), dgl.dataloading.DataLoader over the split's training edge ids, shuffled
  gnnscale    `gnnscale train +exp=sage_link` with the settings above (train.prefetch=0)

A full epoch (~4k batches) is too long for a small CPU host: each side trains --warmup + --batches batches
(the gnnscale train stream capped by BatchStream.limit, as scripts/bench_outofcore.py does); epoch time =
per-batch time x batches per epoch, both sides alike. The timed batches run in lockstep: both children
alive, taking turns every --chunk batches (order reversed every other turn), so the load of other jobs on
a shared host falls on both sides alike; the wait for a turn is not timed. Both then score Hits@50 / MRR /
ROC-AUC on the first --eval-batches test batches (the trainer's LinkEvalLoader: the same test pairs and the
same seeded 1000 negatives per batch), so quality is compared at equal training.
Target: gnnscale / plain per-batch time <= 0.8 at equal Hits@50 (within 0.02).

    .venv/bin/python scripts/bench_link.py                        # writes bench/results/link.json
    .venv/bin/python scripts/bench_link.py --seeds 1 --only cora
    .venv/bin/python scripts/bench_link.py --only synthetic40k    # the 10-minute budget (~15 min)
    .venv/bin/python scripts/bench_link.py --only synthetic500k   # the speed comparison only (~4 min on 2 idle cores)

Results are merged into --out: the graphs run replace their own entries, the others are kept.
"""

from __future__ import annotations

import argparse
import os
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
    # a crowd-workers' graph (11.8k nodes, 519k edges, 10 features): its edges as the link task
    "tolokers": {"data": CHECKS["tolokers"]["data"], "target_auc": None},
    # the default synthetic graph (20k nodes, avg degree 20)
    "synthetic": {"data": ["data=synthetic"], "target_auc": None},
    # the time budget: the preset as shipped trains 40k nodes / 300k undirected edges to its best val metric
    # in <= BUDGET_S on 2 cores (run_budget: seed 0, the model alone)
    "synthetic40k": {
        "budget": True,
        "data": ["data=synthetic", "data.num_nodes=40000", "data.avg_degree=15"],
    },
    # the speed comparison against plain DGL (run_speed): 500k nodes, avg degree 20.25 -> ~10M directed edges
    "synthetic500k": {
        "speed": True,
        "num_nodes": 500_000,
        "avg_degree": 20.25,
        "feat_dim": 128,
        "classes": 16,
    },
}
SPEED = {"fanouts": [15, 10], "batch_size": 1024, "hidden": 256, "dropout": 0.5, "aggregator": "gcn",
         "lr": 0.005, "weight_decay": 0.0005, "num_negatives": 1, "eval_negatives": 1000}  # fmt: skip
METRICS = ("auc", "mrr", "hits@10", "hits@50")
HEURISTICS = ("common_neigh", "adamic_adar", "resource_alloc")
REC_K = 20
REC_METRICS = (f"recall_at_{REC_K}", f"ndcg_at_{REC_K}")
# test ROC-AUC of the preset before pairwise features (mean of 3 seeds): the new one may not fall below it
BUDGET_S = 600
AUC_BEFORE = {"cora": 0.934, "citeseer": 0.9343, "synthetic": 0.8617}


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
    """Common neighbours / Adamic-Adar / resource allocation of every positive and of (u, n) for its batch's
    negatives (computed here apart from gnnscale's tasks/pair_features.py, as a check on it)."""
    import scipy.sparse as sp
    import torch

    deg = np.asarray(a.sum(1)).ravel()
    if kind == "adamic_adar":
        left = a @ sp.diags(np.where(deg > 1, 1.0 / np.log(np.maximum(deg, 2)), 0.0))
    elif kind == "resource_alloc":
        left = a @ sp.diags(np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0))
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
        for model, more in (
            ("sage_link", []),
            ("mlp_features", ["model.arch=mlp", "model.degree_feature=false", "task.pair_features=false"]),
        ):
            cfg = compose_config(
                "train",
                [*base, *more, f"graph_dir={graph_dir}", f"run_dir={scratch / 'runs' / name / f'{model}{seed}'}",
                 f"seed={seed}", "overwrite=true"],
            )  # fmt: skip
            s = train.run(cfg)
            row[model] = {m: s[f"test_{m}"] for m in METRICS} | {
                "epoch_time_s": s["epoch_time_s"],
                "epochs_run": s["epochs_run"],
                "best_epoch": s["best_epoch"],
                "wall_time_s": s["wall_time_s"],
            }
            if model == "sage_link":
                row["reported_heuristics"] = s.get("test_heuristics")  # the trainer's own CN / AA / RA
                row["recommend"] = recommend_held_out(s, scratch / "runs" / name, seed)
        t = cfg.task
        split = ensure_edge_split(GraphDir(graph_dir), seed, float(t.val_fraction), float(t.test_fraction))
        eval_bs = int(cfg.train.eval_batch_size) or 4 * int(cfg.train.batch_size)
        g = csc_to_dgl(split.indptr, split.indices, split.num_nodes)
        test = np.asarray(split.test)
        loader = LinkEvalLoader(g, test, None, eval_bs, int(t.eval_negatives), seed, 2)
        a = adjacency(split)
        for kind in HEURISTICS:
            pos, neg = heuristic_scores(a, test, loader.negatives, eval_bs, kind)
            row[kind] = {m: round(v, 4) for m, v in link_scores(pos, neg).items() if m in METRICS}
        runs.append(row)
        print(name, row, flush=True)
    models = ("sage_link", "mlp_features", *HEURISTICS)
    mean = {k: {m: round(statistics.mean(r[k][m] for r in runs), 4) for m in METRICS} for k in models}
    out = {
        "command": "gnnscale train " + " ".join(base) + f" graph_dir=<{name}> seed=<0..{seeds - 1}>",
        "mean": mean,
        "runs": runs,
    }
    rec = {
        who: {m: round(statistics.mean(r["recommend"][who][m] for r in runs), 4) for m in REC_METRICS}
        for who in ("model", "inner_product_only", "friends_of_friends_cn")
    }
    out["recommend_mean"] = rec
    out["recommend_beats_fof"] = rec["model"][REC_METRICS[0]] >= rec["friends_of_friends_cn"][REC_METRICS[0]]
    best = {m: max(mean[k][m] for k in HEURISTICS) for m in ("mrr", "hits@10", "hits@50")}
    out["best_heuristic"] = best
    out["mrr_over_best_heuristic"] = round(mean["sage_link"]["mrr"] - best["mrr"], 4)
    out["beats_heuristics"] = all(mean["sage_link"][m] >= best[m] for m in ("mrr", "hits@10"))
    out["met"] = out["beats_heuristics"] and out["recommend_beats_fof"]
    if name in AUC_BEFORE:
        out["auc_before"] = AUC_BEFORE[name]
        out["met"] = out["met"] and mean["sage_link"]["auc"] >= AUC_BEFORE[name] - 0.005  # seed noise
    if spec["target_auc"] is not None:
        out["target_auc"] = spec["target_auc"]
        out["met"] = out["met"] and mean["sage_link"]["auc"] >= spec["target_auc"]
    return out


def run_budget(name: str, spec: dict, scratch: Path, extra: list[str]) -> dict:
    """Seed 0 of the preset as shipped: the time from the start of training to the end of its best epoch's
    evaluation (training + evaluation time of every epoch up to it, from metrics.jsonl), and the whole run."""
    import json

    from gnnscale.config import compose_config
    from gnnscale.stages import train

    graph_dir = build(name, spec["data"], scratch)
    run_dir = scratch / "runs" / name / "budget"
    base = ["+exp=sage_link", *extra]
    cfg = compose_config(
        "train", [*base, f"graph_dir={graph_dir}", f"run_dir={run_dir}", "seed=0", "overwrite=true"]
    )
    s = train.run(cfg)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    spent = [x["epoch_time_s"] + x.get("eval_time_s", 0.0) for x in lines]
    best = int(s["best_epoch"])
    to_best = round(sum(spent[:best]), 1)
    meta = json.loads((graph_dir / "meta.json").read_text())
    return {
        "command": "gnnscale train " + " ".join(base) + f" graph_dir=<{name}>",
        "num_nodes": meta["num_nodes"],
        "num_edges_directed": meta["num_edges"],
        "epochs_run": s["epochs_run"],
        "best_epoch": best,
        "epoch_time_s": s["epoch_time_s"],
        "time_to_best_s": to_best,
        "wall_time_train_s": s["wall_time_s"],
        "test": {m: s[f"test_{m}"] for m in METRICS},
        "budget_s": BUDGET_S,
        "met": to_best <= BUDGET_S,
    }


def recommend_held_out(train_summary: dict, runs: Path, seed: int) -> dict:
    """`gnnscale infer infer.edge_split=<the run's split>` then `gnnscale recommend recommend.k=20`: recall@20
    and NDCG@20 of each node's held-out test partners, the model's re-ranked list beside friends of friends
    by common neighbours."""
    from gnnscale.config import compose_config
    from gnnscale.stages import infer, recommend

    t0 = time.time()
    emb = runs / f"infer{seed}"
    infer.run(
        compose_config("infer", [f"ckpt={train_summary['checkpoint']}", f"run_dir={emb}", "overwrite=true",
                                 f"infer.edge_split={train_summary['edge_split']}"])
    )  # fmt: skip
    got = {}
    for rerank in ("off", "auto"):  # the index's inner product alone, then re-ranked by the decoder
        got[rerank] = recommend.run(
            compose_config("recommend", [f"infer_dir={emb}", f"run_dir={runs / f'recommend{seed}_{rerank}'}",
                                         "overwrite=true", f"recommend.k={REC_K}", f"recommend.rerank={rerank}"])
        )  # fmt: skip
    return {
        **got["auto"]["held_out"],
        "inner_product_only": got["off"]["held_out"]["model"],
        "rerank": got["auto"]["rerank"],
        "infer_and_recommend_s": round(time.time() - t0, 1),
    }


# ---------------------------------------------------------------- speed: gnnscale vs plain DGL (synthetic500k)
class Lockstep:
    """A side's batch clock. After the warm-up, its timed batches run in chunks of `chunk` that the parent
    starts (conn: a Pipe end), so the two sides, alive side by side, take turns every few batches and a
    shared host's load swings land on both; without conn it just times. Only the batches are timed: the
    wait for the parent is not."""

    def __init__(self, warmup: int, batches: int, chunk: int, conn=None):
        self.warmup, self.batches, self.chunk, self.conn = warmup, batches, max(1, chunk), conn
        self.count, self.wall, self.cpu = 0, [], []
        self.chunks: list[float] = []
        self._chunk_start = 0
        self.t = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def batch_end(self) -> None:
        now = self._now()
        self.count += 1
        timed = self.count - self.warmup
        if timed > 0:
            self.wall.append(now[0] - self.t[0])
            self.cpu.append(now[1] - self.t[1])
        if timed >= 0 and (timed % self.chunk == 0 or timed == self.batches):
            if timed > 0:
                self.chunks.append(sum(self.wall[self._chunk_start :]))
                self._chunk_start = len(self.wall)
            if self.conn is not None:
                self.conn.send(("chunk", timed))
                self.conn.recv()  # the parent's go (or, after the last chunk, its finish)
        self.t = self._now()

    def result(self) -> dict:
        n = len(self.wall)
        return {
            "timed_batches": n,
            "per_batch_s": round(sum(self.wall) / n, 4),
            "per_batch_cpu_s": round(sum(self.cpu) / n, 4),
            "per_batch_median_s": round(statistics.median(self.wall), 4),
            "per_batch_min_s": round(min(self.wall), 4),
            "chunk_s": [round(c, 3) for c in self.chunks],
            "batches_run": self.count,
        }


def speed_gnnscale(spec: dict, queue, conn=None) -> None:
    """`gnnscale train +exp=sage_link` for warmup + batches batches, then test Hits@50 on eval_batches."""
    import json

    import gnnscale.stages.train as stage
    import gnnscale.training.link_streams as link_streams
    from gnnscale.config import compose_config
    from gnnscale.training.trainer import Callback

    make = link_streams.build_link_streams
    total = spec["warmup"] + spec["batches"]

    def capped(*a, **k):
        streams = make(*a, **k)
        for s in streams["train"]:
            s.limit(total)
        streams["val"].limit(1)  # the one validation pass at the epoch's end: not compared, kept short
        streams["test"].limit(spec["eval_batches"])
        return streams

    clock = Lockstep(spec["warmup"], spec["batches"], spec["chunk"], conn)

    class Clock(Callback):
        def on_batch_end(self, epoch, end) -> None:
            clock.batch_end()

    link_streams.build_link_streams = capped  # build_trainer imports it from the module at call time
    callbacks = stage._callbacks
    stage._callbacks = lambda *a, **k: callbacks(*a, **k) + [Clock()]
    f = SPEED
    overrides = [
        "+exp=sage_link",
        f"graph_dir={spec['graph_dir']}",
        f"run_dir={spec['run_dir']}",
        "overwrite=true",
        f"seed={spec['seed']}",
        f"sampler.fanouts=[{','.join(map(str, f['fanouts']))}]",
        f"train.batch_size={f['batch_size']}",
        f"model.hidden={f['hidden']}",
        f"model.dropout={f['dropout']}",
        f"model.aggregator={f['aggregator']}",
        "model.norm=none",
        f"train.lr={f['lr']}",
        f"train.weight_decay={f['weight_decay']}",
        f"task.num_negatives={f['num_negatives']}",
        f"task.eval_negatives={f['eval_negatives']}",
        "task.negative_sampler=uniform",
        "train.epochs=1",
        "train.schedule=none",
        "train.grad_clip=0",
        "train.patience=0",
        "train.input_dropout=0",
        "train.prefetch=0",
        "train.num_workers=0",
        f"train.num_threads={spec['threads']}",
    ]
    summary = stage.run(compose_config("train", overrides))
    record = json.loads((Path(spec["run_dir"]) / "metrics.jsonl").read_text().splitlines()[0])
    n = max(int(record["steps"]), 1)
    keys = ("sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s")
    queue.put(
        {
            **clock.result(),
            "test": {m: round(summary[f"test_{m}"], 4) for m in METRICS},
            "time_split_per_batch_s": {k: round(record[k] / n, 4) for k in keys if k in record},
            "input_nodes_per_batch": record.get("input_nodes_per_batch"),
            "threads": summary["num_threads"],
            "peak_rss_mb": summary.get("peak_rss_mb"),
            "overrides": overrides[3:],
        }
    )


class _PlainSage:
    """The plain side's model: 2 SAGEConv layers, ReLU and dropout between (gnnscale's GNN, norm=none)."""

    @staticmethod
    def make(in_dim: int):
        import dgl.nn as dglnn
        import torch
        from torch import nn

        f = SPEED

        class PlainSage(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(
                    [
                        dglnn.SAGEConv(in_dim, f["hidden"], f["aggregator"]),
                        dglnn.SAGEConv(f["hidden"], f["hidden"], f["aggregator"]),
                    ]
                )
                self.dropout = nn.Dropout(f["dropout"])

            def forward(self, blocks, x):
                h = self.dropout(torch.relu(self.layers[0](blocks[0], x)))
                return self.layers[1](blocks[1], h)

        return PlainSage()


def speed_plain(spec: dict, queue, conn=None) -> None:
    """DGL's documented edge-prediction recipe on the same split, model, loss and settings."""
    import dgl
    import torch
    import torch.nn.functional as F

    from gnnscale.sampling.link import LinkEvalLoader
    from gnnscale.storage.edge_split import ensure_edge_split
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.tasks.link_metrics import link_scores

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    dgl.seed(spec["seed"])
    f = SPEED
    gd = GraphDir(spec["graph_dir"])
    split = ensure_edge_split(gd, spec["seed"], 0.05, 0.10)
    # The message-passing graph with edge ids = positions in the split's CSC (train / reverse ids match).
    src, dst = torch.from_numpy(np.asarray(split.indices, dtype=np.int64)), torch.from_numpy(split.edge_dst())
    g = dgl.graph((src, dst), num_nodes=split.num_nodes)
    g.ndata["feat"] = torch.cat([gd.shard(i)["feat"] for i in range(gd.num_shards)]).float()
    reverse = torch.from_numpy(np.asarray(split.reverse_eids, dtype=np.int64))
    reverse = torch.where(reverse >= 0, reverse, torch.arange(len(reverse)))  # no reverse: itself
    train_eids = torch.from_numpy(np.asarray(split.train_eids, dtype=np.int64))
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler(f["fanouts"], prefetch_node_feats=["feat"]),
        exclude="reverse_id",
        reverse_eids=reverse,
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(f["num_negatives"]),
    )
    loader = dgl.dataloading.DataLoader(
        g, train_eids, sampler, batch_size=f["batch_size"], shuffle=True, drop_last=False, num_workers=0
    )
    model = _PlainSage.make(g.ndata["feat"].shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=f["lr"], weight_decay=f["weight_decay"])
    total = spec["warmup"] + spec["batches"]
    clock = Lockstep(spec["warmup"], spec["batches"], spec["chunk"], conn)
    wait, compute, inputs = 0.0, 0.0, 0
    model.train()
    it = iter(loader)
    t_prev = time.perf_counter()
    for _ in range(total):
        input_nodes, pair, neg_pair, blocks = next(it)
        t0 = time.perf_counter()
        h = model(blocks, blocks[0].srcdata["feat"])
        ps, pd = pair.edges()
        ns, nd = neg_pair.edges()
        pos, neg = (h[ps] * h[pd]).sum(-1), (h[ns] * h[nd]).sum(-1)
        logits = torch.cat([pos, neg])
        loss = F.binary_cross_entropy_with_logits(
            logits, torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        wait, compute, inputs = wait + t0 - t_prev, compute + t1 - t0, inputs + len(input_nodes)
        clock.batch_end()
        t_prev = time.perf_counter()
    # Test: the trainer's evaluation batches (same pairs, same seeded negatives), fanouts as in training.
    eval_sampler = dgl.dataloading.NeighborSampler(f["fanouts"])
    eval_bs = 4 * f["batch_size"]
    ev = LinkEvalLoader(
        g, np.asarray(split.test), eval_sampler, eval_bs, f["eval_negatives"], spec["seed"], 2
    )
    model.eval()
    P, N = [], []
    with torch.no_grad():
        for i, b in enumerate(ev):
            if i >= spec["eval_batches"]:
                break
            out = model(b.blocks, g.ndata["feat"][b.input_nodes])
            u, v = b.pos_pairs
            P.append((out[u] * out[v]).sum(-1))
            neg = out[u] @ out[b.neg_dst].T
            N.append(neg.masked_fill(b.neg_dst[None, :] == v[:, None], float("nan")))
    scores = link_scores(torch.cat(P), torch.cat(N))
    queue.put(
        {
            **clock.result(),
            "test": {m: round(scores[m], 4) for m in METRICS},
            "time_split_per_batch_s": {
                "sample_and_gather_s": round(wait / total, 4),
                "compute_s": round(compute / total, 4),
            },
            "input_nodes_per_batch": round(inputs / total, 1),
            "threads": torch.get_num_threads(),
        }
    )


def _recv(conn, proc, what: str):
    """The next message from a child, or SystemExit if it died first (a plain recv would wait forever)."""
    while not conn.poll(5):
        if not proc.is_alive():
            raise SystemExit(f"{what} child exited with code {proc.exitcode}")
    return conn.recv()


def lockstep_round(sides: dict, child: dict, scratch: Path, r: int) -> dict:
    """Both sides in fresh spawned children, alive together: each runs its warm-up, then they take turns,
    one chunk of timed batches at a time (the order reversed every other chunk), then both evaluate."""
    import multiprocessing as mp

    from scripts.bench_train import in_turn

    ctx = mp.get_context("spawn")
    procs, conns, queues = {}, {}, {}
    for side, target in sides.items():
        queues[side], (conns[side], theirs) = ctx.Queue(), ctx.Pipe()
        spec = {**child, "run_dir": str(scratch / "runs" / side)}
        procs[side] = ctx.Process(target=target, args=(spec, queues[side], theirs))
        procs[side].start()
    for side in sides:  # each child has built its loader and run its warm-up batches
        _recv(conns[side], procs[side], side)
    load = [os.getloadavg()[0]]
    chunks = -(-child["batches"] // child["chunk"])
    for c in range(chunks):
        for side in in_turn(r + c, tuple(sides)):
            conns[side].send("go")
            _recv(conns[side], procs[side], side)
        load.append(os.getloadavg()[0])
    row: dict = {}
    for side in sides:
        conns[side].send("finish")  # on to the test batches (not timed)
    for side in sides:
        while True:
            try:
                row[side] = queues[side].get(timeout=5)
                break
            except Exception:  # queue.Empty
                if not procs[side].is_alive():
                    raise SystemExit(f"{side} child exited with code {procs[side].exitcode}") from None
        procs[side].join()
    pairs = zip(row["gnnscale"]["chunk_s"], row["plain_dgl"]["chunk_s"], strict=True)
    row["chunk_ratios"] = [round(g / p, 3) for g, p in pairs]
    row["host_load_1m"] = {"min": round(min(load), 2), "max": round(max(load), 2)}  # other jobs' share
    return row


def run_speed(name: str, spec: dict, args) -> dict:
    """gnnscale vs plain DGL link training on one large synthetic graph: --repeats rounds of lockstep runs."""
    from gnnscale.storage.edge_split import ensure_edge_split
    from gnnscale.storage.graph_dir import GraphDir
    from scripts.bench_train import build_graph, warm

    scratch = Path(args.speed_scratch) / name
    graph_dir = scratch / "graph"
    nodes = args.speed_nodes or spec["num_nodes"]
    graph = build_graph(graph_dir, nodes, spec["avg_degree"], spec["feat_dim"], spec["classes"])
    split = ensure_edge_split(GraphDir(graph_dir), 0, 0.05, 0.10)
    per_epoch = -(-split.num_train // SPEED["batch_size"])
    print(f"{name}: {graph['num_nodes']:,} nodes, {graph['num_edges']:,} edges, "
          f"{split.num_train:,} training edges = {per_epoch} batches per epoch", flush=True)  # fmt: skip
    child = {
        "graph_dir": str(graph_dir),
        "seed": 0,
        "warmup": args.warmup,
        "batches": args.batches,
        "chunk": args.chunk,
        "eval_batches": args.eval_batches,
        "threads": args.threads,
    }
    sides = {"plain_dgl": speed_plain, "gnnscale": speed_gnnscale}
    rounds = []
    for r in range(args.repeats):
        warm(graph_dir)
        row = lockstep_round(sides, child, scratch, r)
        row["ratio"] = round(row["gnnscale"]["per_batch_s"] / row["plain_dgl"]["per_batch_s"], 3)
        row["ratio_cpu"] = round(row["gnnscale"]["per_batch_cpu_s"] / row["plain_dgl"]["per_batch_cpu_s"], 3)
        row["ratio_median_chunk"] = round(statistics.median(row["chunk_ratios"]), 3)
        rounds.append(row)
        for side in sides:
            got = row[side]
            print(f"[{r + 1}] {side}: {got['per_batch_s']} s/batch ({got['per_batch_cpu_s']} CPU s), "
                  f"test {got['test']}", flush=True)  # fmt: skip
        print(f"[{r + 1}] ratio {row['ratio']}, per chunk {row['chunk_ratios']}, load {row['host_load_1m']}")

    def med(side: str, key: str = "per_batch_s") -> float:
        return round(statistics.median(r[side][key] for r in rounds), 4)

    ratio = round(med("gnnscale") / med("plain_dgl"), 3)
    chunk_ratios = [x for r in rounds for x in r["chunk_ratios"]]
    hits = {side: round(statistics.median(r[side]["test"]["hits@50"] for r in rounds), 4) for side in sides}
    return {
        "command": "python scripts/bench_link.py " + " ".join(sys.argv[1:]),
        "graph": graph,
        "kind": "speed",
        "setup": {
            **SPEED,
            "threads": args.threads,
            "num_workers": 0,
            "warmup_batches": args.warmup,
            "timed_batches": args.batches,
            "chunk": args.chunk,
            "eval": f"first {args.eval_batches} test batches of {4 * SPEED['batch_size']} positives, "
            f"{SPEED['eval_negatives']} shared negatives each",
            "repeats": args.repeats,
            "order": "both sides alive together, taking turns every `chunk` timed batches, the order "
            "reversed every other chunk; per-batch time excludes the wait for the turn",
            "edge_split": "seed 0, val 0.05, test 0.10",
        },
        "batches_per_epoch": per_epoch,
        "per_batch_s": {side: med(side) for side in sides},
        "per_batch_cpu_s": {side: med(side, "per_batch_cpu_s") for side in sides},
        "per_batch_median_s": {side: med(side, "per_batch_median_s") for side in sides},
        "epoch_time_s_extrapolated": {side: round(med(side) * per_epoch, 1) for side in sides},
        "ratio_gnnscale_over_plain": ratio,
        "ratio_per_round": [r["ratio"] for r in rounds],
        "ratio_median_over_chunks": round(statistics.median(chunk_ratios), 3),
        "ratio_cpu_gnnscale_over_plain": round(
            med("gnnscale", "per_batch_cpu_s") / med("plain_dgl", "per_batch_cpu_s"), 3
        ),
        "test_hits@50": hits,
        "target_ratio": 0.8,
        "met": ratio <= 0.8 and hits["gnnscale"] >= hits["plain_dgl"] - 0.02,
        "rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help=f"graphs to run ({' '.join(GRAPHS)})")
    ap.add_argument("--scratch", default=str(ROOT / "bench" / "scratch" / "link"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "link.json"))
    ap.add_argument("--speed-scratch", default=str(ROOT / "bench" / "tmp" / "link"))
    ap.add_argument("--warmup", type=int, default=5, help="speed: untimed batches first")
    ap.add_argument("--batches", type=int, default=100, help="speed: timed batches per side")
    ap.add_argument("--eval-batches", type=int, default=10, help="speed: test batches scored")
    ap.add_argument("--chunk", type=int, default=10, help="speed: timed batches per turn")
    ap.add_argument("--threads", type=int, default=2, help="speed: torch threads on both sides")
    ap.add_argument("--speed-nodes", type=int, default=0, help="speed: another node count (a quick look)")
    ap.add_argument("--repeats", type=int, default=3, help="speed: lockstep runs of both sides")
    ap.add_argument("overrides", nargs="*", help="extra train overrides, e.g. train.epochs=10")
    args = ap.parse_args()
    import json

    from gnnscale.utils.atomic import write_json

    t0 = time.time()
    unknown = set(args.only or ()) - set(GRAPHS)
    if unknown:
        raise SystemExit(f"unknown graph(s) {' '.join(sorted(unknown))}: choose from {' '.join(GRAPHS)}")
    out = Path(args.out)
    results: dict = json.loads(out.read_text()) if out.is_file() else {}
    results.setdefault("graphs", {})
    ran = []
    for name, spec in GRAPHS.items():
        if args.only and name not in args.only:
            continue
        ran.append(name)
        g0 = time.time()
        if spec.get("speed"):
            entry = run_speed(name, spec, args)
        elif spec.get("budget"):
            entry = run_budget(name, spec, Path(args.scratch), args.overrides)
        elif name != "synthetic" and not Path(spec["data"][1].split("=", 1)[1]).exists():
            entry = {"skipped": f"{spec['data'][1]} is absent", "met": False}
        else:
            entry = run_graph(name, spec, args.seeds, Path(args.scratch), args.overrides) | {
                "seeds": args.seeds
            }
        results["graphs"][name] = entry | {"wall_time_s": round(time.time() - g0, 1)}
        write_json(out, results)  # merged: the other graphs' entries are kept
    results["all_met"] = all_met(results["graphs"])
    results["last_run"] = {"graphs": ran, "wall_time_s": round(time.time() - t0, 1)}
    write_json(out, results)
    print(f"all targets met: {results['all_met']}; wrote {args.out}")


if __name__ == "__main__":
    main()
