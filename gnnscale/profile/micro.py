"""The two micro-measurements both the plan and the measured breakdown are judged against: how fast this
host gathers random feature rows, and how fast it multiplies the model's dense matrices.

Each takes a fraction of a second, reports a median, runs on torch's current thread count (the
model's and the inline gather's), and repeats: the row sets and matrices are drawn from a fixed seed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import torch
from torch.utils import benchmark

from gnnscale.storage.feature_store import FeatureStore


def _median_s(fn, min_run_time: float) -> float:
    """Median seconds of one fn() call; the timer synchronises a GPU around each block of calls."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def random_rows(num_nodes: int, rows: int, generator: torch.Generator) -> torch.Tensor:
    """`rows` distinct random node ids in ascending order, as a sampled batch's input nodes are (the
    block relabelling numbers sources in ascending id order). A permutation when rows are a large share
    of the graph; otherwise draws with the repeats dropped (no N-sized permutation for a billion nodes)."""
    if rows * 8 >= num_nodes:
        return torch.sort(torch.randperm(num_nodes, generator=generator)[:rows]).values
    return torch.unique(torch.randint(num_nodes, (rows,), generator=generator))


def _eviction_bytes() -> int:
    """Twice the largest CPU cache (sysfs), at least 64 MiB: writing that much between two gathers leaves
    none of the previous gather's rows cached."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            size = max(size, int(text.rstrip("KMG")) * units.get(text[-1], 1))
        except (OSError, ValueError, IndexError):
            continue
    return min(max(2 * size, 64 << 20), 1 << 30)


class RowsInRam:
    """A stand-in for a FeatureStore whose rows train will hold in RAM (held, or read ahead by the sweep)
    while this process has them memory-mapped: random rows of the same width from an in-RAM
    table of `nbytes` (well past the CPU caches), so the measured gather is RAM's, not the disk's."""

    in_memory = True

    def __init__(self, features: FeatureStore, nbytes: int = 256 << 20):
        row_bytes = features.feat_dim * features.dtype.itemsize
        self.num_nodes = max(1, min(features.num_nodes, nbytes // max(row_bytes, 1)))
        self.feat_dim, self.dtype = features.feat_dim, features.dtype
        self._rows = torch.ones((self.num_nodes, self.feat_dim), dtype=self.dtype)

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self._rows, 0, ids, out=out)


def gather_bandwidth(
    features: FeatureStore | RowsInRam,
    rows: int = 10_000,
    min_run_time: float = 0.2,
    min_gathers: int = 5,
    seed: int = 0,
) -> dict:
    """Random-row gather bandwidth (bytes/s) through FeatureStore.gather, the training path's own gather,
    into one reused output buffer as training's gather ring does: the median of a few gathers, each of
    fresh random rows with the CPU caches emptied first (between two training batches the forward and
    backward passes sweep the caches, so a batch's rows come from memory, or for memory-mapped features
    from the page cache, never from the previous gather). rows: a batch's input rows (capped at the
    graph's size). One untimed gather first: a memory-mapped store faults its pages in then, as an
    epoch's first batches do."""
    rows = max(1, min(int(rows), features.num_nodes))
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty((rows, features.feat_dim), dtype=features.dtype)
    evict = torch.empty(_eviction_bytes() // 4)
    ids = random_rows(features.num_nodes, rows, gen)
    features.gather(ids, out=out[: len(ids)])
    row_bytes = features.feat_dim * features.dtype.itemsize
    # Timed by hand: the eviction between gathers must stay outside the timed region, which
    # torch.utils.benchmark's Timer (one statement, repeated) cannot leave out.
    rates, counts, start = [], [], time.perf_counter()
    while len(rates) < min_gathers or (time.perf_counter() - start < min_run_time and len(rates) < 100):
        ids = random_rows(features.num_nodes, rows, gen)
        evict.fill_(1.0)
        t0 = time.perf_counter()
        features.gather(ids, out=out[: len(ids)])
        rates.append(len(ids) * row_bytes / (time.perf_counter() - t0))
        counts.append(len(ids))
    return {
        "bytes_per_s": sorted(rates)[len(rates) // 2],
        "rows_per_gather": round(sum(counts) / len(counts), 1),
        "row_bytes": row_bytes,
        "gathers": len(rates),
        "feature_cache": "memory" if features.in_memory else "mmap",
    }


def matmul_flops(
    device: torch.device | str,
    shapes: Sequence[tuple[int, int, int]],
    min_run_time: float = 0.1,
    seed: int = 0,
) -> dict:
    """FLOP/s of fp32 dense matmuls [m x k] @ [k x n] on `device`, one per shape (the model's layers:
    cost.projection_shapes), and over all of them together (total FLOPs / total seconds). The operands
    stay in cache between calls, as a layer's weights and inputs do within its matmul."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    per_shape, flops, seconds = [], 0.0, 0.0
    for m, k, n in shapes:
        a = torch.randn((max(m, 1), k), generator=gen).to(device)
        b = torch.randn((k, n), generator=gen).to(device)
        c = torch.empty((max(m, 1), n), device=device)
        s = _median_s(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), min_run_time)
        f = 2.0 * max(m, 1) * k * n
        per_shape.append({"m": max(m, 1), "k": k, "n": n, "flops_per_s": f / s, "seconds": s})
        flops, seconds = flops + f, seconds + s
    return {"flops_per_s": flops / seconds if seconds else 0.0, "device": device.type, "shapes": per_shape}
