"""Factories that turn a train config and its data into the trainer's pieces."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from gnnscale.models import model_signature, signature_hash
from gnnscale.sampling import build_loader, build_sampler
from gnnscale.storage.run_dir import config_hash
from gnnscale.training.batches import BatchStream
from gnnscale.training.data import TrainData
from gnnscale.training.schedule import build_optimizer, build_scheduler
from gnnscale.training.seeding import reseed
from gnnscale.training.trainer import Callback, Trainer, TrainerSettings

# Keys that steer where and whether a run continues, not what it computes.
_RUN_KEYS = ("run_dir", "resume", "overwrite", "cli_overrides")


def hashable_cfg(cfg: DictConfig) -> dict:
    """The config minus where/whether it runs: two runs with equal hashes compute the same thing."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for k in _RUN_KEYS:
        data.pop(k, None)
    data.get("train", {}).pop("resume", None)
    return data


def resolve_prefetch(prefetch: int, device: torch.device) -> int:
    """-1 = auto: gather ahead on a GPU (the CPU is otherwise idle), inline on CPU (a gather thread
    would steal the cores the model's own threads use)."""
    return int(prefetch) if prefetch >= 0 else (2 if device.type == "cuda" else 0)


def build_streams(cfg: DictConfig, data: TrainData, device: torch.device) -> dict:
    """train / val / test BatchStreams: training fanouts and batch size, or the evaluation ones."""
    t = cfg.train
    layers = int(cfg.model.num_layers)
    samplers = {
        True: build_sampler(cfg.sampler, layers),
        False: build_sampler(cfg.sampler, layers, t.eval_fanouts),
    }
    eval_bs = int(t.eval_batch_size) or 4 * int(t.batch_size)
    prefetch = resolve_prefetch(int(t.prefetch), device)

    def stream(split: str, train: bool) -> BatchStream:
        ids, bs, sampler = data.splits[split], int(t.batch_size) if train else eval_bs, samplers[train]
        return BatchStream(
            lambda: build_loader(data.g, ids, sampler, bs, shuffle=train, num_workers=int(t.num_workers)),
            data.features,
            data.labels,
            prefetch=prefetch,
            device=device,
            num_batches=math.ceil(len(ids) / bs),
        )

    return {"train": stream("train", True), "val": stream("val", False), "test": stream("test", False)}


def build_trainer(
    cfg: DictConfig,
    data: TrainData,
    task,
    precision,
    device: torch.device,
    run_dir: Path,
    callbacks: Sequence[Callback] = (),
    peak_rss_mb: Callable[[], float | None] = lambda: None,
) -> Trainer:
    t = cfg.train
    reseed(int(cfg.seed))  # the initial weights: the same for the same seed
    model = task.build_model(cfg.model, data.feat_dim).to(device)
    signature = model_signature(cfg.model, data.feat_dim, data.num_classes)
    optimizer = build_optimizer(model.parameters(), t)
    scheduler = build_scheduler(optimizer, math.ceil(len(data.splits["train"]) / t.batch_size), t)
    identity = {
        "signature": signature,
        "signature_hash": signature_hash(signature),
        "model_cfg": OmegaConf.to_container(cfg.model, resolve=True),
        "graph": data.describe(),
        "config_hash": config_hash(hashable_cfg(cfg)),
    }
    settings = TrainerSettings(
        epochs=int(t.epochs),
        seed=int(cfg.seed),
        eval_every=int(t.eval_every),
        patience=int(t.patience),
        grad_clip=float(t.grad_clip),
        input_dropout=float(t.input_dropout),
    )
    streams = build_streams(cfg, data, device)
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
    )
