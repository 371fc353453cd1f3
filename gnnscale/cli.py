"""The `gnnscale` command: compose the stage's config, call stages.<stage>.run(cfg), exit 0 / 1 / 2."""

from __future__ import annotations

import errno
import importlib
import sys
from pathlib import Path

import typer
from omegaconf import OmegaConf

from gnnscale.errors import GnnscaleError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    help=(
        "gnnscale: from a raw graph to trained GNN embeddings at any scale.\n\n"
        "Every command takes Hydra overrides after it: [bold]key=value[/bold], [bold]group=option[/bold], "
        "[bold]+exp=NAME[/bold]. Add [bold]--cfg[/bold] to print the composed config and exit."
    ),
)

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
CFG_OPTION = typer.Option(False, "--cfg", help="Print the composed config and exit.")


def _run(stage: str, overrides: list[str], show_cfg: bool) -> None:
    from gnnscale.config import compose_config
    from gnnscale.utils.ui import set_log_interval

    def call() -> None:
        cfg = compose_config(stage, overrides)
        if show_cfg:
            print(OmegaConf.to_yaml(cfg, resolve=True), end="")
            return
        set_log_interval(cfg.ui.log_every_s)
        module = importlib.import_module(f"gnnscale.stages.{stage}")
        module.run(cfg)

    _guarded(call)


def _guarded(call) -> None:
    """Run a command; a user error is one line on stderr and exit 2 (130 for Ctrl-C), never a traceback."""
    from gnnscale.utils.ui import err_console

    try:
        call()
    except GnnscaleError as exc:
        if not getattr(exc, "reported", False):  # a rank of a multi-process job may have said it already
            err_console.print(f"error: {exc.one_line()}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(getattr(exc, "exit_code", 2)) from None
    except OSError as exc:  # a full disk met outside the writers that say where and how much
        if exc.errno != errno.ENOSPC:
            raise
        where = f" on {Path(exc.filename).parent}" if exc.filename else ""
        err_console.print(f"error: no space left{where}; free some space there", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print(
            "error: interrupted; nothing half-written was published, re-run the same command to start again",
            markup=False,
        )
        raise typer.Exit(130) from None


@app.command("shard", context_settings=_EXTRA)
def shard_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """Raw graph -> graph_dir: meta.json + part_NNNNN.pt node-range shards (mmap-able).

    [bold]Examples[/bold]

      gnnscale shard                                   [dim]# built-in synthetic graph -> graphs/synthetic[/dim]

      gnnscale shard data.num_nodes=1000000 data.avg_degree=30 graph_dir=graphs/syn1m

      gnnscale shard data=planetoid data.path=downloads/cora graph_dir=graphs/cora

      gnnscale shard data=npz data.path=tolokers.npz data.split_index=0 overwrite=true

      gnnscale shard data=edgelist data.path=edges.csv data.features=feat.npy data.labels=y.npy
    """
    _run("shard", ctx.args, cfg)


@app.command("build-csr", context_settings=_EXTRA)
def build_csr_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """graph_dir shards -> graph_dir/csc/{indptr,indices}.npy, built out of core and validated.

    [bold]Examples[/bold]

      gnnscale build-csr graph_dir=graphs/cora

      gnnscale build-csr graph_dir=graphs/syn1m csc.validate=false
    """
    _run("build_csr", ctx.args, cfg)


@app.command("partition", context_settings=_EXTRA)
def partition_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """CSC -> graph_dir/partitions/<method>-<k>/ (assignment.npy, report.json): Cluster-GCN's clusters.

    METIS cuts the fewest edges and balances nodes and training nodes per part; random needs no memory
    beyond the assignment. An up-to-date partition is reused; METIS is refused before it starts when its
    estimated memory exceeds partition.memory_budget.

    [bold]Examples[/bold]

      gnnscale partition graph_dir=graphs/cora          [dim]# METIS, about one part per 1,000 nodes[/dim]

      gnnscale partition graph_dir=graphs/syn1m partition.num_parts=8

      gnnscale partition partition.method=random partition.num_parts=500

      gnnscale partition partition.memory_budget=4GB overwrite=true
    """
    _run("partition", ctx.args, cfg)


@app.command("profile", context_settings=_EXTRA)
def profile_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """Before a long run: will it fit, how big is a batch, where does the time go, which formation?

    The plan (always, no training): full-graph training memory term by term, sampled nodes / edges per
    layer (worst case and measured with overlap), per-batch memory, the largest batch size and fanouts
    that fit, and the recommended formation with the numbers that decided it. Writes profile.json and
    PNG plots into the run folder. The model, sampler and train.* keys are train's.

    [bold]Examples[/bold]

      gnnscale profile graph_dir=graphs/syn500k                        [dim]# the plan[/dim]

      gnnscale profile graph_dir=graphs/syn500k +exp=sage_3hop profile.memory_budget=8GB

      gnnscale profile graph_dir=graphs/syn500k profile.measure=true   [dim]# + timed steps vs the gather / matmul bounds[/dim]

      gnnscale profile graph_dir=graphs/cora profile.compare_samplers=true   [dim]# 1 epoch of every formation[/dim]

      gnnscale profile profile.num_nodes=1e9 profile.avg_degree=50     [dim]# a graph described, not read[/dim]
    """
    _run("profile", ctx.args, cfg)


@app.command("train", context_settings=_EXTRA)
def train_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """graph_dir -> trained GNN run_dir: any formation (sampler=), checkpoints, resume.

    Formations (sampler=): neighbor (default), labor, importance, weighted, random_walk (sampled neighbourhoods), saint (GraphSAINT subgraphs), cluster_gcn (METIS clusters), full (whole graph). Presets: +exp=sage_2hop, sage_labor, sage_importance, sage_random_walk, saint, cluster_gcn, full_gcn; +exp=two_phase runs coarse-then-fine phases (train.phases).

    [bold]Examples[/bold]

      gnnscale train +exp=sage_2hop graph_dir=graphs/cora

      gnnscale train +exp=cluster_gcn graph_dir=graphs/syn500k   [dim]# partitions on first use[/dim]

      gnnscale train +exp=full_gcn graph_dir=graphs/cora

      gnnscale train model=gcn sampler.fanouts=[10,10] train.epochs=50 precision=bf16

      gnnscale train +exp=sage_2hop train.metric=roc_auc graph_dir=graphs/tolokers

      gnnscale train resume=runs/train/20260101-120000   [dim]# continue a killed run from last.pt[/dim]

      gnnscale train train.memory_budget=6GB              [dim]# plan within 6 GB (default: 90% of the cgroup / free memory)[/dim]

      gnnscale train dist=ddp dist.nproc=2                [dim]# 2 processes, DDP (gloo on CPU, NCCL on GPUs)[/dim]

      gnnscale train dist=ddp dist.split=metis dist.grad_compression=bf16 dist.local_steps=4

      torchrun --nproc_per_node=2 -m gnnscale train dist=ddp   [dim]# torchrun starts the ranks[/dim]

      gnnscale train dist=distdgl dist.num_trainers=2     [dim]# DistDGL servers + trainers on this machine[/dim]

    Before the first batch it estimates its memory, keeps features in RAM only if they fit, and exits 2
    with settings that would fit when nothing does. Off a terminal, progress is a line every ui.log_every_s.
    """
    _run("train", ctx.args, cfg)


@app.command("infer", context_settings=_EXTRA)
def infer_cmd(
    ctx: typer.Context,
    layerwise: bool = typer.Option(
        True,
        "--layerwise/--sampled",
        help="Exact embeddings of every node, layer by layer (default), or sampled for a subset.",
    ),
    update: str = typer.Option(
        None,
        "--update",
        metavar="CHANGES.npz",
        help="Reuse a layer-wise run's cached layers; recompute what the changes reach.",
    ),
    cfg: bool = CFG_OPTION,
) -> None:
    """Checkpoint -> embeddings.npy, predictions.npy, emb_info.json (ckpt= a .pt file or a train run_dir).

    [bold]Examples[/bold]

      gnnscale infer                                   [dim]# newest train run under runs/train[/dim]

      gnnscale infer ckpt=runs/train/20240101-120000 infer.memory_budget=1GB

      gnnscale infer --sampled infer.fanouts=[10,10] infer.nodes=test

      gnnscale infer --update changes.npz              [dim]# newest cached layer-wise run[/dim]

      gnnscale infer infer.edge_split=seed0-val0.05-test0.1   [dim]# link model: held-out edges unseen[/dim]
    """
    overrides = [f"infer.mode={'layerwise' if layerwise else 'sampled'}"]
    if update:
        overrides.append(f"infer.changes={_quote(update)}")
    _run("infer", overrides + list(ctx.args), cfg)


def _quote(value: str) -> str:
    """A Hydra override value that keeps a path's characters literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@app.command("verify", context_settings=_EXTRA)
def verify_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """graph_dir: every shard and CSC file checked against the sha256 meta.json records, in a table.

    Every stage that reads a graph_dir checks it too (verify=stamp, the default there: only files whose
    size / mtime / inode changed since they were last verified are re-hashed; verify=full re-hashes all,
    verify=off skips it). A missing or changed file is exit 2 naming the file and the command that rewrites it.

    [bold]Examples[/bold]

      gnnscale verify graph_dir=graphs/cora               [dim]# re-hash every file[/dim]

      gnnscale verify graph_dir=graphs/syn500k verify=stamp

      gnnscale train graph_dir=graphs/cora verify=full    [dim]# any reading stage: re-hash before it starts[/dim]
    """
    _run("verify", ctx.args, cfg)


@app.command("recommend", context_settings=_EXTRA)
def recommend_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """Embeddings -> each node's top-K candidate partners that are not already its neighbours, nor itself.

    Reads embeddings.npy of an infer run (infer_dir= a run_dir, or emb= a .npy; default the newest under
    runs/infer) and the graph's CSC. Exact inner-product search (faiss) below recommend.exact_below nodes,
    an IVF index above it, tuned on a sample to reach recommend.target_recall vs exact search (reported in
    summary.json). Writes recommendations.npy (int64 \\[n, k]) + scores.npy (float32), or recommendations.csv.
    For a link model with a pair decoder (task.pair_features, or decoder=mlp) the index's top
    recommend.candidates and the recommend.fof_candidates friends of friends with the most common neighbours
    are re-ranked by that decoder (recommend.rerank=auto|on|off). Embeddings inferred on an edge split
    (infer.edge_split) are recommended on its message-passing graph, and summary.json reports recall@k and
    NDCG@k of the held-out test partners, beside friends of friends ranked by common neighbours.
    Like every reading stage it first checks the graph_dir's files (verify=stamp|full|off) and refuses to
    start on a disk without room for its outputs.

    [bold]Examples[/bold]

      gnnscale recommend                                   [dim]# newest infer run, every node, k=20[/dim]

      gnnscale recommend infer_dir=runs/infer/20260101-120000 recommend.k=50

      gnnscale recommend recommend.nodes=[0,17,42] recommend.metric=cosine recommend.format=csv

      gnnscale recommend recommend.nodes=ids.npy recommend.index=hnsw recommend.target_recall=0.98

      gnnscale infer infer.edge_split=seed0-val0.05-test0.1 && gnnscale recommend   [dim]# held-out recall@20[/dim]
    """
    _run("recommend", ctx.args, cfg)


@app.command("pipeline", context_settings=_EXTRA)
def pipeline_cmd(ctx: typer.Context, cfg: bool = CFG_OPTION) -> None:
    """shard -> build-csr -> partition -> train -> infer [-> recommend]; reuses what is up to date, resumes a killed train.

    partition runs only for sampler=cluster_gcn (sampler.method, sampler.num_parts). task=link adds
    recommend (every node's top recommend.k non-neighbour partners) and ends with the test ROC-AUC, MRR
    and Hits@10/50/100 and a few nodes' top-5 recommendations; recommend with task=node is exit 2.

    The graph is reused when built from the same data config; a train, infer or recommend run of an earlier
    pipeline (runs/pipeline/*) when it had the same stage config and graph. Each stage runs in run_dir/<stage>/.

    [bold]Examples[/bold]

      gnnscale pipeline                                [dim]# what `make demo` runs: synthetic graph, SAGE[/dim]

      gnnscale pipeline train.epochs=5 model.hidden=64 +exp=sage_2hop infer.batch_size=4096

      gnnscale pipeline data=planetoid data.path=downloads/cora graph_dir=graphs/cora

      gnnscale pipeline stages=\\[shard,build_csr]       [dim]# only build the graph[/dim]

      gnnscale pipeline +exp=sage_link data.labels=false recommend.k=20   [dim]# link prediction + recommendations[/dim]

      gnnscale pipeline overwrite=true                 [dim]# rebuild, retrain and re-infer everything[/dim]
    """
    _run("pipeline", ctx.args, cfg)


@app.command("compare")
def compare_cmd(
    run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR", help="Train run folders to compare."),
    out: Path = typer.Option(None, "--out", help="Folder for compare.json and val_curves.png."),
) -> None:
    """Train runs side by side: the config keys they differ in, final metrics, epoch time, peak memory.

    Reads each run_dir's config.yaml, summary.json and metrics.jsonl (an unfinished run shows what its
    epochs reached) and draws their validation curves on one plot, val_curves.png, beside compare.json
    (in --out, default runs/compare/<time>).

    [bold]Examples[/bold]

      gnnscale compare runs/train/20260101-120000 runs/train/20260101-130000

      gnnscale compare runs/pipeline/*/train --out runs/compare/hidden
    """

    def call() -> None:
        from gnnscale.stages import compare

        compare.run([str(p) for p in run_dirs], str(out) if out else None)

    _guarded(call)


def main() -> None:
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.exit(code)


if __name__ == "__main__":
    main()
