"""Factories that turn a train config and its data into the trainer's pieces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from gnnscale.config import eval_batch_size
from gnnscale.errors import MemoryBudgetError
from gnnscale.models import build_model, exact_on_blocks, model_signature, signature_hash
from gnnscale.sampling import SamplingContext, build_eval_sampler, build_loader, build_sampler
from gnnscale.storage.run_dir import config_hash
from gnnscale.training.batches import BatchStream, FeatureBuffers
from gnnscale.training.data import TrainData
from gnnscale.training.memory_plan import (
    BatchShape,
    MemoryPlan,
    Sizes,
    Workload,
    plan,
    probe_batches,
    refusal,
)
from gnnscale.training.phases import epoch_steps, resolve_phases, uses_phases
from gnnscale.training.schedule import build_optimizer, build_scheduler
from gnnscale.training.seeding import reseed
from gnnscale.training.sum_sweep import SumSweep
from gnnscale.training.sweep import Sweeper
from gnnscale.training.sync import SINGLE, Sync
from gnnscale.training.trainer import Callback, Trainer, TrainerSettings
from gnnscale.utils.memlimit import Budget

# Keys that steer where and whether a run continues, not what it computes (verify: how its data is
# checked; logger: what is written about it).
_RUN_KEYS = ("run_dir", "resume", "overwrite", "cli_overrides", "ui", "verify", "logger")


def hashable_cfg(cfg: DictConfig) -> dict:
    """The config minus where/whether it runs: two runs with equal hashes compute the same thing."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for k in _RUN_KEYS:
        data.pop(k, None)
    data.get("train", {}).pop("resume", None)
    data.get("train", {}).pop("diagnostics", None)  # measures the run, changes nothing it computes
    return data


def resolve_prefetch(prefetch: int, device: torch.device) -> int:
    """-1 = auto: gather ahead on a GPU (the CPU is otherwise idle), inline on CPU (a gather thread
    would steal the cores the model's own threads use)."""
    return int(prefetch) if prefetch >= 0 else (2 if device.type == "cuda" else 0)


def build_samplers(cfg: DictConfig, data: TrainData, cache_dir: Path | None = None) -> dict:
    """{"train": [the training sampler of each phase (train.phases; one without)], "eval": the evaluation
    one}, each prepared on the graph once (a sampler that pre-computes something caches it in cache_dir).
    Phases with the same fanouts share one sampler."""
    layers = int(cfg.model.num_layers)
    phases = resolve_phases(cfg)
    by_fanouts: dict = {}
    for phase in phases:
        if phase.fanouts not in by_fanouts:
            by_fanouts[phase.fanouts] = build_sampler(cfg.sampler, layers, phase.fanouts)
    samplers = {
        "train": [by_fanouts[phase.fanouts] for phase in phases],
        "eval": build_eval_sampler(cfg.sampler, layers, cfg.train.eval_fanouts),
    }
    if sums_first_layer(cfg, data.feat_dim, data.num_classes, data.edges is None):
        # the same order in RAM as out of core, where the sums are built
        for sampler in [*by_fanouts.values(), samplers["eval"]]:
            sampler.by_source = True
    ctx = SamplingContext(
        data.graph, data.g, data.splits["train"], data.labels, cache_dir, seed=int(cfg.seed)
    )
    for sampler in [*by_fanouts.values(), samplers["eval"]]:
        needs_partition = getattr(sampler, "needs_partition", None)
        if needs_partition is not None:  # cluster_gcn: its partition, made here when missing
            from gnnscale.partition import ensure_partition

            method, num_parts = needs_partition(data.graph.num_nodes)
            ensure_partition(data.graph, method, num_parts, int(cfg.seed))
        prepare = getattr(sampler, "prepare", None)
        if prepare is not None:
            prepare(ctx)
    return samplers


def preflight(
    cfg: DictConfig, data: TrainData, device: torch.device, budget: Budget, samplers: dict
) -> tuple[MemoryPlan, list[str]]:
    """The memory plan, from a few sampled batches (drawn before the run's seeded RNG streams start).
    Raises MemoryBudgetError, with settings that would fit, when even the leanest plan does not.
    With train.phases every phase's batches are probed and the largest of each size is planned for."""
    t = cfg.train
    layers = int(cfg.model.num_layers)
    phases = resolve_phases(cfg)
    shapes = [
        probe_batches(data.g, data.splits["train"], sampler, phase.batch_size, num_layers=layers)
        for phase, sampler in zip(phases, samplers["train"], strict=True)
    ]
    train_shape = BatchShape(
        max(s.input_rows for s in shapes),
        tuple(max(d) for d in zip(*(s.dst_rows for s in shapes), strict=True)),
        tuple(max(e) for e in zip(*(s.edges for s in shapes), strict=True)),
    )
    evals = [data.splits[s] for s in ("val", "test") if len(data.splits[s])]

    def eval_shape(batch_size: int) -> BatchShape:
        return max(
            (probe_batches(data.g, ids, samplers["eval"], batch_size, k=1) for ids in evals),
            key=lambda shape: shape.input_rows,
            default=train_shape,
        )

    model = build_model(cfg.model, data.feat_dim, data.num_classes)
    sizes = Sizes(
        num_nodes=data.graph.num_nodes,
        feat_dim=data.feat_dim,
        feat_itemsize=data.features.dtype.itemsize,
        csc_bytes=data.csc_bytes,
        dims=tuple(model.dims),
        num_params=sum(p.numel() for p in model.parameters()),
        input_dropout=float(t.input_dropout) > 0,
        norm=(cfg.model.get("norm") or "none") != "none",
        first_sums=sums_first_layer(cfg, data.feat_dim, data.num_classes, data.edges is None),
    )
    eval_bs = eval_batch_size(t)
    w = Workload.now(sizes, train_shape, eval_shape(eval_bs))  # the process read once
    cache_rows = int(float(t.get("cache_gb", 0.0)) * 1e9) // sizes.row_bytes
    largest = max(phase.batch_size for phase in phases)
    p, decisions = plan(
        w,
        t.feature_cache,
        resolve_prefetch(int(t.prefetch), device),
        budget,
        cache_rows,
        resident_ok=data.edges is None,  # a link run's graph is its edge split's, already placed
    )
    p = replace(p, eval_batch_size=eval_bs)
    if not p.fits:
        raise MemoryBudgetError(*refusal(w, p, largest, p.eval_batch_size))
    return p, decisions


def sums_first_layer(cfg: DictConfig, feat_dim: int, num_classes: int, node_task: bool) -> bool:
    """Can the batches' first layer be summed as the features are read (training/sum_sweep.py)?
    A SAGE mean / gcn layer with in <= out (models/sums.py) on the neighbour sampler's blocks, fp32, no
    input dropout, no degree column (the file's rows are the layer's input), a node task. The samplers
    then list the input layer's edges in source order in every run, capped or not, so both sum alike."""
    m = cfg.model
    out = int(m.hidden) if int(m.num_layers) > 1 else int(num_classes)
    return (
        m.arch == "sage"
        and m.aggregator in ("mean", "gcn")
        and feat_dim <= out
        and cfg.sampler.kind == "neighbor"
        and str(cfg.precision.dtype) == "fp32"
        and float(cfg.train.input_dropout) == 0
        and not bool(m.get("degree_feature", False))
        and node_task
    )


def build_sum_sweep(data: TrainData, what: str) -> SumSweep:
    """The first-layer sums' passes, in the memory the plan gave them (its sums_bytes)."""
    return SumSweep(data.features, data.reader, data.sums_bytes, what=what)


def build_sweeper(data: TrainData, lookahead: bool = True) -> Sweeper | None:
    """feature_cache=read: one sweep for a run's streams (they never run at once, so they share it).
    lookahead=False: one batch in flight, sampled after the one before computed (samplers that draw from
    torch's RNG mid-epoch)."""
    if data.feature_cache != "read":
        return None
    rows, batches, spare = data.stage
    return Sweeper(data.features, data.reader, rows, batches, spare_rows=spare, lookahead=lookahead)


def loss_blocks_layers(cfg: DictConfig) -> int:
    """build_loader's loss_blocks_layers: the layer count when subgraph batches may be cut to what the loss
    reads without changing it (models.exact_on_blocks), else 0."""
    return int(cfg.model.num_layers) if exact_on_blocks(cfg.model) else 0


def build_streams(
    cfg: DictConfig,
    data: TrainData,
    device: torch.device,
    prefetch: int,
    samplers: dict,
    *,
    sync: Sync = SINGLE,
    all_train: torch.Tensor | None = None,
    eval_batch_size: int = 0,
) -> dict:
    """train / val / test BatchStreams: training fanouts and batch size, or the evaluation ones
    (eval_batch_size: the memory plan's; 0 = the configured one).
    "train" is a list, one stream per phase (train.phases; one without), its batch size and sampler.
    Under data parallelism `data` holds this rank's splits, all_train every training node."""
    t = cfg.train
    stratified = cfg.sampler.get("seed_order", "random") == "stratified"
    eval_bs = eval_batch_size or eval_batch_size(t)
    buffers = FeatureBuffers(data.features.feat_dim, data.features.dtype, prefetch, device.type == "cuda")
    # features read from disk: every batch's first layer summed as the file is read where the model allows
    # (data.sums_bytes, set from the plan), else the row sweep
    summed = data.feature_cache == "read" and data.sums_bytes > 0
    sweeper = None if summed else build_sweeper(data)
    names = {"train": "training batches", "val": "validation batches", "test": "test batches"}
    sweeps = {split: build_sum_sweep(data, what) for split, what in names.items()} if summed else {}
    cut = loss_blocks_layers(cfg)

    def stream(split: str, train: bool, sampler=None, batch_size: int = 0) -> BatchStream:
        ids, bs = data.splits[split], batch_size if train else eval_bs
        sampler = sampler if train else samplers["eval"]
        seed_labels = data.labels[ids] if train and stratified else None
        return BatchStream(
            lambda: build_loader(
                data.g,
                ids,
                sampler,
                bs,
                shuffle=train,
                num_workers=int(t.num_workers),
                seed_labels=seed_labels,
                loss_blocks_layers=cut if train else 0,
            ),
            data.features,
            data.labels,
            prefetch=prefetch,
            device=device,
            buffers=buffers,
            sweeper=sweeps.get(split, sweeper),
        )

    phases = resolve_phases(cfg)
    train = [
        stream("train", True, sampler, phase.batch_size)
        for phase, sampler in zip(phases, samplers["train"], strict=True)
    ]
    if sync.world > 1:
        for s, phase, sampler in zip(train, phases, samplers["train"], strict=True):
            single = len(build_loader(data.g, all_train, sampler, phase.batch_size, shuffle=False))
            equal_batches(s, single, sync)
    return {"train": train, "val": stream("val", False), "test": stream("test", False)}


def equal_batches(stream: BatchStream, single: int, sync: Sync) -> None:
    """Every rank runs the same number of batches (a rank with fewer would leave the others waiting in
    an all-reduce), and together about as many as one process would (`single`): a subgraph formation
    (Cluster-GCN, SAINT) draws its batches from the whole graph whatever seeds a rank owns."""
    share = -(-single // sync.world)
    stream.limit(int(-sync.max([-min(len(stream), share)])[0]))


def build_trainer(
    cfg: DictConfig,
    data: TrainData,
    task,
    *,
    precision,
    device: torch.device,
    run_dir: Path,
    prefetch: int,
    samplers: dict,
    callbacks: Sequence[Callback] = (),
    peak_rss_mb: Callable[[], float | None] = lambda: None,
    sync: Sync = SINGLE,
    all_train: torch.Tensor | None = None,
    eval_batch_size: int = 0,
) -> Trainer:
    t = cfg.train
    reseed(int(cfg.seed))  # the initial weights: the same for the same seed
    model = task.build_model(cfg.model, data.feat_dim).to(device)
    signature = model_signature(cfg.model, data.feat_dim, data.num_classes)
    optimizer = build_optimizer(model.parameters(), t)
    make_streams = build_streams
    if getattr(task, "name", "node") == "link":
        from gnnscale.training.link_streams import build_link_streams as make_streams
    streams = make_streams(
        cfg, data, device, prefetch, samplers, sync=sync, all_train=all_train, eval_batch_size=eval_batch_size
    )
    phases = resolve_phases(cfg)
    steps = epoch_steps(phases, [len(s) for s in streams["train"]])
    scheduler = build_scheduler(optimizer, steps, t)
    identity = {
        "signature": signature,
        "signature_hash": signature_hash(signature),
        "model_cfg": OmegaConf.to_container(cfg.model, resolve=True),
        "graph": data.describe(),
        "config_hash": config_hash(hashable_cfg(cfg)),
        "task": getattr(task, "name", "node"),  # link: num_classes is the embedding width, not classes
    }
    settings = TrainerSettings(
        epochs=phases[-1].end_epoch,
        seed=int(cfg.seed),
        eval_every=int(t.eval_every),
        patience=int(t.patience),
        grad_clip=float(t.grad_clip),
        input_dropout=float(t.input_dropout),
        phases=tuple(phases) if uses_phases(cfg) else (),
    )
    return Trainer(
        model,
        task,
        optimizer,
        scheduler,
        precision,
        streams,
        run_dir,
        settings,
        identity,
        callbacks,
        peak_rss_mb,
        sync,
    )
