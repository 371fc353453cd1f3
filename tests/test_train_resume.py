"""Kill-and-resume equals the uninterrupted run; a checkpoint from another model config is refused."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnscale.errors import ConfigError
from gnnscale.stages import train
from tests.conftest import TINY_SYNTHETIC, build_graph, compose

EPOCHS = 5
# Warmup + cosine: the schedule depends on the total epochs, so a resumed run must not restart it.
COMMON = (
    "+exp=debug_tiny",
    f"train.epochs={EPOCHS}",
    "train.warmup_epochs=1",
    "train.eval_every=2",
    "model.dropout=0.5",
)


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("tiny"), *TINY_SYNTHETIC)


def metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.endswith("_s") and k not in ("seeds_per_s", "peak_rss_mb")}
        for r in rows
    ]


def optimizer_steps(run_dir) -> list[int]:
    """Adam's per-parameter step counts in last.pt: how many updates the weights have had, all runs together."""
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["optimizer"]["state"]
    assert state, "the checkpoint holds no optimizer state"
    return sorted({int(s["step"]) for s in state.values()})


def steps_per_epoch(graph) -> int:
    """Counted from the graph, not from the code under test: train nodes over debug_tiny's batch of 64."""
    return math.ceil(json.loads((graph / "meta.json").read_text())["splits"]["train"] / 64)


def kill_after_3(epoch):
    if epoch == 3:
        raise Killed  # after last.pt for epoch 3 was written, as a crash would leave it


def assert_same_run(full_dir, other_dir, graph):
    a = torch.load(full_dir / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(other_dir / "checkpoints" / "last.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == EPOCHS
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert metrics(full_dir) == metrics(other_dir)
    # No extra training: each epoch logged once, and exactly EPOCHS epochs' worth of optimizer steps.
    assert [r["epoch"] for r in metrics(other_dir)] == list(range(1, EPOCHS + 1))
    assert optimizer_steps(full_dir) == optimizer_steps(other_dir) == [EPOCHS * steps_per_epoch(graph)]


def test_killed_then_resumed_equals_uninterrupted(tmp_path, graph):
    full = train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'full'}", *COMMON))

    with pytest.raises(Killed):
        train.run(
            compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'cut'}", *COMMON),
            on_epoch_end=kill_after_3,
        )
    assert torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 3
    # A killed epoch 4 may have logged its metrics line before dying: resume drops it.
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"epoch": 4, "loss": 123.0}) + "\n")

    resumed = train.run(compose("train", f"graph_dir={graph}", f"resume={tmp_path / 'cut'}", *COMMON))
    assert resumed["resumed_from_epoch"] == 3
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == EPOCHS
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert metrics(tmp_path / "full") == metrics(tmp_path / "cut")  # losses, metrics and LRs, rounded to 1e-6
    for key in ("test_acc", "val_acc", "best_epoch", "epochs_run"):
        assert resumed[key] == pytest.approx(full[key], rel=1e-6), key
    assert_same_run(tmp_path / "full", tmp_path / "cut", graph)


def test_resume_in_a_fresh_process_equals_uninterrupted(tmp_path, graph):
    """What a real crash leaves: the resuming process starts with nothing in memory but the run_dir."""
    train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'full'}", *COMMON))
    with pytest.raises(Killed):
        train.run(
            compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'cut'}", *COMMON),
            on_epoch_end=kill_after_3,
        )
    assert optimizer_steps(tmp_path / "cut") == [3 * steps_per_epoch(graph)]
    env = {**os.environ, "DGLBACKEND": "pytorch"}
    cmd = [sys.executable, "-c", "from gnnscale.cli import main; main()", "train"]
    cmd += [f"graph_dir={graph}", f"resume={tmp_path / 'cut'}", *COMMON]
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["resumed_from_epoch"] == 3 and summary["epochs_run"] == EPOCHS
    assert_same_run(tmp_path / "full", tmp_path / "cut", graph)


def test_train_resume_flag_continues_a_finished_run_without_training(tmp_path, graph):
    first = train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", *COMMON))
    last = tmp_path / "r" / "checkpoints" / "last.pt"
    weights, logged = torch.load(last, weights_only=True)["model"], metrics(tmp_path / "r")
    again = train.run(
        compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", "train.resume=true", *COMMON)
    )
    assert again["epochs_run"] == first["epochs_run"] and again["test_acc"] == pytest.approx(
        first["test_acc"]
    )
    # Nothing trained: the same epochs logged, the same weights, the same optimizer step count.
    assert metrics(tmp_path / "r") == logged
    after = torch.load(last, weights_only=True)["model"]
    assert after.keys() == weights.keys() and all(torch.equal(after[k], v) for k, v in weights.items())
    assert optimizer_steps(tmp_path / "r") == [EPOCHS * steps_per_epoch(graph)]


def test_checkpoint_of_another_model_is_refused(tmp_path, graph):
    train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", *COMMON, "train.epochs=1"))
    with pytest.raises(ConfigError, match=r"different model config \(hidden 32 vs 64"):
        train.run(
            compose("train", f"graph_dir={graph}", f"resume={tmp_path / 'r'}", *COMMON, "model.hidden=64")
        )


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, graph):
    from gnnscale.errors import DataError

    with pytest.raises(DataError, match="cannot resume"):
        train.run(compose("train", f"graph_dir={graph}", f"resume={tmp_path / 'nothing'}", *COMMON))
