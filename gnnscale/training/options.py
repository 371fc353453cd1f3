"""Checks of a train config before any data is read (a bad value exits 2 with one line), and the\nfew-labels profile, which only the size of the train split decides."""

from __future__ import annotations

import torch

from gnnscale.errors import ConfigError
from gnnscale.models import check_model_cfg
from gnnscale.sampling import check_fanouts, check_sampler_cfg, has_fanouts
from gnnscale.tasks.metrics import check_metric
from gnnscale.training.data import FEATURE_CACHES
from gnnscale.training.phases import check_phases
from gnnscale.training.precision import DTYPES
from gnnscale.training.schedule import OPTIMIZERS, SCHEDULES
from gnnscale.utils.memlimit import parse_size

DEVICES = ("auto", "cpu", "cuda")


def _require(ok: bool, key: str, value, rule: str, example: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value} {rule}", f"use e.g. {key}={example}")


def check_train_cfg(cfg) -> None:
    t = cfg.train
    check_model_cfg(cfg.model)
    check_sampler_cfg(cfg.sampler, int(cfg.model.num_layers))
    if t.eval_fanouts is not None:
        check_fanouts(t.eval_fanouts, int(cfg.model.num_layers), key="train.eval_fanouts")
    _require(t.batch_size > 0, "train.batch_size", t.batch_size, "must be positive", 1024)
    _require(
        t.eval_batch_size >= 0,
        "train.eval_batch_size",
        t.eval_batch_size,
        "must be >= 0 (0 = 4 x batch_size)",
        4096,
    )
    _require(t.epochs >= 1, "train.epochs", t.epochs, "must be at least 1", 20)
    check_phases(cfg)
    _require(t.lr > 0, "train.lr", t.lr, "must be positive", 0.003)
    _require(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0", 0.0005)
    _require(t.warmup_epochs >= 0, "train.warmup_epochs", t.warmup_epochs, "must be >= 0", 1)
    _require(0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", t.min_lr_ratio, "must be in [0, 1]", 0.01)
    _require(t.step_epochs >= 1, "train.step_epochs", t.step_epochs, "must be at least 1", 10)
    _require(0 < t.step_gamma <= 1, "train.step_gamma", t.step_gamma, "must be in (0, 1]", 0.5)
    _require(0 <= t.input_dropout < 1, "train.input_dropout", t.input_dropout, "must be in [0, 1)", 0.5)
    _require(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "must be >= 0 (0 = off)", 1.0)
    _require(t.num_workers >= 0, "train.num_workers", t.num_workers, "must be >= 0", 0)
    if t.num_workers > 0 and not has_fanouts(cfg.sampler):
        # Subgraph and full-graph formations build their batches in the training process: say so, not ignore it.
        raise ConfigError(
            f"train.num_workers={t.num_workers} has no effect with sampler={cfg.sampler.kind}, "
            "which builds its batches in the training process",
            "drop train.num_workers (or set it to 0)",
        )
    _require(
        t.prefetch >= -1, "train.prefetch", t.prefetch, "must be >= 0 (0 = no prefetching) or -1 (auto)", 1
    )
    _require(t.num_threads >= 0, "train.num_threads", t.num_threads, "must be >= 0 (0 = every core)", 0)
    _require(t.eval_every >= 1, "train.eval_every", t.eval_every, "must be at least 1", 1)
    _require(t.patience >= 0, "train.patience", t.patience, "must be >= 0 (0 = no early stopping)", 10)
    _require(t.cache_gb >= 0, "train.cache_gb", t.cache_gb, "must be >= 0 (0 = no hot-feature cache)", 1.0)
    if str(t.memory_budget).lower() != "auto":
        parse_size(t.memory_budget, "train.memory_budget")
    if t.optimizer not in OPTIMIZERS:
        raise ConfigError(
            f"train.optimizer={t.optimizer!r} is not known", f"choose one of {', '.join(OPTIMIZERS)}"
        )
    if t.schedule not in SCHEDULES:
        raise ConfigError(
            f"train.schedule={t.schedule!r} is not known", f"choose one of {', '.join(SCHEDULES)}"
        )
    if t.feature_cache not in FEATURE_CACHES:
        raise ConfigError(
            f"train.feature_cache={t.feature_cache!r} is not known",
            f"choose one of {', '.join(FEATURE_CACHES)}",
        )
    check_metric(t.metric)
    if cfg.precision.dtype not in DTYPES:
        raise ConfigError(
            f"precision.dtype={cfg.precision.dtype!r} is not known", f"choose precision={'|'.join(DTYPES)}"
        )
    if t.device not in DEVICES:
        raise ConfigError(f"train.device={t.device!r} is not known", f"choose one of {', '.join(DEVICES)}")
    if t.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is visible", "use train.device=cpu (or auto)")


# train.few_labels.<field> -> the key it replaces
FEW_LABELS_KEYS = {
    "aggregator": "model.aggregator",
    "norm": "model.norm",
    "dropout": "model.dropout",
    "input_dropout": "train.input_dropout",
    "lr": "train.lr",
    "weight_decay": "train.weight_decay",
}


def apply_few_labels(cfg, num_train: int):
    """(cfg, {key: value} applied, [keys kept]) with train.few_labels' values in place when the train
    split is small; a key the user set on the command line keeps the user's value."""
    from omegaconf import OmegaConf

    from gnnscale.config.compose import overridden_keys

    profile = cfg.train.get("few_labels")
    if profile is None or num_train >= int(profile.below):
        return cfg, {}, []
    wanted = {key: profile[name] for name, key in FEW_LABELS_KEYS.items() if profile.get(name) is not None}
    mine = overridden_keys(cfg)
    applied = {k: v for k, v in wanted.items() if k not in mine}
    cfg = cfg.copy()
    for key, value in applied.items():
        OmegaConf.update(cfg, key, value, merge=False)
    check_train_cfg(cfg)
    return cfg, applied, sorted(k for k in wanted if k in mine)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
