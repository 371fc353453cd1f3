"""A graph whose features are larger than the memory cgroup it trains in (issue 26's acceptance test):
`gnnscale train` with the defaults (train.feature_cache=auto, train.memory_budget=auto) reads the cgroup
limit, finds the features do not fit, reads them from disk a superbatch ahead, and trains exactly as the
uncapped run that holds them in RAM: the same metrics lines and bit-equal checkpoints.

Both runs are fresh `gnnscale train` processes with the same seed; the capped one is moved into a memory
cgroup this test makes (cgroup v1 memory.limit_in_bytes, else v2 memory.max) before it execs, after the
graph's files are dropped from the page cache. Without root or a writable memory controller it skips and
says why. The cap comes from the uncapped run's own memory plan (what this machine's process needs beside
the features), so it is below the feature matrix yet leaves the read plan room, whatever the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale.training.memory_plan import READ_BUFFERS
from gnnscale.utils.memlimit import AUTO_FRACTION
from tests.cgroups import MemoryCgroup
from tests.conftest import build_graph

CLI = [sys.executable, "-c", "from gnnscale.cli import main; main()"]
MiB = 2**20

# 1,000,000 nodes x 256 float32 features = 1.02 GB of features (0.95 GiB); 5M directed edges, whose int32
# CSC is 27 MB. A small train split (8k seeds: 8 batches) keeps the runs short; the graph builds in ~25 s.
NUM_NODES, FEAT_DIM = 1_000_000, 256
FEATURE_BYTES = NUM_NODES * FEAT_DIM * 4
GRAPH = (
    f"data.num_nodes={NUM_NODES}",
    f"data.feat_dim={FEAT_DIM}",
    "data.avg_degree=5",
    "data.split_fractions=[0.008,0.002,0.002]",
    "shard.nodes_per_shard=250000",
)
# Two epochs (the second reuses the staging buffers), small fanouts, seed pinned. Evaluation batches are
# left at auto: the training batch size in both runs, so val_acc / test_acc must agree as well.
TRAIN = (
    "+exp=sage_2hop",
    "train.epochs=2",
    "sampler.fanouts=[5,5]",
    "seed=0",
)
# Room the capped run gets beyond its leanest read plan, for the staging buffers (the plan gives them 90%).
STAGING_ROOM = 128 * MiB
TIMING = ("_s", "_per_s", "_mb")  # metrics.jsonl fields that time or measure the run, not train it


def _evict(graph: Path) -> None:
    """The graph's pages out of the page cache (written back first: dirty pages are not dropped), so the
    capped run reads them from disk and the page cache charged to this process does not decide anything."""
    for f in graph.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _train(graph: Path, run_dir: Path, preexec_fn=None) -> dict:
    r = subprocess.run(
        [*CLI, "train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN],
        capture_output=True, text=True, timeout=600, preexec_fn=preexec_fn,
    )  # fmt: skip
    out = {"rc": r.returncode, "said": " ".join((r.stdout + r.stderr).split()), "stderr": r.stderr[-3000:]}
    if r.returncode == 0:
        out["summary"] = json.loads((run_dir / "summary.json").read_text())
        out["metrics"] = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        out["checkpoints"] = {
            name: torch.load(run_dir / "checkpoints" / name, weights_only=True)
            for name in ("last.pt", "best.pt")
        }
    return out


def _infer(graph: Path, trained: Path, run_dir: Path, preexec_fn=None) -> dict:
    r = subprocess.run(
        [*CLI, "infer", f"ckpt={trained}", f"graph_dir={graph}", f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=600, preexec_fn=preexec_fn,
    )  # fmt: skip
    out = {"rc": r.returncode, "said": " ".join((r.stdout + r.stderr).split()), "stderr": r.stderr[-3000:]}
    if r.returncode == 0:
        out["summary"] = json.loads((run_dir / "summary.json").read_text())
        out["outputs"] = [np.load(run_dir / f) for f in ("embeddings.npy", "predictions.npy")]
    return out


# ---------------------------------------------------------------- the two runs, once per module
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cg = MemoryCgroup()
    if cg.path is None:
        pytest.skip(f"cannot make a memory cgroup here: {cg.why_not}")
    try:
        tmp = tmp_path_factory.mktemp("outofcore")
        graph = build_graph(tmp, *GRAPH)
        free = _train(graph, tmp / "uncapped")
        assert free["rc"] == 0, free["stderr"]
        plan = free["summary"]["memory_plan"]
        assert plan["feature_cache"] == "memory", plan  # uncapped, the features are held in RAM
        # What the run needs beside the feature matrix, as this machine's uncapped process measured it, plus
        # the read plan's own buffers and some staging room: the budget (90% of the cap) fits a read plan,
        # and the cap is still smaller than the features alone.
        beside = (plan["must_fit_mb"] - plan["parts_mb"]["features in RAM"]) * MiB
        cap = int((beside + READ_BUFFERS + STAGING_ROOM) / AUTO_FRACTION) // 4096 * 4096
        assert cap < FEATURE_BYTES, (
            f"this machine's process needs {beside / 1e6:.0f} MB beside the features: a cap of {cap / 1e6:.0f} MB "
            f"that fits it is not below the {FEATURE_BYTES / 1e6:.0f} MB of features; grow NUM_NODES"
        )
        cg.limit(cap)
        _evict(graph)
        capped = _train(graph, tmp / "capped", preexec_fn=cg.join)
        capped["cap"] = cap
        capped["peak_bytes"] = cg.read("memory.max_usage_in_bytes", "memory.peak")
        capped["failcnt"] = cg.read("memory.failcnt")
        # the uncapped run's model, inferred for every node with and without the cap
        free["infer"] = _infer(graph, tmp / "uncapped", tmp / "infer_uncapped")
        _evict(graph)
        capped["infer"] = _infer(graph, tmp / "uncapped", tmp / "infer_capped", preexec_fn=cg.join)
        yield free, capped
    finally:
        cg.remove()


def test_capped_run_reads_the_features_ahead_within_its_cgroup(runs):
    free, capped = runs
    cap = capped["cap"]
    print(
        f"\ncap {cap / 1e6:.0f} MB for {FEATURE_BYTES / 1e6:.0f} MB of features; cgroup peak "
        f"{(capped['peak_bytes'] or 0) / 1e6:.0f} MB, failcnt {capped['failcnt']}; uncapped peak anon "
        f"{free['summary']['peak_anon_mb']} MiB"
    )
    assert capped["rc"] == 0, (capped["rc"], capped["stderr"])  # not killed (137 / -9), not refused (2)
    s = capped["summary"]
    plan = s["memory_plan"]
    assert "features read from disk ahead of the model" in capped["said"]
    assert s["feature_cache"] == plan["feature_cache"] == "read" and plan["structure"] == "memory"
    assert free["summary"]["feature_cache"] == "memory" and "feature_reads" not in free["summary"]
    assert "cgroup" in plan["budget"], plan["budget"]  # auto read the cap, not the machine's free memory
    assert plan["budget_mb"] * MiB <= cap * AUTO_FRACTION + MiB
    reads = s["feature_reads"]
    assert reads["rows_read"] > 0 and reads["batches"] > 0, reads
    # The heap stays within the budget the plan made from the cap.
    assert 0 < s["peak_anon_mb"] <= plan["budget_mb"], (s["peak_anon_mb"], plan)


def test_capped_run_has_the_uncapped_runs_metrics(runs):
    free, capped = runs
    assert capped["rc"] == 0, capped["stderr"]

    def trained(lines):
        return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in lines]

    assert len(free["metrics"]) == 2  # one line per epoch
    assert trained(capped["metrics"]) == trained(free["metrics"])
    for key in ("test_acc", "test_loss", "val_acc", "best_val_acc", "best_epoch", "epochs_run"):
        assert capped["summary"][key] == free["summary"][key], key


def _leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}/{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def test_capped_run_checkpoints_are_bit_equal(runs):
    free, capped = runs
    assert capped["rc"] == 0, capped["stderr"]
    for name in ("last.pt", "best.pt"):
        a, b = dict(_leaves(free["checkpoints"][name])), dict(_leaves(capped["checkpoints"][name]))
        assert a.keys() == b.keys(), name
        tensors = [k for k, v in a.items() if isinstance(v, torch.Tensor)]
        assert {k.split("/")[1] for k in tensors} >= {"model", "optimizer"}, tensors
        # Every tensor (weights, batch-norm statistics, Adam's moments, RNG states) bit for bit ...
        unequal = [k for k in tensors if not (b[k].dtype == a[k].dtype and torch.equal(a[k], b[k]))]
        assert not unequal, (name, unequal)
        # ... and the training state beside them.
        state = [k for k in a if k.startswith(("/epoch", "/best_", "/stopped", "/rng", "/scheduler"))]
        assert state and all(a[k] == b[k] for k in state if k not in tensors), name


def test_capped_layerwise_inference_streams_its_input_and_equals_the_uncapped_run(runs):
    free, capped = runs
    a, b = free["infer"], capped["infer"]
    assert a["rc"] == 0, a["stderr"]
    assert b["rc"] == 0, (b["rc"], b["stderr"])  # not killed by the cap
    # uncapped: every layer held in memory, the first read in place, the second from its projections
    assert a["summary"]["storage"]["layers"] == "memory"
    assert [x["sources"] for x in a["summary"]["layers"]] == ["in place", "projected"]
    # capped: the features (larger than the cap) streamed by destination tiles
    assert b["summary"]["storage"]["layers"] == "disk" and "cgroup" in b["summary"]["storage"]["why"]
    assert b["summary"]["layers"][0]["sources"].startswith("streamed: ")
    assert "layer 1 reads its input from disk, streamed: " in b["said"]
    for x, y in zip(a["outputs"], b["outputs"], strict=True):
        assert x.shape == y.shape and np.array_equal(x, y)
