"""`gnnscale train`: sharded graph -> trained GNN run_dir (config, metrics, checkpoints, summary).

Structure comes from the mmap'd CSC, features from the FeatureStore (gathered per batch for the
sampled input nodes), labels and splits from the shards. Every epoch reseeds all RNGs from
(seed, epoch), so a run resumed from checkpoints/last.pt repeats the uninterrupted run.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError, DataError
from gnnscale.models import build_model, model_signature, signature_hash
from gnnscale.sampling import build_loader, build_sampler, set_sampling_threads
from gnnscale.stages.common import config_hash, cpu_count, make_run_dir, metered, write_summary
from gnnscale.training.alloc import keep_heap_warm
from gnnscale.training.batches import BatchStream
from gnnscale.training.checkpoint import (
    BEST,
    LAST,
    check_signature,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from gnnscale.training.data import load_train_data
from gnnscale.training.evaluate import evaluate
from gnnscale.training.loop import epoch_seed, reseed, train_epoch
from gnnscale.training.metrics import check_metric, class_weights, finite_or_none
from gnnscale.training.options import apply_few_labels, check_train_cfg, pick_device
from gnnscale.training.precision import Precision
from gnnscale.training.schedule import build_optimizer, build_scheduler
from gnnscale.utils.atomic import append_jsonl, write_text
from gnnscale.utils.ui import info, is_rank_zero, make_progress, summary_table

METRICS_FILE = "metrics.jsonl"
# Keys that steer where and whether a run continues, not what it computes.
_RUN_KEYS = ("run_dir", "resume", "overwrite", "cli_overrides")
_EVAL_STREAM, _TEST_STREAM = 1, 2


def _hashable_cfg(cfg: DictConfig) -> dict:
    data = OmegaConf.to_container(cfg, resolve=True)
    for k in _RUN_KEYS:
        data.pop(k, None)
    data.get("train", {}).pop("resume", None)
    return data


def _newest_run(base: Path = Path("runs") / "train") -> Path | None:
    runs = sorted(
        (p for p in base.glob("*") if (p / "checkpoints" / LAST).is_file()),
        key=lambda p: (p / "checkpoints" / LAST).stat().st_mtime,
    )
    return runs[-1] if runs else None


def resolve_resume(cfg: DictConfig) -> Path | None:
    """resume=RUN_DIR, or train.resume=true with run_dir= (default: the newest run under runs/train)."""
    if cfg.get("resume"):
        folder = Path(cfg.resume)
        if cfg.get("run_dir") and Path(cfg.run_dir).resolve() != folder.resolve():
            raise ConfigError(
                f"resume={cfg.resume} and run_dir={cfg.run_dir} disagree", "give only resume=RUN_DIR"
            )
    elif cfg.train.resume:
        folder = Path(cfg.run_dir) if cfg.get("run_dir") else _newest_run()
        if folder is None:
            raise DataError(
                "train.resume=true but no run under runs/train has checkpoints/last.pt", "pass resume=RUN_DIR"
            )
    else:
        return None
    if not (folder / "checkpoints" / LAST).is_file():
        raise DataError(
            f"cannot resume: {folder}/checkpoints/{LAST} does not exist",
            "point resume= at a train run_dir that finished at least one epoch",
        )
    return folder


def _truncate_metrics(path: Path, last_epoch: int) -> None:
    """Drop metric lines past the checkpoint (an epoch that ran but whose last.pt was never written)."""
    import json

    if not path.is_file():
        return
    keep = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get("epoch", 0) <= last_epoch
    ]
    write_text(path, "".join(line + "\n" for line in keep))


def _better(value: float, best: float) -> bool:
    return not math.isnan(value) and (math.isnan(best) or value > best)


def run(cfg: DictConfig, on_epoch_end: Callable[[int], None] | None = None) -> dict:
    check_train_cfg(cfg)
    t = cfg.train
    resume_dir = resolve_resume(cfg)
    if resume_dir is not None:
        cfg = OmegaConf.merge(cfg, {"run_dir": str(resume_dir)})
    elif cfg.get("run_dir") and (Path(cfg.run_dir) / "checkpoints" / LAST).is_file() and not cfg.overwrite:
        raise ConfigError(
            f"run_dir '{cfg.run_dir}' already holds a training run",
            "pass train.resume=true to continue it, overwrite=true to start it again, or choose another run_dir",
        )
    keep_heap_warm()
    threads = int(t.num_threads) or cpu_count()
    torch.set_num_threads(threads)
    set_sampling_threads(threads)  # DGL's OpenMP team is its own: seeded and sized apart from torch's
    data = load_train_data(cfg.graph_dir, t.feature_cache, float(t.feature_cache_budget_mb))
    check_metric(t.metric, data.num_classes)
    cfg, few_labels, kept = apply_few_labels(cfg, len(data.splits["train"]))
    t = cfg.train
    if few_labels:
        info(
            f"few labelled training nodes ({len(data.splits['train']):,} < train.few_labels.below="
            f"{t.few_labels.below:,}): using {' '.join(f'{k}={v}' for k, v in few_labels.items())}"
            f"{' (kept yours: ' + ' '.join(kept) + ')' if kept else ''} "
            "(change one with train.few_labels.<name>=VALUE, or turn them off with train.few_labels.below=0)"
        )
    device = pick_device(t.device)
    precision = Precision(cfg.precision.dtype, device)

    run_dir = make_run_dir(cfg, "train")
    ckpt_dir = run_dir / "checkpoints"
    metrics_path = run_dir / METRICS_FILE
    if resume_dir is None and is_rank_zero():
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # overwrite=true: a fresh run, not a mix of two
        metrics_path.unlink(missing_ok=True)

    reseed(int(cfg.seed))
    model = build_model(cfg.model, data.feat_dim, data.num_classes).to(device)
    signature = model_signature(cfg.model, data.feat_dim, data.num_classes)
    num_params = sum(p.numel() for p in model.parameters())
    n_train = len(data.splits["train"])
    steps_per_epoch = math.ceil(n_train / t.batch_size)
    optimizer = build_optimizer(model.parameters(), t)
    scheduler = build_scheduler(optimizer, steps_per_epoch, t)
    weight = (
        class_weights(data.labels[data.splits["train"]], data.num_classes).to(device)
        if t.class_weights
        else None
    )

    sampler = build_sampler(cfg.sampler, int(cfg.model.num_layers))
    eval_sampler = build_sampler(cfg.sampler, int(cfg.model.num_layers), fanouts=t.eval_fanouts)
    eval_bs = int(t.eval_batch_size) or 4 * int(t.batch_size)
    prefetch = int(t.prefetch) if t.prefetch >= 0 else (2 if device.type == "cuda" else 0)

    def stream(split: str, train: bool) -> BatchStream:
        ids = data.splits[split]
        bs = int(t.batch_size) if train else eval_bs
        s = sampler if train else eval_sampler
        return BatchStream(
            lambda: build_loader(data.g, ids, s, bs, shuffle=train, num_workers=int(t.num_workers)),
            data.features,
            data.labels,
            prefetch=prefetch,
            device=device,
            num_batches=math.ceil(len(ids) / bs),
        )

    train_stream, val_stream, test_stream = stream("train", True), stream("val", False), stream("test", False)
    has_val = len(data.splits["val"]) > 0
    metric = str(t.metric)
    cfg_hash = config_hash(_hashable_cfg(cfg))

    start_epoch, best_val, best_epoch, stopped, resumed_from = 1, float("nan"), 0, False, None
    if resume_dir is not None:
        ckpt = load_checkpoint(ckpt_dir / LAST)
        check_signature(ckpt, signature, ckpt_dir / LAST)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        precision.scaler.load_state_dict(ckpt["scaler"])
        set_rng_state(ckpt["rng"])
        start_epoch = int(ckpt["epoch"]) + 1
        best_val, best_epoch, stopped = (
            float(ckpt["best_val"]),
            int(ckpt["best_epoch"]),
            bool(ckpt.get("stopped", False)),
        )
        resumed_from = int(ckpt["epoch"])
        _truncate_metrics(metrics_path, resumed_from)
        note = (
            ""
            if ckpt.get("config_hash") == cfg_hash
            else " (its config differs from this one in settings other than the model)"
        )
        info(f"resuming {run_dir} after epoch {resumed_from}{note}")

    def checkpoint(epoch: int) -> dict:
        return {
            "model": model.state_dict(),
            "signature": signature,
            "signature_hash": signature_hash(signature),
            "model_cfg": OmegaConf.to_container(cfg.model, resolve=True),
            "graph": data.describe(),
            "epoch": epoch,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": precision.scaler.state_dict(),
            "rng": rng_state(),
            "config_hash": cfg_hash,
            "best_val": best_val,
            "best_epoch": best_epoch,
            "metric": metric,
            "stopped": stopped,
        }

    info(
        f"train: {data.name} ({data.graph.num_nodes:,} nodes, {n_train:,} train seeds) · {cfg.model.arch} "
        f"{cfg.model.num_layers}x{cfg.model.hidden} · fanouts {list(cfg.sampler.fanouts)} · batch {t.batch_size} · "
        f"{precision.name} on {device.type} · features {data.feature_cache} · {num_params:,} params"
    )
    history: list[dict] = []
    with metered() as meter:
        with make_progress() as bar:
            for epoch in range(start_epoch, int(t.epochs) + 1):
                if stopped:
                    break
                reseed(epoch_seed(cfg.seed, epoch))
                task = bar.add_task(f"epoch {epoch}/{t.epochs}", total=len(train_stream), extra="")
                seen, t_epoch = [0], time.perf_counter()

                def on_batch(step: int, loss: float, n: int, task=task, t_epoch=t_epoch, seen=seen) -> None:
                    seen[0] += n
                    rate = seen[0] / max(time.perf_counter() - t_epoch, 1e-9)
                    bar.update(task, completed=step, extra=f"loss {loss:.4f} · {rate:,.0f} seeds/s")

                stats = train_epoch(
                    model,
                    train_stream,
                    optimizer,
                    scheduler,
                    precision,
                    float(t.grad_clip),
                    weight,
                    float(t.input_dropout),
                    on_batch,
                )
                bar.remove_task(task)
                record = {
                    "epoch": epoch,
                    "loss": round(stats["loss"], 6),
                    "train_acc": round(stats["train_acc"], 6),
                    "lr": scheduler.get_last_lr()[0],
                }
                improved = False
                if has_val and (epoch % t.eval_every == 0 or epoch == t.epochs):
                    reseed(epoch_seed(cfg.seed, epoch, _EVAL_STREAM))
                    val = evaluate(model, val_stream, precision, metric, data.num_classes, weight)
                    record.update(
                        {
                            f"val_{metric}": finite_or_none(val[metric]),
                            "val_loss": finite_or_none(val["loss"]),
                            "eval_time_s": round(val["time_s"], 4),
                        }
                    )
                    if _better(val[metric], best_val):
                        best_val, best_epoch, improved = float(val[metric]), epoch, True
                elif not has_val:
                    best_epoch, improved = (
                        epoch,
                        True,
                    )  # no validation split: the latest weights are the best we know
                record.update({k: round(v, 4) for k, v in stats.items() if k.endswith("_s")})
                record.update(
                    {
                        "seeds_per_s": round(stats["seeds_per_s"], 1),
                        "steps": stats["steps"],
                        "peak_rss_mb": round(meter.sampler.peak_rss_mb, 1),
                        "best": improved,
                    }
                )
                if device.type == "cuda":
                    record["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
                stopped = bool(has_val and t.patience > 0 and epoch - best_epoch >= t.patience)
                if is_rank_zero():
                    append_jsonl(metrics_path, record)
                    state = checkpoint(epoch)
                    if improved:
                        save_checkpoint(ckpt_dir / BEST, state)
                    save_checkpoint(ckpt_dir / LAST, state)
                history.append(record)
                shown = (
                    f"val_{metric} {record[f'val_{metric}']:.4f}"
                    if record.get(f"val_{metric}") is not None
                    else ""
                )
                info(
                    f"epoch {epoch:>3}  loss {record['loss']:.4f}  {shown}{' *' if improved and has_val else ''}  "
                    f"{record['seeds_per_s']:,.0f} seeds/s  {record['epoch_time_s']:.2f}s"
                )
                if on_epoch_end is not None:
                    on_epoch_end(epoch)
                if stopped:
                    info(
                        f"early stop: no better val_{metric} for {t.patience} epochs (best {best_val:.4f} at epoch {best_epoch})"
                    )

        # Test with the best-validation weights, under a fixed seed (the same after any resume).
        best_path = ckpt_dir / BEST
        if best_path.is_file():
            model.load_state_dict(load_checkpoint(best_path)["model"])
        reseed(epoch_seed(cfg.seed, 0, _TEST_STREAM))
        val = (
            evaluate(model, val_stream, precision, metric, data.num_classes, weight)
            if has_val
            else {metric: float("nan")}
        )
        reseed(epoch_seed(cfg.seed, 0, _TEST_STREAM + 1))
        test = evaluate(model, test_stream, precision, metric, data.num_classes, weight)
    for s in (train_stream, val_stream, test_stream):
        s.close()

    all_records = _read_records(metrics_path) if metrics_path.is_file() else history
    times = [r["epoch_time_s"] for r in all_records if "epoch_time_s" in r]

    def med(key: str) -> float | None:
        vals = [r[key] for r in all_records if key in r]
        return round(statistics.median(vals), 4) if vals else None

    summary = {
        "stage": "train",
        "graph_dir": str(cfg.graph_dir),
        "graph": data.name,
        "metric": metric,
        f"val_{metric}": finite_or_none(val[metric]),
        f"test_{metric}": finite_or_none(test[metric]),
        f"best_val_{metric}": finite_or_none(best_val),
        "test_loss": finite_or_none(test.get("loss")),
        "best_epoch": best_epoch,
        "epochs_run": len(all_records),
        "early_stopped": stopped,
        "resumed_from_epoch": resumed_from,
        "epoch_time_s": round(statistics.median(times), 4) if times else None,
        "time_split_s": {
            k: med(k) for k in ("sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s")
        },
        "seeds_per_s": med("seeds_per_s"),
        "num_params": num_params,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "fanouts": list(cfg.sampler.fanouts),
        "batch_size": int(t.batch_size),
        "precision": precision.name,
        "device": device.type,
        "feature_cache": data.feature_cache,
        "num_threads": threads,
        "prefetch": prefetch,
        "few_labels_applied": few_labels,
        "checkpoint": str(best_path if best_path.is_file() else ckpt_dir / LAST),
        **meter.stats(),
    }
    if device.type == "cuda":
        summary["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    write_summary(run_dir, summary)
    summary_table(
        f"train: {cfg.model.arch} on {data.name} -> {run_dir}",
        {
            f"test {metric}": _fmt(summary[f"test_{metric}"]),
            f"val {metric} (best epoch {best_epoch})": _fmt(summary[f"val_{metric}"]),
            "epochs run": f"{summary['epochs_run']}{' (early stop)' if stopped else ''}",
            "epoch time (median, s)": summary["epoch_time_s"] or 0.0,
            "seeds/s (median)": summary["seeds_per_s"] or 0.0,
            "parameters": num_params,
            "precision / device": f"{precision.name} / {device.type}",
            "peak RSS (MB)": summary["peak_rss_mb"],
            "wall time (s)": summary["wall_time_s"],
        },
    )
    info(f"summary: {run_dir / 'summary.json'}   checkpoint: {summary['checkpoint']}")
    summary["run_dir"] = str(run_dir)
    return summary


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _read_records(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
