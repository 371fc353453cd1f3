"""Seeds/s of a run whose features are read from disk a superbatch ahead (feature_cache=read), predicted
from the disk's measured rates, before any training.

A superbatch's rows are spread over the whole feature file, so its read costs what the reader's plan of
their sorted union costs: its bytes at the disk's sequential rate, or its requests at the 64 KiB random
rate with 16 in flight, whichever is slower (storage/disk_probe.py measures both once per graph_dir).
The training side (training/staging.py) either reads the next superbatch into the free half of its
staging region while the current one computes, or, when the disk is the bound, takes the whole region
for a superbatch twice as long and waits for its read. Per batch:

    halves   max(read(K_half) / K_half, step)     K_half: batches whose union fits a half
    whole    read(K_whole) / K_whole + step       K_whole: ... the whole region

and the run gets the faster of the two (what the stager's switch aims for). `step` is the time of one
batch with its features in RAM: profile's own prediction (profile/speed.py), or the measured step with
profile.measure=true. The unions come from batches drawn by the configured sampler in a fixed order;
the hot-feature cache is left out (its rows would shorten every read).
"""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.storage.disk_probe import probe_disk
from gnnscale.storage.feature_reader import FeatureReader

PROBE_SEED = 0
RANDOM_REQUEST = 64 << 10  # the probe's random-read size (its rand64k_mb_s_qd16)


def read_seconds(plan: dict, disk: dict) -> tuple[float, str]:
    """Time to read a FeatureReader.plan at the disk's rates, and which rate bounds it: its bytes at the
    rate of the reader's own dense pattern (4 MiB requests, 16 in flight; the one-at-a-time sequential
    rate from a probe that lacks it), its requests at the 64 KiB random rate."""
    by_bytes = plan["bytes"] / (disk.get("sweep_mb_s_qd16", disk["seq_mb_s"]) * 1e6)
    iops = disk["rand64k_mb_s_qd16"] * 1e6 / RANDOM_REQUEST
    by_requests = plan["requests"] / max(iops, 1e-9)
    return (by_bytes, "disk bandwidth") if by_bytes >= by_requests else (by_requests, "disk IOPS")


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


def _superbatch(batches: list, cap_rows: int) -> tuple[int, torch.Tensor]:
    """How many leading batches fit cap_rows (at least one) and their sorted union."""
    k = max(1, sum(1 for _, union in batches if union <= cap_rows))
    return k, torch.from_numpy(np.unique(np.concatenate([b for b, _ in batches[:k]])))


def predict_read_ahead(data, sampler, memory_plan: dict, batch_size: int, step_s: float) -> dict | None:
    """The prediction (see the module doc) for a plan that reads features ahead; None for any other."""
    if memory_plan.get("feature_cache") != "read" or not memory_plan.get("stage_rows"):
        return None
    rows, max_batches = int(memory_plan["stage_rows"]), int(memory_plan["stage_batches"])
    halves = bool(memory_plan.get("stage_overlap", True))
    disk = probe_disk(data.graph.path)
    region = 2 * rows if halves else rows
    batches = union_growth(data.g, data.splits["train"], sampler, batch_size, region, max_batches)
    modes = {}
    with FeatureReader(data.graph) as reader:
        for mode, cap in (("halves", rows), ("whole", region)) if halves else (("whole", region),):
            k, union = _superbatch(batches, cap)
            plan = reader.plan(union)
            read_s, bound = read_seconds(plan, disk)
            per_batch = max(read_s / k, step_s) if mode == "halves" else read_s / k + step_s
            modes[mode] = {
                "batches": k,
                "union_rows": len(union),
                "read_bytes": int(plan["bytes"]),
                "requests": int(plan["requests"]),
                "read_s": round(read_s, 3),
                "batch_s": round(per_batch, 4),
                "bound": bound if read_s / k > step_s else "compute",
            }
    best = min(modes, key=lambda m: modes[m]["batch_s"])
    chosen = modes[best]
    return {
        "seeds_per_s": round(batch_size / chosen["batch_s"], 2),
        "mode": best,
        "bound": chosen["bound"],
        "in_ram_step_s": round(step_s, 4),
        "read_bytes_per_batch": int(chosen["read_bytes"] / chosen["batches"]),
        "modes": modes,
        "disk": {
            k: disk.get(k)
            for k in (
                "seq_mb_s",
                "rand4k_iops_qd1",
                "rand4k_iops_qd16",
                "rand64k_mb_s_qd16",
                "direct",
                "cached",
                "small",
            )
        },  # fmt: skip
        "what": (
            "a superbatch's rows read at the disk's measured rates (sorted, coalesced, 16 in flight), "
            "per batch max(read / K, step) with two halves or read / K + step with the whole region, "
            "the faster; step = one batch with its features in RAM"
        ),
    }
