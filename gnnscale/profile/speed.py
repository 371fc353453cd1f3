"""The plan's speed prediction before any training: a few timed batches of the training loader (the
sampling time and the mean batch), the two micro-measurements (random-gather bandwidth, matmul FLOP/s)
and the cost model's seeds/s (profile/cost.py)."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from gnnscale.errors import DataError
from gnnscale.profile.cost import batch_layers, predict_seeds_per_s, projection_shapes
from gnnscale.profile.micro import RowsInRam, gather_bandwidth, matmul_flops
from gnnscale.sampling import build_loader
from gnnscale.sampling.batch import Batch
from gnnscale.training.memory_plan import BatchShape

# DGL's DataLoader advises CPU affinity on every iteration; gnnscale sizes its threads itself.
AFFINITY_WARNING = "Dataloader CPU affinity opt is not enabled"


@dataclass(frozen=True)
class SampleProbe:
    shape: BatchShape  # the mean batch (not the largest, as the memory plan keeps)
    sample_s: float  # seconds per batch through the training loader
    batches: int


def probe_sampling(
    g, ids: torch.Tensor, sampler, batch_size: int, k: int = 5, num_layers: int = 1
) -> SampleProbe:
    """Sample k batches of `ids` through the same loader training uses, after one untimed batch (it pays
    one-off costs: buffers, the first touch of the graph's pages), each timed; mean shape and seconds."""
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(ids)))
    loader = build_loader(g, ids[order], sampler, int(batch_size), shuffle=False)
    batches = endless(loader)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=AFFINITY_WARNING)
        next(batches)
        seconds, shapes = [], []
        for _ in range(max(1, int(k))):
            t0 = time.perf_counter()
            b = next(batches)
            seconds.append(time.perf_counter() - t0)
            shapes.append((len(b.input_nodes), batch_layers(b, num_layers)))

    def mean(values) -> int:
        return int(round(sum(values) / len(values)))

    # per_layer[i]: every probed batch's (src, dst, edges) of layer i
    per_layer = list(zip(*(layers for _, layers in shapes), strict=True))
    shape = BatchShape(
        mean([rows for rows, _ in shapes]),
        tuple(mean([d for _, d, _ in layer]) for layer in per_layer),
        tuple(mean([e for _, _, e in layer]) for layer in per_layer),
    )
    return SampleProbe(shape, sum(seconds) / len(seconds), len(seconds))


def endless(loader) -> Iterator[Batch]:
    """The loader's batches, epoch after epoch (a small train split holds fewer batches than are timed)."""
    while True:
        empty = True
        for b in loader:
            empty = False
            yield b
        if empty:
            raise DataError(
                "the training loader yields no batches", "check the train split and train.batch_size"
            )


def predict_speed(
    model_cfg,
    data,
    sampler,
    dims,
    batch_size: int,
    device: torch.device,
    k: int = 5,
    rows_in_ram: bool = False,
) -> dict:
    """Seeds/s of `gnnscale train` with this sampler and model, predicted before any training: k probed
    batches (sampling time, mean shape), the gather bandwidth at that batch's rows and the matmul rate
    at its layers' shapes, put together by cost.predict_seeds_per_s. rows_in_ram: train will gather from
    RAM (features held there, or read ahead) while they are memory-mapped here: measured on RowsInRam."""
    probe = probe_sampling(data.g, data.splits["train"], sampler, batch_size, k, len(dims) - 1)
    store = RowsInRam(data.features) if rows_in_ram and not data.features.in_memory else data.features
    bw = gather_bandwidth(store, rows=probe.shape.input_rows)
    flops = matmul_flops(device, projection_shapes(probe.shape, dims))
    p = predict_seeds_per_s(
        min(batch_size, len(data.splits["train"])),
        probe.shape,
        dims,
        bw["row_bytes"],
        bw["bytes_per_s"],
        flops["flops_per_s"],
        probe.sample_s,
        arch=str(model_cfg.arch),
        aggregator=str(model_cfg.aggregator),
        norm=str(model_cfg.norm),
        dropout=float(model_cfg.dropout),
        device_type=device.type,
    )
    return {
        **p,
        "probe": {"batches": probe.batches, "sample_s": probe.sample_s, "input_rows": probe.shape.input_rows},
        "gather_bandwidth": bw,  # the two micro-measurements, reused by profile.measure's bounds
        "matmul": flops,
        "what": (
            "one step = sampling (timed) + feature bytes at the random-gather bandwidth + training FLOPs at "
            "the matmul rate + activation traffic at the gather bandwidth (CPU); serial, no prefetch overlap"
        ),
    }
