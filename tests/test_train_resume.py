"""Kill-and-resume equals the uninterrupted run; a checkpoint from another model config is refused."""

from __future__ import annotations

import json

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


def test_killed_then_resumed_equals_uninterrupted(tmp_path, graph):
    full = train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'full'}", *COMMON))

    def kill_after_3(epoch):
        if epoch == 3:
            raise Killed  # after last.pt for epoch 3 was written, as a crash would leave it

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


def test_train_resume_flag_continues_a_finished_run_without_training(tmp_path, graph):
    first = train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", *COMMON))
    again = train.run(
        compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", "train.resume=true", *COMMON)
    )
    assert again["epochs_run"] == first["epochs_run"] and again["test_acc"] == pytest.approx(
        first["test_acc"]
    )


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
