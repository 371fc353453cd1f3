"""`profile.measure`: timed training steps (time split, rates, memory), the physical bounds they are
judged against, the plan's seeds/s prediction from the same micro-measurements, and the batch-size
doubling test.

Timing. Each batch runs serially — sample, gather, host->device transfer, forward (with the loss),
backward, optimizer step — with one perf_counter mark between consecutive parts (on a GPU each mark
first waits for the queued kernels), so the parts cover the batch with nothing untimed inside it. The
step time is measured apart: the wall time of the whole timed loop over its batch count. The parts
must add up to it; what they miss is the loop's bookkeeping between batches (`unaccounted_s`). A train
run with prefetch overlaps its gather with compute; measuring serially is what lets each part be seen.

FLOPs (layer_flops, train_flops). Per layer, each dense projection costs 2 x rows x d_in x d_out on
the rows DGL applies it to (SAGEConv and GraphConv project the source rows before aggregating when that
narrows the features, the destination rows after it otherwise), and the aggregation one add per edge
per feature at the width it runs at. Backward computes the weights' gradients (about the forward's
FLOPs again) and the inputs' (once more), the latter for every layer but the first: the input
features need no gradient. So a step counts 2x the first layer's forward and 3x the others'.

Prediction (predict_seeds_per_s). One step = the probed sampling time + the batch's feature bytes at
the random-gather bandwidth + its training FLOPs at the matmul rate + its elementwise activation
traffic (activation_bytes: the reads and writes of norm, ReLU, dropout, the projections' sum and the
aggregation, forward and backward) at the same memory bandwidth. On a CPU that traffic is most of the
compute time of a GNN step (measured on the 50k-node sage_2hop graph: matmuls ~40% of forward +
backward); on a GPU it runs at device-memory speed and is left out.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gnnscale.errors import DataError
from gnnscale.sampling import build_loader
from gnnscale.sampling.batch import Batch
from gnnscale.tasks import build_task
from gnnscale.training.batches import FeatureBuffers
from gnnscale.training.build import build_samplers
from gnnscale.training.memory_plan import BatchShape
from gnnscale.training.phases import resolve_phases
from gnnscale.training.precision import Precision
from gnnscale.training.schedule import build_optimizer, build_scheduler
from gnnscale.training.seeding import reseed
from gnnscale.utils.atomic import atomic_path
from gnnscale.utils.memory import MemorySampler, Poller

PARTS = ("sample_s", "gather_s", "transfer_s", "forward_s", "backward_s", "step_s")
LOADER_PARTS = PARTS[:3]  # what the data path costs; the rest is compute
# DGL's DataLoader advises CPU affinity on every iteration; gnnscale sizes its threads itself.
_AFFINITY_WARNING = "Dataloader CPU affinity opt is not enabled"


# ---- FLOPs ---------------------------------------------------------------------------------------


def layer_flops(arch: str, aggregator: str, src: int, dst: int, edges: int, d_in: int, d_out: int) -> float:
    """Forward FLOPs of one layer on a block of src -> dst rows with `edges` edges."""

    def mm(rows: int, k: int, n: int) -> float:
        return 2.0 * rows * k * n

    narrows = d_in > d_out  # DGL then projects the source rows first and aggregates the narrow result
    if arch == "mlp":
        return mm(dst, d_in, d_out)
    if arch == "gcn":
        return mm(src, d_in, d_out) + edges * d_out if narrows else edges * d_in + mm(dst, d_in, d_out)
    if aggregator == "pool":  # fc_pool on every source, max over edges, fc_neigh + fc_self on dst
        return mm(src, d_in, d_in) + edges * d_in + 2 * mm(dst, d_in, d_out)
    if aggregator == "lstm":  # an LSTM(d_in, d_in) step per edge: 4 gates x 2 matmuls, + fc_neigh, fc_self
        return edges * 16.0 * d_in * d_in + 2 * mm(dst, d_in, d_out)
    neigh = mm(src, d_in, d_out) + edges * d_out if narrows else edges * d_in + mm(dst, d_in, d_out)
    return neigh + (mm(dst, d_in, d_out) if aggregator == "mean" else dst * d_in)  # gcn: + self row


def forward_flops(arch: str, aggregator: str, dims: Sequence[int], layers: Sequence[tuple]) -> float:
    """layers: (src rows, dst rows, edges) per layer, input layer first; dims: in_dim, hidden..., classes."""
    return sum(_per_layer(layer_flops, arch, aggregator, dims, layers))


def train_flops(arch: str, aggregator: str, dims: Sequence[int], layers: Sequence[tuple]) -> float:
    """Forward + backward: weight gradients for every layer, input gradients for all but the first."""
    per_layer = _per_layer(layer_flops, arch, aggregator, dims, layers)
    return 2 * sum(per_layer) + sum(per_layer[1:])


def _per_layer(fn, arch: str, aggregator: str, dims: Sequence[int], layers: Sequence[tuple]) -> list[float]:
    return [
        fn(arch, aggregator, s, d, e, k, n)
        for (s, d, e), k, n in zip(layers, dims[:-1], dims[1:], strict=True)
    ]


# Passes over a layer's output (dst rows x d_out floats read or written), forward + backward, by the
# elementwise work around its matmuls: counted from each op's reads and writes (a ReLU reads and writes
# once forward, reads two and writes one backward: 5).
COMBINE_PASSES = 6  # the projections' sum and bias, and their gradients
HIDDEN_PASSES = {"norm": 8, "relu": 5, "dropout": 7}  # on every layer but the last


def activation_bytes(
    dims: Sequence[int], layers: Sequence[tuple], norm: str = "none", dropout: float = 0.0, arch: str = "sage"
) -> float:
    """Bytes of elementwise activation traffic in one training step (float32): the passes over each
    layer's output above, and the aggregation's reads of one row per edge (again backward, except on
    the first layer when it aggregates the input features themselves, which need no gradient)."""
    total = 0.0
    last = len(layers) - 1
    for i, ((_, dst, edges), d_in, d_out) in enumerate(zip(layers, dims[:-1], dims[1:], strict=True)):
        passes = COMBINE_PASSES
        if i < last:
            passes += HIDDEN_PASSES["relu"]
            passes += HIDDEN_PASSES["norm"] if norm not in ("none", None, "") else 0
            passes += HIDDEN_PASSES["dropout"] if dropout > 0 else 0
        total += passes * dst * d_out
        if arch != "mlp":
            width = min(d_in, d_out)  # DGL aggregates at the narrower width
            total += edges * width * (2 if i > 0 or d_in > d_out else 1)
    return 4.0 * total


def shape_layers(shape: BatchShape) -> list[tuple[int, int, int]]:
    """(src, dst, edges) per layer of a BatchShape: layer i reads layer i-1's destinations."""
    src = [shape.input_rows, *shape.dst_rows[:-1]]
    return list(zip(src, shape.dst_rows, shape.edges, strict=True))


def projection_shapes(shape: BatchShape, dims: Sequence[int]) -> list[tuple[int, int, int]]:
    """(m, k, n) of each layer's dominant dense projection, for micro.matmul_flops: on the source rows
    when the layer narrows the features (DGL projects before aggregating), on the destinations otherwise."""
    return [
        (s if k > n else d, int(k), int(n))
        for (s, d, _), k, n in zip(shape_layers(shape), dims[:-1], dims[1:], strict=True)
    ]


def measured_shape(measured: dict) -> BatchShape:
    """The mean batch of a measure_steps result, for projection_shapes and the micro-measurements."""
    shape = measured["shape"]
    return BatchShape(
        int(round(shape["input_rows"])),
        tuple(int(round(v)) for v in shape["dst_rows"]),
        tuple(int(round(v)) for v in shape["edges"]),
    )


def batch_layers(b: Batch, num_layers: int) -> list[tuple[int, int, int]]:
    """(src, dst, edges) per layer of a sampled batch (a subgraph formation runs every layer on its subgraph)."""
    if b.blocks is not None:
        return [(s.num_src_nodes(), s.num_dst_nodes(), s.num_edges()) for s in b.blocks]
    n, e = b.subgraph.num_nodes(), b.subgraph.num_edges()
    return [(n, n, e)] * num_layers


def sampled_edges(b: Batch) -> int:
    """Edges the sampler drew for a batch: every block's, or the subgraph's once."""
    return sum(s.num_edges() for s in b.blocks) if b.blocks is not None else b.subgraph.num_edges()


# ---- the plan's side: a timed probe and the prediction ------------------------------------------


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
    batches = _endless(loader)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_AFFINITY_WARNING)
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


def predict_seeds_per_s(
    batch_size: int,
    shape: BatchShape,
    dims: Sequence[int],
    row_bytes: int,
    gather_bytes_per_s: float,
    flops_per_s: float,
    sample_s: float,
    arch: str = "sage",
    aggregator: str = "mean",
    norm: str = "none",
    dropout: float = 0.0,
    device_type: str = "cpu",
) -> dict:
    """Seeds/s before any training (the module's docstring: Prediction). shape: the mean probed batch
    (probe_sampling); dims: the model's in_dim, hidden..., classes; row_bytes: feat_dim x the features'
    itemsize; the two rates: micro.gather_bandwidth and micro.matmul_flops; sample_s: the probe's
    seconds per batch; arch / aggregator / norm / dropout: the model config's."""
    layers = shape_layers(shape)
    gather_bytes = shape.input_rows * row_bytes
    flops = train_flops(arch, aggregator, dims, layers)
    traffic = activation_bytes(dims, layers, norm, dropout, arch) if device_type == "cpu" else 0.0
    parts = {
        "sample_s": float(sample_s),
        "gather_s": gather_bytes / gather_bytes_per_s,
        "matmul_s": flops / flops_per_s,
        "activations_s": traffic / gather_bytes_per_s,
    }
    step = sum(parts.values())
    return {
        "seeds_per_s": batch_size / step,
        "step_s": step,
        "parts_s": parts,
        "gather_bytes_per_batch": gather_bytes,
        "flops_per_batch": flops,
        "activation_bytes_per_batch": traffic,
    }


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


def _endless(loader) -> Iterator[Batch]:
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
    )
    step = _build_step(cfg, data, device, max(len(loader), 1))
    buffers = FeatureBuffers(data.features.feat_dim, data.features.dtype, 0, device.type == "cuda")
    gather = _gatherer(data, buffers)
    batches = _endless(loader)
    num_layers = step.model.num_layers
    arch, aggregator = str(cfg.model.arch), str(cfg.model.aggregator)
    seeds = edges = rows = 0
    flops = forward = 0.0
    layer_sums = np.zeros((num_layers, 3))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with warnings.catch_warnings(), MemorySampler() as memory:
        warnings.filterwarnings("ignore", message=_AFFINITY_WARNING)
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
