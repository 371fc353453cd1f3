"""dist=ddp: two gloo ranks on a tiny graph — accuracy against one process, uneven splits, a lost rank,
compression hooks, local steps, resume, METIS splits, every sampler, torchrun, bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale.dist.split import rank_seeds
from gnnscale.sampling import PRESETS
from gnnscale.stages import train
from tests.conftest import build_graph, compose

DDP = ("dist=ddp", "dist.nproc=2")
COMMON = ("+exp=debug_tiny", "train.diagnostics=false")
# Values a run computes (the rest of a metrics line: times, rates, memory readings).
VOLATILE = ("seeds_per_s", "peak_rss_mb", "peak_gpu_mb")


# Big enough that test accuracy moves in steps of 1/600 and settles near 0.96 within 10 epochs, so
# "within 2 points" compares training, not noise; features alone score far lower (homophily decides).
GRAPH = (
    "data.num_nodes=3000",
    "data.avg_degree=10",
    "data.feat_dim=16",
    "data.num_classes=4",
    "data.feature_signal=0.3",
    "data.homophily=0.9",
    "shard.nodes_per_shard=1000",
)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("ddp"), *GRAPH)


def run(graph, run_dir, *overrides):
    return train.run(compose("train", f"graph_dir={graph}", f"run_dir={run_dir}", *COMMON, *overrides))


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in VOLATILE} for r in rows]


def cli(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gnnscale", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


# ---------------------------------------------------------------- seeds per rank (no processes)
def test_rank_seeds_are_padded_to_equal_counts_from_the_ranks_own_part():
    train_ids = torch.arange(0, 100, 3)  # 34 seeds
    assignment = np.zeros(100, dtype=np.int64)
    assignment[::4] = 1  # rank 1 owns a quarter of the nodes
    shares = [rank_seeds(train_ids, assignment, r, 2) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == max(int((assignment[train_ids] == r).sum()) for r in range(2))
    for r, share in enumerate(shares):
        assert set(share.tolist()) == set(train_ids[assignment[train_ids] == r].tolist())


# ---------------------------------------------------------------- training
def test_ddp_reaches_single_process_accuracy_and_reports_its_communication(graph, tmp_path):
    single = run(graph, tmp_path / "one", "train.epochs=10")
    ddp = run(graph, tmp_path / "two", "train.epochs=10", *DDP)
    assert single["test_acc"] > 0.9
    assert abs(ddp["test_acc"] - single["test_acc"]) <= 0.02
    assert ddp["dist"]["world_size"] == 2
    rows = metrics(tmp_path / "two")
    params = ddp["num_params"]
    for r in rows:  # one fp32 all-reduce of every gradient per step
        assert r["sync_rounds"] == r["steps"]
        assert r["comm_bytes"] == r["comm_bytes_fp32"] == r["steps"] * params * 4
        assert 0.3 < r["halo_frac"] < 0.7  # random split: about half of what a rank samples is the other's
    # each rank ran half the batches one process runs, over all the training seeds between them
    assert rows[0]["steps"] == math.ceil(metrics(tmp_path / "one")[0]["steps"] / 2)


@pytest.mark.parametrize("compression", ["fp16", "bf16", "powersgd"])
def test_compression_hooks_train_and_send_less(graph, tmp_path, compression):
    rank = ("dist.powersgd_rank=4",) if compression == "powersgd" else ()  # 8 would not shrink this model
    out = run(
        graph, tmp_path / compression, "train.epochs=4", *DDP, f"dist.grad_compression={compression}", *rank
    )
    rows = metrics(tmp_path / compression)
    assert out["test_acc"] > 0.85 and rows[-1]["loss"] < rows[0]["loss"]
    sent = sum(r["comm_bytes"] for r in rows)
    full = sum(r["comm_bytes_fp32"] for r in rows)
    if compression == "powersgd":
        # after two plain warm-up steps the 32x16 weights travel as rank-4 factors (the 4x32 ones and the
        # biases gain nothing from it and stay whole)
        assert sent < 0.6 * full
    else:
        assert sent * 2 == full


def test_local_steps_divide_the_all_reduces(graph, tmp_path):
    every = run(graph, tmp_path / "k1", "train.epochs=2", *DDP, "train.batch_size=32")
    local = run(graph, tmp_path / "k3", "train.epochs=2", *DDP, "train.batch_size=32", "dist.local_steps=3")
    a, b = metrics(tmp_path / "k1"), metrics(tmp_path / "k3")
    steps, params = a[0]["steps"], every["num_params"]
    assert steps >= 9
    for r1, r3 in zip(a, b, strict=True):
        # every 3rd step and the epoch's last average the parameters (one all-reduce of all of them)
        assert r1["sync_rounds"] == steps and r3["sync_rounds"] == math.ceil(steps / 3)
        assert (
            r1["comm_bytes"] == steps * params * 4 and r3["comm_bytes"] == math.ceil(steps / 3) * params * 4
        )
    assert local["test_acc"] > 0.85 and abs(local["test_acc"] - every["test_acc"]) <= 0.05


def test_uneven_split_does_not_hang(graph, tmp_path):
    """METIS into 2 parts leaves the ranks unequal training-node counts; both still run as many batches."""
    out = run(graph, tmp_path / "metis", "train.epochs=2", *DDP, "dist.split=metis", "train.batch_size=50")
    assert out["epochs_run"] == 2 and out["test_acc"] > 0.8


def test_metis_split_samples_less_outside_the_rank(graph, tmp_path):
    halo = {}
    for split in ("random", "metis"):
        run(graph, tmp_path / split, "train.epochs=1", *DDP, f"dist.split={split}")
        halo[split] = metrics(tmp_path / split)[0]["halo_frac"]
    assert halo["metis"] < halo["random"] - 0.1


@pytest.mark.parametrize("kind", ["labor", "importance", "random_walk", "cluster_gcn", "saint", "full"])
def test_every_formation_trains_under_ddp(graph, tmp_path, kind):
    preset = PRESETS[kind]
    tiny = {"cluster_gcn": ("sampler.num_parts=30",), "saint": (), "full": ()}.get(
        kind, ("train.batch_size=64",)
    )
    out = train.run(
        compose(
            "train",
            f"graph_dir={graph}",
            f"run_dir={tmp_path / kind}",
            f"+exp={preset}",
            "train.epochs=3",
            "train.diagnostics=false",
            *tiny,
            *DDP,
        )
    )
    rows = metrics(tmp_path / kind)
    assert out["epochs_run"] == 3 and out["dist"]["world_size"] == 2
    assert rows[-1]["loss"] < rows[0]["loss"] and out["test_acc"] > 0.45  # chance is 1/4


# ---------------------------------------------------------------- faults and resume
def _worker_pids(parent: int) -> list[int]:
    """The ranks the launcher in `parent` spawned (multiprocessing spawn children), oldest first."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) if proc.name.isdigit() else 0
            cmd = (proc / "cmdline").read_bytes() if ppid == parent else b""
        except OSError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            pids.append(int(proc.name))
    return sorted(pids)


def test_a_killed_rank_stops_the_job_and_the_rerun_resumes_exactly(graph, tmp_path):
    args = (f"graph_dir={graph}", *COMMON, "train.epochs=30", "train.batch_size=32", *DDP)
    killed = tmp_path / "killed"
    job = cli("train", f"run_dir={killed}", *args)
    metrics_file = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (
        metrics_file.is_file() and len(metrics_file.read_text().splitlines()) >= 2
    ):
        time.sleep(0.2)
    workers = _worker_pids(job.pid)
    assert len(workers) == 2, workers
    victim = workers[-1]
    os.kill(victim, signal.SIGKILL)
    t0 = time.time()
    _, err = job.communicate(timeout=60)
    assert job.returncode not in (0, None) and time.time() - t0 < 60
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank ") and f"(pid {victim}) was killed by SIGKILL" in last
    assert f"resume={killed}" in last

    resumed = cli("train", f"resume={killed}", *args)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    whole = run(graph, tmp_path / "whole", "train.epochs=30", "train.batch_size=32", *DDP)
    assert metrics(killed) == metrics(tmp_path / "whole")
    assert json.loads((killed / "summary.json").read_text())["test_acc"] == whole["test_acc"]


def test_torchrun_starts_the_ranks_itself(graph, tmp_path):
    job = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "gnnscale",
         "train", f"graph_dir={graph}", f"run_dir={tmp_path / 'tr'}", *COMMON, "train.epochs=2", "dist=ddp"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr[-2000:]
    summary = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert summary["dist"]["world_size"] == 2 and summary["epochs_run"] == 2


@pytest.mark.parametrize(
    "bad, says",
    [
        ("dist.split=hash", "dist.split=hash"),
        ("dist.grad_compression=zip", "dist.grad_compression=zip"),
        ("dist.local_steps=0", "dist.local_steps=0"),
    ],
)
def test_bad_dist_settings_exit_2_before_any_rank_starts(graph, tmp_path, bad, says):
    job = cli("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'bad'}", *COMMON, *DDP, bad)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 2
    assert len(err.strip().splitlines()) == 1 and says in err
    assert not (tmp_path / "bad").exists()
