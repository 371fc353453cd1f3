"""`profile.measure`: timed training steps (time split, rates, memory), the physical bounds they are
judged against, and the batch-size doubling test.

Timing. Each batch runs serially — sample, gather, host->device transfer, forward (with the loss),
backward, optimizer step — with one perf_counter mark between consecutive parts (on a GPU each mark
first waits for the queued kernels), so the parts cover the batch with nothing untimed inside it. The
step time is measured apart: the wall time of the whole timed loop over its batch count. The parts
must add up to it; what they miss is the loop's bookkeeping between batches (`unaccounted_s`). A train
run with prefetch overlaps its gather with compute; measuring serially is what lets each part be seen.

FLOPs and the seeds/s prediction: profile/cost.py; the plan's timed probe: profile/speed.py.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from gnnscale.profile.cost import batch_layers, forward_flops, sampled_edges, train_flops
from gnnscale.profile.speed import AFFINITY_WARNING, endless
from gnnscale.sampling import build_loader
from gnnscale.sampling.batch import Batch
from gnnscale.tasks import build_task
from gnnscale.training.batches import FeatureBuffers
from gnnscale.training.build import build_samplers, loss_blocks_layers
from gnnscale.training.phases import resolve_phases
from gnnscale.training.precision import Precision
from gnnscale.training.schedule import build_optimizer, build_scheduler
from gnnscale.training.seeding import reseed
from gnnscale.utils.atomic import atomic_path
from gnnscale.utils.memory import MemorySampler, Poller

PARTS = ("sample_s", "gather_s", "transfer_s", "forward_s", "backward_s", "step_s")
LOADER_PARTS = PARTS[:3]  # what the data path costs; the rest is compute


# ---- the measured steps ---------------------------------------------------------------------------


@dataclass
class _Step:
    """The pieces of one training step, built as `gnnscale train` builds them."""

    model: torch.nn.Module
    task: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    precision: Precision
    device: torch.device
    grad_clip: float
    input_dropout: float


def _build_step(cfg, data, device: torch.device, steps_per_epoch: int) -> _Step:
    reseed(int(cfg.seed))
    task = build_task("node", cfg.train, data, device)
    model = task.build_model(cfg.model, data.feat_dim).to(device)
    model.train()
    optimizer = build_optimizer(model.parameters(), cfg.train)
    scheduler = build_scheduler(optimizer, steps_per_epoch, cfg.train)
    precision = Precision(cfg.precision.dtype, device)
    t = cfg.train
    return _Step(
        model, task, optimizer, scheduler, precision, device, float(t.grad_clip), float(t.input_dropout)
    )


class _Laps:
    """Consecutive marks: begin(part) ends the running part and starts the next at the same instant.
    With trace=True each part is also a torch.profiler range, named as in PARTS."""

    def __init__(self, device: torch.device, trace: bool = False):
        self._device = device if device.type == "cuda" else None
        self._trace = trace
        self.totals = dict.fromkeys(PARTS, 0.0)
        self._part: str | None = None
        self._since = 0.0
        self._range = None

    def now(self) -> float:
        if self._device is not None:
            torch.cuda.synchronize(self._device)  # the part's kernels have run, not just been queued
        return time.perf_counter()

    def begin(self, part: str | None) -> None:
        """Start `part` (None: the batch is done)."""
        now = self.now()
        if self._part is not None:
            self.totals[self._part] += now - self._since
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        self._part, self._since = part, now
        if part is not None and self._trace:
            self._range = torch.profiler.record_function(part)
            self._range.__enter__()


def _run_step(s: _Step, batches: Iterator[Batch], gather, laps: _Laps) -> Batch:
    """One training step as training/loop.py runs it, inline (no prefetch), marked part by part."""
    laps.begin("sample_s")
    b = next(batches)
    laps.begin("gather_s")
    gather(b)
    if s.device.type != "cpu":
        laps.begin("transfer_s")
        b = b.to(s.device)
    laps.begin("forward_s")
    x = F.dropout(b.x, s.input_dropout, training=True) if s.input_dropout > 0 else b.x
    with s.precision.autocast():
        out = s.model(b.layers(s.model.num_layers), x)
    loss = s.task.loss(out, b)
    laps.begin("backward_s")
    s.optimizer.zero_grad(set_to_none=True)
    s.precision.scaler.scale(loss).backward()
    laps.begin("step_s")
    if s.grad_clip > 0:
        s.precision.scaler.unscale_(s.optimizer)
        torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.grad_clip)
    s.precision.scaler.step(s.optimizer)
    s.precision.scaler.update()
    s.scheduler.step()
    laps.begin(None)
    return b


def _gatherer(data, buffers: FeatureBuffers):
    """BatchStream's inline gather: the FeatureStore rows into a reused buffer, and the seeds' labels."""

    def gather(b: Batch) -> None:
        x = data.features.gather(b.input_nodes, out=buffers.take(len(b.input_nodes)))
        b.x = x if x.dtype == torch.float32 else x.float()
        b.y = data.labels[b.seeds]

    return gather


class _GpuUtilisation(Poller):
    """Mean GPU busy percent while the steps run, from torch.cuda.utilization() (NVML) polled in a thread:
    NVML only reports its last sample period, so one reading at the end would see the tail alone.
    None off a GPU or without pynvml."""

    def __init__(self, device: torch.device, interval_s: float = 0.05):
        super().__init__(interval_s)
        self.device = device
        self.readings: list[float] = []
        self._unreadable = device.type != "cuda"

    def _sample(self) -> bool:
        if self._unreadable:
            return False
        try:
            self.readings.append(float(torch.cuda.utilization(self.device)))
        except Exception:  # no pynvml, or NVML refuses: no reading rather than a wrong one
            self._unreadable = True
        return not self._unreadable

    @property
    def mean(self) -> float | None:
        return round(sum(self.readings) / len(self.readings), 1) if self.readings else None


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def measure_steps(
    cfg,
    data,
    device: torch.device,
    num_batches: int,
    trace_path: str | Path | None = None,
    batch_size: int | None = None,
    samplers: dict | None = None,
    warmup: int = 2,
    trace_steps: int = 3,
) -> dict:
    """Time `num_batches` training steps after `warmup` untimed ones: the first training phase's sampler
    and batch size (or `batch_size`), the model, loss, optimizer and precision of `cfg`.
    trace_path: afterwards, `trace_steps` more steps under torch.profiler, written there as a Chrome trace."""
    num_batches = max(1, int(num_batches))
    batch_size = int(batch_size or resolve_phases(cfg)[0].batch_size)
    samplers = samplers or build_samplers(cfg, data)
    ids = data.splits["train"]
    stratified = cfg.sampler.get("seed_order", "random") == "stratified"
    loader = build_loader(
        data.g,
        ids,
        samplers["train"][0],
        batch_size,
        shuffle=True,
        num_workers=int(cfg.train.num_workers),
        drop_last=len(ids) >= batch_size,  # every timed batch full, when the split allows one
        seed_labels=data.labels[ids] if stratified else None,
        loss_blocks_layers=loss_blocks_layers(cfg),
    )
    step = _build_step(cfg, data, device, max(len(loader), 1))
    buffers = FeatureBuffers(data.features.feat_dim, data.features.dtype, 0, device.type == "cuda")
    gather = _gatherer(data, buffers)
    batches = endless(loader)
    num_layers = step.model.num_layers
    arch, aggregator = str(cfg.model.arch), str(cfg.model.aggregator)
    seeds = edges = rows = 0
    flops = forward = 0.0
    layer_sums = np.zeros((num_layers, 3))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with warnings.catch_warnings(), MemorySampler() as memory:
        warnings.filterwarnings("ignore", message=AFFINITY_WARNING)
        for _ in range(warmup):
            _run_step(step, batches, gather, _Laps(device))
        laps = _Laps(device)
        with _GpuUtilisation(device) as utilisation:
            start = laps.now()
            for _ in range(num_batches):
                b = _run_step(step, batches, gather, laps)
                # Bookkeeping between batches: outside the parts, inside the wall time (unaccounted_s).
                layers = batch_layers(b, num_layers)
                seeds += step.task.num_scored(b)
                edges += sampled_edges(b)
                rows += len(b.input_nodes)
                forward += forward_flops(arch, aggregator, step.model.dims, layers)
                flops += train_flops(arch, aggregator, step.model.dims, layers)
                layer_sums += np.asarray(layers, dtype=float)
            wall = laps.now() - start
        if trace_path is not None:
            _trace(step, batches, gather, device, Path(trace_path), trace_steps)
    split = {part: laps.totals[part] / num_batches for part in PARTS}
    step_s = wall / num_batches
    row_bytes = data.features.feat_dim * data.features.dtype.itemsize
    means = layer_sums / num_batches
    return {
        "batch_size": batch_size,
        "batches": num_batches,
        "warmup_batches": warmup,
        "device": device.type,
        "precision": step.precision.name,
        "feature_cache": data.feature_cache,
        "step_s": step_s,
        "split_s": split,  # per batch, PARTS in order
        "parts_sum_s": sum(split.values()),
        "unaccounted_s": step_s - sum(split.values()),
        "seeds_per_batch": seeds / num_batches,
        "seeds_per_s": seeds / wall,
        "edges_per_batch": edges / num_batches,
        "edges_per_s": edges / wall,
        "input_rows_per_batch": rows / num_batches,
        "gather_bytes_per_batch": rows / num_batches * row_bytes,
        "forward_flops_per_batch": forward / num_batches,
        "flops_per_batch": flops / num_batches,  # forward + backward
        # The mean batch, per layer input first: what the plan's prediction reads from a probe.
        "shape": {
            "input_rows": rows / num_batches,
            "dst_rows": [round(v, 1) for v in means[:, 1]],
            "edges": [round(v, 1) for v in means[:, 2]],
        },
        "dims": list(step.model.dims),
        "peak_rss_mb": _mb(memory.peak_rss_mb),
        "peak_anon_mb": _mb(memory.peak_anon_mb),
        "gpu_peak_allocated_mb": _mb(torch.cuda.max_memory_allocated(device) / 2**20)
        if device.type == "cuda"
        else None,
        "gpu_peak_reserved_mb": _mb(torch.cuda.max_memory_reserved(device) / 2**20)
        if device.type == "cuda"
        else None,
        "gpu_utilization_pct": utilisation.mean,
        "trace_path": None if trace_path is None else str(trace_path),
        # Other work on the machine slows every part at once: read this before trusting a comparison.
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "num_threads": torch.get_num_threads(),
    }


def _trace(step: _Step, batches, gather, device: torch.device, path: Path, steps: int) -> None:
    """A few more steps under torch.profiler, each part a named range, exported as a Chrome trace (after
    the timed loop: the profiler's overhead would otherwise be in the measured times)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(max(1, steps)):
            _run_step(step, batches, gather, _Laps(device, trace=True))
    with atomic_path(path) as tmp:
        prof.export_chrome_trace(str(tmp))


# ---- judging the measurement ----------------------------------------------------------------------


def _rate(value, key: str) -> float:
    """A micro-measurement's rate: its dict (micro.gather_bandwidth / matmul_flops) or the number itself."""
    return float(value[key]) if isinstance(value, dict) else float(value)


_BOUND_WHAT = {"gather": "bytes at the random-row gather bandwidth", "compute": "FLOPs at the matmul rate"}


def bounds(measured: dict, gather_bw, flops) -> dict:
    """The run against two physical bounds: its bytes gathered per batch at the measured random-gather
    bandwidth, and its FLOPs per batch at the measured matmul rate. Each bound is a time per batch the
    step cannot beat (a ceiling on seeds/s); the run sits closest to the one it is the smallest multiple
    of, which is the one with the longer time."""
    step_s, seeds = float(measured["step_s"]), float(measured["seeds_per_batch"])
    times = {
        "gather": float(measured["gather_bytes_per_batch"]) / _rate(gather_bw, "bytes_per_s"),
        "compute": float(measured["flops_per_batch"]) / _rate(flops, "flops_per_s"),
    }
    out = {
        name: {
            "s_per_batch": t,
            "max_seeds_per_s": seeds / t if t > 0 else float("inf"),
            "measured_multiple": step_s / t if t > 0 else float("inf"),
        }
        for name, t in times.items()
    }
    closest = max(times, key=times.get)
    other = "gather" if closest == "compute" else "compute"
    split = measured.get("split_s") or {}
    if split:  # each bound against the measured parts it models
        compute_s = sum(v for p, v in split.items() if p not in LOADER_PARTS)
        for name, part_s in (("gather", split["gather_s"]), ("compute", compute_s)):
            out[name]["part_multiple"] = part_s / times[name] if times[name] > 0 else float("inf")
    sentence = (
        f"the step takes {out[closest]['measured_multiple']:.1f}x the {closest} bound ({_BOUND_WHAT[closest]}) "
        f"and {out[other]['measured_multiple']:.1f}x the {other} bound: it sits closest to the {closest} bound"
    )
    if split:
        unbounded = split["sample_s"] + split["transfer_s"]
        sentence += (
            f"; the gather itself runs at {out['gather']['part_multiple']:.1f}x its bound, forward + backward + "
            f"step at {out['compute']['part_multiple']:.1f}x the compute bound, and sampling"
            f"{' + transfer' if split['transfer_s'] else ''}, which neither bound counts, is "
            f"{unbounded / step_s:.0%} of the step"
        )
    return {**out, "closest": closest, "summary": sentence}


def doubling_test(
    cfg,
    data,
    device: torch.device,
    num_batches: int,
    samplers: dict | None = None,
    at_b: dict | None = None,
) -> dict:
    """Measure at the batch size B and at 2B (at_b: a measure_steps result at B already taken) and read
    the throughput ratio: close to 2 means fixed per-batch costs bound the run (the device has headroom
    for larger batches); close to 1 means per-seed work does, the loader's or the compute's."""
    samplers = samplers or build_samplers(cfg, data)
    b = int(at_b["batch_size"]) if at_b else int(resolve_phases(cfg)[0].batch_size)
    base = at_b or measure_steps(cfg, data, device, num_batches, batch_size=b, samplers=samplers)
    double = measure_steps(cfg, data, device, num_batches, batch_size=2 * b, samplers=samplers)
    ratio = double["seeds_per_s"] / base["seeds_per_s"]
    loader_s = sum(double["split_s"][p] for p in LOADER_PARTS)
    compute_s = sum(v for p, v in double["split_s"].items() if p not in LOADER_PARTS)
    larger = "loader" if loader_s >= compute_s else "compute"
    what = f"the {_PART_GROUPS[larger]}, {max(loader_s, compute_s) / double['step_s']:.0%} of the step"
    kind = _bound_by(ratio)
    verdict = (
        f"throughput x{ratio:.2f} at batch {2 * b}: "
        + {
            "unreliable": "more than doubling the batch can explain, so the two measurements saw different "
            "conditions (other work on this machine?); rerun on an idle machine",
            "per-batch": "roughly doubles, so fixed per-batch costs bound the run and the device has headroom; "
            "a larger train.batch_size raises seeds/s",
            "per-seed": f"flat, so per-seed work bounds the run; the larger part is {what}",
            "mixed": f"partly fixed per-batch costs, partly per-seed work (mostly {what})",
        }[kind]
    )
    return {
        "batch_size": b,
        "seeds_per_s": base["seeds_per_s"],
        "step_s": base["step_s"],
        "batch_size_2x": 2 * b,
        "seeds_per_s_2x": double["seeds_per_s"],
        "step_s_2x": double["step_s"],
        "seeds_per_batch_2x": double["seeds_per_batch"],
        "ratio": ratio,
        "bound_by": kind,
        "larger_part_2x": larger,
        "verdict": verdict,
    }


_PART_GROUPS = {
    "loader": "loader (sample + gather + transfer)",
    "compute": "compute (forward + backward + step)",
}


def _bound_by(ratio: float) -> str:
    """What a 2B / B throughput ratio says. Step time F + B x c gives a ratio in (1, 2]; well outside
    that, the two runs were disturbed differently."""
    if not 0.7 <= ratio <= 2.5:
        return "unreliable"
    return "per-batch" if ratio >= 1.7 else ("per-seed" if ratio <= 1.25 else "mixed")
