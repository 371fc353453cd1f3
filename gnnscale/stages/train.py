"""`gnnscale train`: sharded graph -> trained GNN run_dir (config, metrics, checkpoints, summary).

Structure comes from the mmap'd CSC, features from the FeatureStore (gathered per batch for the
sampled input nodes), labels and splits from the shards. The loop itself is training/trainer.py;
this stage composes the pieces, runs it and reports.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig

from gnnscale.dist.ddp import launched, local_rank, local_world, start_sync
from gnnscale.dist.launch import check_ddp_cfg, launch_ranks
from gnnscale.dist.split import dist_summary, rank_budget, rank_share
from gnnscale.errors import MemoryBudgetError
from gnnscale.stages.common import cpu_count, metered
from gnnscale.storage.lock import run_dir_lock
from gnnscale.storage.run_dir import SAMPLER_CACHE, make_run_dir, write_summary
from gnnscale.tasks import build_task
from gnnscale.training.build import build_samplers, build_trainer, preflight
from gnnscale.training.cache_stats import CacheHitRate
from gnnscale.training.callbacks import ConsoleProgress, EpochHook
from gnnscale.training.cpu_math import configure_cpu
from gnnscale.training.diagnostics import build_diagnostics
from gnnscale.training.loggers import build_loggers
from gnnscale.training.options import pick_device
from gnnscale.training.phases import resolve_epochs, resolve_phases, uses_phases
from gnnscale.training.precision import Precision
from gnnscale.training.report import read_stats, summary_rows, train_summary
from gnnscale.training.resume import clear_previous_run, settle_run_dir
from gnnscale.training.sync import Sync
from gnnscale.training.task_setup import (
    check_task,
    few_labels_profile,
    link_summary,
    load_task_data,
    task_name,
)
from gnnscale.utils.alloc import keep_heap_warm
from gnnscale.utils.memlimit import gb, resolve_budget
from gnnscale.utils.ui import info, make_progress, summary_table


def run(cfg: DictConfig, on_epoch_end: Callable[[int], None] | None = None) -> dict:
    if cfg.dist.kind == "distdgl":
        from gnnscale.dist.distdgl import run_train

        return run_train(cfg)
    check_task(cfg)  # train.* and task.* settings
    cfg = resolve_epochs(cfg)  # train.phases given: the run's epochs are theirs (config.yaml records it)
    device = pick_device(cfg.train.device)
    if cfg.dist.kind == "ddp":
        check_ddp_cfg(cfg.dist, device.type)
        if not launched():  # `gnnscale train dist=ddp`: start the ranks; each runs this function again
            return launch_ranks(cfg, run)
        if device.type == "cuda":
            device = torch.device("cuda", local_rank())
            torch.cuda.set_device(device)
    sync = start_sync(cfg.dist, device)
    try:
        return _train(cfg, sync, device, on_epoch_end)
    finally:
        sync.close()


def _train(cfg: DictConfig, sync: Sync, device, on_epoch_end) -> dict:
    cfg, resume_dir = sync.agree(lambda: settle_run_dir(cfg, name_it=sync.world > 1))
    with run_dir_lock(cfg.get("run_dir"), "train", enabled=sync.rank == 0):  # a second process: exit 2
        return _fit(cfg, resume_dir, sync, device, on_epoch_end)


def _fit(cfg: DictConfig, resume_dir, sync: Sync, device, on_epoch_end) -> dict:
    threads = _setup_process(cfg, sync)
    data = load_task_data(cfg)  # files checked; features mmap'd until planned; link: its edge split's graph
    cfg, few_labels = few_labels_profile(cfg, data)  # node task: train.few_labels on a small train split
    precision = Precision(cfg.precision.dtype, device)
    existed = bool(cfg.get("run_dir")) and Path(cfg.run_dir).exists()
    run_dir = make_run_dir(cfg, "train")
    data, rank_callbacks, all_train = rank_share(cfg, data, sync)
    samplers = sync.rank_zero_first(lambda: build_samplers(cfg, data, run_dir / SAMPLER_CACHE))
    memory = _plan_memory(cfg, data, device, samplers, None if existed else run_dir, sync)
    task = build_task(task_name(cfg), cfg.train, data, device, task_cfg=cfg.get("task"))
    if resume_dir is None:
        clear_previous_run(run_dir)
    with metered() as meter, make_progress() as bar:
        callbacks = _callbacks(cfg, data, bar, metric=task.metric, on_epoch_end=on_epoch_end, sync=sync,
                               run_dir=run_dir) + rank_callbacks  # fmt: skip
        cache_stats = CacheHitRate(data.features) if data.features.cache_rows else None
        callbacks += [cache_stats] if cache_stats is not None else []
        trainer = build_trainer(
            cfg, data, task, precision=precision, device=device, run_dir=run_dir, prefetch=memory.prefetch,
            samplers=samplers, callbacks=callbacks, sync=sync, all_train=all_train,
            eval_batch_size=memory.eval_batch_size, peak_rss_mb=lambda: meter.sampler.peak_rss_mb,
        )  # fmt: skip
        if resume_dir is not None:
            same = trainer.restore()
            note = "" if same else " (its config differs from this one in settings other than the model)"
            info(f"resuming {run_dir} after epoch {trainer.resumed_from}{note}")
        info(_header(cfg, data, precision, device, trainer, sync))
        info(memory.line())
        try:
            result = trainer.fit()
        except KeyboardInterrupt:  # Ctrl-C: exit 130 with the resume command (last.pt has the last epoch)
            raise trainer.interrupted() from None
        finally:
            trainer.close()
    summary = train_summary(
        cfg,
        data,
        trainer,
        result,
        precision=precision.name,
        device=device.type,
        num_threads=threads,
        prefetch=memory.prefetch,
        few_labels_applied=few_labels,
        **(link_summary(cfg, data, result) if data.edges is not None else {}),
        memory_plan=memory.as_dict(),
        **({"hot_feature_cache": cache_stats.summary()} if cache_stats is not None else {}),
        **({"feature_reads": read_stats(trainer, data)} if data.reader is not None else {}),
        **({"dist": dist_summary(cfg.dist, sync)} if sync.world > 1 else {}),
        **meter.stats(),
    )
    if sync.rank == 0:
        write_summary(run_dir, summary)
        summary_table(f"train: {cfg.model.arch} on {data.name} -> {run_dir}", summary_rows(summary))
        info(f"summary: {run_dir / 'summary.json'}   checkpoint: {summary['checkpoint']}")
    return {**summary, "run_dir": str(run_dir)}


def _callbacks(cfg: DictConfig, data, bar, *, metric: str, on_epoch_end, sync: Sync, run_dir: Path) -> list:
    """The console progress, the health diagnostics (train.diagnostics, rank 0's batches), the loggers
    (curves.png, TensorBoard: logger=) and the caller's epoch hook."""
    callbacks = [ConsoleProgress(bar, int(cfg.train.epochs), metric)]
    diagnostics = build_diagnostics(cfg, data, metric) if sync.rank == 0 and data.edges is None else None
    callbacks += [diagnostics] if diagnostics is not None else []
    callbacks += build_loggers(cfg, run_dir, metric, f"{cfg.model.arch} on {data.name}", sync.rank)
    callbacks += [EpochHook(on_epoch_end)] if on_epoch_end is not None else []
    return callbacks


def _setup_process(cfg: DictConfig, sync: Sync) -> int:
    keep_heap_warm()
    threads = int(cfg.train.num_threads) or max(1, cpu_count() // local_world())  # ranks share the cores
    configure_cpu(threads)  # torch's and DGL's thread teams (training/cpu_math.py)
    return threads


def _plan_memory(cfg: DictConfig, data, device, samplers: dict, fresh: Path | None, sync: Sync):
    """The memory plan (exit 2 when nothing fits, leaving no new run_dir behind), its decisions said,
    the features placed as decided. The ranks on one machine share its budget."""
    budget = rank_budget(resolve_budget(cfg.train.memory_budget, "train.memory_budget"), sync)
    try:
        memory, decisions = preflight(cfg, data, device, budget, samplers)
    except MemoryBudgetError:
        if fresh is not None and sync.rank == 0:  # made by this run a moment ago: nothing of the user's
            shutil.rmtree(fresh, ignore_errors=True)
        raise
    for line in decisions:
        info(line)
    if memory.structure == "memory":
        data.hold_structure_in_memory()
    if memory.feature_cache == "memory":
        data.hold_features_in_memory()
    elif memory.feature_cache == "read":
        data.read_features_ahead(memory)
    if not memory.mapped_files_fit:
        data.read_at_random()
        info("memory-mapped files larger than the page cache the budget leaves: faults read only their page")
    if memory.cache_rows:
        rows = data.cache_hot_features(memory.cache_rows)
        info(
            f"hot-feature cache: the {rows:,} highest in-degree nodes' features in RAM "
            f"({rows / data.graph.num_nodes:.1%} of nodes, {gb(data.features.cache_bytes)}); the rest memory-mapped"
        )
    return memory


def _header(cfg: DictConfig, data, precision, device, trainer, sync: Sync) -> str:
    num_params = sum(p.numel() for p in trainer.model.parameters())
    seeds = f"{len(data.splits['train']):,} train seeds" + (
        f" per rank x {sync.world}" if sync.world > 1 else ""
    )
    return (
        f"train: {data.name} ({data.graph.num_nodes:,} nodes, {seeds}) · "
        f"{cfg.model.arch} {cfg.model.num_layers}x{cfg.model.hidden} · {_formation(cfg.sampler)} · "
        f"batch {cfg.train.batch_size} · {precision.name} on {device.type} · features {data.feature_cache} · "
        f"{num_params:,} params"
        + (" · phases: " + "; ".join(p.describe() for p in resolve_phases(cfg)) if uses_phases(cfg) else "")
    )


def _formation(sampler_cfg) -> str:
    fanouts = sampler_cfg.get("fanouts")
    return f"{sampler_cfg.kind} {list(fanouts)}" if fanouts is not None else str(sampler_cfg.kind)
