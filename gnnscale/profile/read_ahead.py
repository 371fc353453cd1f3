"""Seeds/s of a run whose features are read from disk by the sweep (feature_cache=read), predicted from
the disk's measured rates, before any training.

The training side (training/sweep.py) sweeps the feature file round and round, reading in each chunk the
rows of the batches in flight; a batch joins, is handed its rows as the sweep passes them, and computes
one pass later. Where the union of the batches in flight is dense (training.sweep.reads_dense) a pass
reads every chunk whole: the whole feature file in requests of 4 MiB; else what the reader's plan of the
union covers. Either at the disk's rate of coalesced reads, or by its requests at the 64 KiB random rate
with 16 in flight, whichever is slower (storage/disk_probe.py measures both once per graph_dir). With K batches in flight
(as many as the rows read ahead hold, each row held once: the most K whose union times HELD_PER_UNION fits,
up to the plan's most), one pass serves K batches:

    per batch = read(union of K batches) / K + step

The reads are not counted as overlapping the model's compute: on 2 cores they do not. The sweep's own
work (planning chunks, copying rows into its pool) takes a core from the model's two threads, which
then wait on each other (one busy Python process beside an uncapped run made it 2.2x slower).
max(read / K, step) predicted 1.3-1.7x the measured speed on the bench graphs (6 rounds); the sum
predicts 0.79-0.92x (5M nodes) and 0.83-1.19x (2M) in bench/results/outofcore*.json.

Where the batches' first layer is summed as the file is read (training/sum_sweep.py, the plan's
sums_bytes), a pass reads the whole file in its chunks and serves a cohort of K batches (as many as two
cohorts fit sums_bytes); it runs in a thread while the cohort before computes. Its adds cost
ADD_S_PER_EDGE per first-layer edge, taken from the model's cores:

    per batch = max((read(file) + K x adds) / K, step + adds / threads)

`step` is the time of one batch with its features in RAM: profile's own prediction (profile/speed.py),
or the measured step with profile.measure=true. The batches are drawn by the configured sampler in a
fixed order; the hot-feature cache is left out (its rows would shorten every read). The pass that fills
the pipeline at the start of each epoch is left out too (one pass per epoch: small for a long epoch).
"""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.storage.disk_probe import probe_disk
from gnnscale.storage.feature_reader import FeatureReader
from gnnscale.training import sum_sweep
from gnnscale.training.sweep import CHUNK_BYTES, reads_dense

PROBE_SEED = 0
# The most rows the sweep's pool holds for K batches in flight, per row of their union: batches joining
# evenly hold half their rows on average, and the peak is above it. Replaying 80 sampled batches of the
# 5M-node bench graph through the sweep's schedule: 0.59-0.60 of the union at 10, 20 and 30 in flight; the
# training runs held 1.0-1.3M rows at 17-20 in flight (0.6 x union 1.7-2.0M).
HELD_PER_UNION = 0.6
RANDOM_REQUEST = 64 << 10  # the probe's random-read size (its rand64k_mb_s_qd16)
# CPU seconds a pass of the first-layer sums spends per first-layer edge (an index_select and index_add_ of
# its row): feature_reads.cpu_s per batch over blocks[0]'s edges in bench/results/outofcore*.json, 0.41 us
# (5M nodes, 128 features, 165k edges a batch) and 0.44 us (1M nodes, 256 features, 84k edges): the random
# row accesses cost, not the row's width.
ADD_S_PER_EDGE = 0.42e-6
DISK_KEYS = ("seq_mb_s", "sweep_mb_s_qd16", "rand4k_iops_qd1", "rand4k_iops_qd16", "rand64k_mb_s_qd16",
             "direct", "cached", "small")  # fmt: skip


def read_seconds(plan: dict, disk: dict) -> tuple[float, str]:
    """Time to read a FeatureReader.plan at the disk's rates, and which rate bounds it: its bytes at the
    rate of the reader's own dense pattern (4 MiB requests, 16 in flight; the one-at-a-time sequential
    rate from a probe that lacks it), its requests at the 64 KiB random rate."""
    by_bytes = plan["bytes"] / (disk.get("sweep_mb_s_qd16", disk["seq_mb_s"]) * 1e6)
    iops = disk["rand64k_mb_s_qd16"] * 1e6 / RANDOM_REQUEST
    by_requests = plan["requests"] / max(iops, 1e-9)
    return (by_bytes, "disk bandwidth") if by_bytes >= by_requests else (by_requests, "disk IOPS")


def _whole_file(reader: FeatureReader, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """What a pass of a sweep reading its chunks whole reads (FeatureReader.read_span of every span)."""
    spans = np.diff(reader.spans(max(1, chunk_bytes // reader.row_bytes))) * reader.row_bytes
    return {
        "requests": int(np.ceil(spans / reader.max_request_bytes).sum()),
        "bytes": int(spans.sum()),
        "rows": reader.num_nodes,
        "useful_bytes": int(spans.sum()),
    }


def union_growth(g, ids: torch.Tensor, sampler, batch_size: int, cap_rows: int, max_batches: int) -> list:
    """Input-node id arrays of consecutive batches (a fixed random order of `ids`) until their union
    passes cap_rows or max_batches are drawn."""
    order = torch.from_numpy(np.random.default_rng(PROBE_SEED).permutation(len(ids)))
    mark = np.zeros(g.num_nodes(), dtype=bool)
    batches, union = [], 0
    for j in range(max_batches):
        seeds = ids[order[j * batch_size : (j + 1) * batch_size]]
        if len(seeds) == 0:
            break
        input_nodes = sampler.sample_blocks(g, seeds)[0].numpy()
        union += int((~mark[input_nodes]).sum())
        mark[input_nodes] = True
        batches.append((input_nodes, union))
        if union > cap_rows:
            break
    return batches


def predict_read_ahead(data, sampler, memory_plan: dict, batch_size: int, step_s: float) -> dict | None:
    """The prediction (see the module doc) for a plan that reads features ahead; None for any other."""
    if memory_plan.get("feature_cache") == "read" and memory_plan.get("sums_bytes"):
        return _predict_sums(data, sampler, int(memory_plan["sums_bytes"]), batch_size, step_s)
    if memory_plan.get("feature_cache") != "read" or not memory_plan.get("stage_rows"):
        return None
    max_batches = int(memory_plan["stage_batches"])
    rows = int(memory_plan["stage_rows"]) - int(memory_plan.get("stage_reserve", 0))  # the sweep's cap
    disk = probe_disk(data.graph.path)
    drawn = union_growth(data.g, data.splits["train"], sampler, batch_size, data.g.num_nodes(), max_batches)
    k = max(1, sum(1 for _, union in drawn if HELD_PER_UNION * union <= rows))
    union = torch.from_numpy(np.unique(np.concatenate([b for b, _ in drawn[:k]])))
    with FeatureReader(data.graph) as reader:
        if reads_dense(reader.num_nodes, reader.row_bytes, rows, reader.gap_bytes):
            plan = _whole_file(reader)
        else:
            plan = reader.plan(union)
    read_s, bound = read_seconds(plan, disk)
    per_batch = read_s / k + step_s
    return _prediction(
        batch_size=batch_size, per_batch=per_batch, bound=bound if read_s / k > step_s else "compute",
        step_s=step_s, k=k, plan=plan, read_s=read_s, disk=disk,
        what=(
            "one pass of the sweep reads the union of the batches in flight (every chunk whole where that "
            "union is dense) at the disk's measured rates and serves them all; per batch pass / K + step "
            "(not overlapped: on 2 cores the sweep takes the model's cores), step = one batch with its "
            "features in RAM"
        ),
        pass_rows=len(union),
    )  # fmt: skip


def _predict_sums(data, sampler, sums_bytes: int, batch_size: int, step_s: float) -> dict:
    """The prediction for batches whose first layer is summed as the file is read (see the module doc)."""
    ids = data.splits["train"]
    order = torch.from_numpy(np.random.default_rng(PROBE_SEED).permutation(len(ids)))
    input_nodes, _, blocks = sampler.sample_blocks(data.g, ids[order[:batch_size]])
    disk = probe_disk(data.graph.path)
    with FeatureReader(data.graph) as reader:
        plan = _whole_file(reader, sum_sweep.CHUNK_BYTES)
    per = sum_sweep.shape_bytes(
        blocks[0].num_dst_nodes(),
        [b.num_edges() for b in blocks],
        [b.num_dst_nodes() for b in blocks],
        len(input_nodes),
        data.features.stored_dim,
    )
    k = sum_sweep.batches_a_pass(sums_bytes, per)
    read_s, bound = read_seconds(plan, disk)
    adds_s = blocks[0].num_edges() * ADD_S_PER_EDGE
    pass_s = read_s + k * adds_s
    compute_s = step_s + adds_s / max(torch.get_num_threads(), 1)
    per_batch = max(pass_s / k, compute_s)
    return _prediction(
        batch_size=batch_size, per_batch=per_batch, bound=bound if pass_s / k > compute_s else "compute",
        step_s=step_s, k=k, plan=plan, read_s=read_s, disk=disk,
        what=(
            "first-layer sums: a pass reads the whole feature file at the disk's measured rate and adds it "
            "into a cohort of K batches' sums while the cohort before computes; per batch max((read + K x "
            "adds) / K, step + adds / threads), adds = first-layer edges x ADD_S_PER_EDGE, step = one batch "
            "with its features in RAM"
        ),
        adds_s_per_batch=round(adds_s, 4),
    )  # fmt: skip


def _prediction(*, batch_size, per_batch, bound, step_s, k, plan, read_s, disk, what, **extra) -> dict:
    """The prediction's fields: seeds/s and its bound, the pass and what it reads, the disk's rates."""
    return {
        "seeds_per_s": round(batch_size / per_batch, 2),
        "bound": bound,
        "in_ram_step_s": round(step_s, 4),
        "batches_in_flight": k,
        "pass_bytes": int(plan["bytes"]),
        "pass_requests": int(plan["requests"]),
        "pass_read_s": round(read_s, 3),
        "batch_s": round(per_batch, 4),
        "read_bytes_per_batch": int(plan["bytes"] / k),
        "disk": {key: disk.get(key) for key in DISK_KEYS},
        **extra,
        "what": what,
    }
