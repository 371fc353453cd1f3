"""What a train run shows people: TensorBoard event files (logger=tensorboard), run_dir/curves.png, and
`gnnscale compare` over two runs."""

from __future__ import annotations

import json
import math
import struct

import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.stages import train
from gnnscale.training.curves import CURVES_INCHES, DPI, phase_starts
from tests.conftest import TINY_SYNTHETIC, build_graph, compose, shared_data

runner = CliRunner()
EPOCHS = 5


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("tiny"), *TINY_SYNTHETIC)


def run_train(graph, run_dir, *overrides):
    return train.run(
        compose("train", f"graph_dir={graph}", f"run_dir={run_dir}", "+exp=debug_tiny", *overrides)
    )


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """tag -> (step, value) of every scalar TensorBoard itself would show for the event files in folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every value
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_tensorboard_logs_each_epoch_once_and_a_resumed_run_continues_its_steps(tmp_path, graph, monkeypatch):
    run_dir = tmp_path / "run"
    steps_per_epoch = math.ceil(json.loads((graph / "meta.json").read_text())["splits"]["train"] / 64)
    kill_at = 3 * steps_per_epoch + 2  # inside epoch 4: its first batches' events are written, then lost

    def fault_point(point, seen=[0]):  # noqa: B006 - the count lives across calls
        if point == "train.batch":
            seen[0] += 1
            if seen[0] == kill_at:
                raise Killed

    logged = ("logger=tensorboard", "logger.every_n_batches=1", f"train.epochs={EPOCHS}")
    with monkeypatch.context() as m:
        m.setattr("gnnscale.training.trainer.fault_point", fault_point)
        with pytest.raises(Killed):
            run_train(graph, run_dir, *logged)
    before = scalars(run_dir / "tb" / "batches")["batch/loss"]
    assert [s for s, _ in before] == list(range(1, kill_at + 1))  # the lost epoch's batches were on disk

    summary = run_train(graph, run_dir, *logged, f"resume={run_dir}")
    assert summary["resumed_from_epoch"] == 3

    epochs = scalars(run_dir / "tb")
    records = metrics(run_dir)
    for tag, key in (("train/loss", "loss"), ("val/acc", "val_acc"), ("train/lr", "lr")):
        assert [s for s, _ in epochs[tag]] == list(range(1, EPOCHS + 1)), tag  # one value per epoch
        assert [v for _, v in epochs[tag]] == pytest.approx([r[key] for r in records], rel=1e-6), tag
    assert {"throughput/seeds_per_s", "time/forward_s", "memory/peak_rss_mb", "diag/loss_cv"} <= set(epochs)
    assert epochs["final/test_acc"] == [(EPOCHS, pytest.approx(summary["test_acc"], rel=1e-6))]

    batches = scalars(run_dir / "tb" / "batches")
    assert [s for s, _ in batches["batch/loss"]] == list(range(1, EPOCHS * steps_per_epoch + 1))
    assert len(batches["batch/grad_norm"]) == EPOCHS * steps_per_epoch  # train.grad_clip=1.0 computes it
    assert png_size(run_dir / "curves.png") == (CURVES_INCHES[0] * DPI, CURVES_INCHES[1] * DPI)


def test_sage_2hop_on_cora_logs_one_loss_and_val_value_per_epoch(tmp_path):
    cora = build_graph(tmp_path, "data=planetoid", f"data.path={shared_data('planetoid_cora')}")
    run_dir = tmp_path / "cora"
    train.run(
        compose("train", f"graph_dir={cora}", f"run_dir={run_dir}", "+exp=sage_2hop", "logger=tensorboard",
                "train.epochs=3")
    )  # fmt: skip
    epochs, records = scalars(run_dir / "tb"), metrics(run_dir)
    for tag, key in (("train/loss", "loss"), ("val/acc", "val_acc")):
        assert [s for s, _ in epochs[tag]] == [1, 2, 3], tag
        assert [v for _, v in epochs[tag]] == pytest.approx([r[key] for r in records], rel=1e-6), tag


def test_curves_png_after_a_train_run_marks_its_phases(tmp_path, graph):
    phases = "train.phases=[{epochs: 2, batch_size: 128}, {epochs: 2}]"
    run_train(graph, tmp_path / "run", phases)
    assert png_size(tmp_path / "run" / "curves.png") == (CURVES_INCHES[0] * DPI, CURVES_INCHES[1] * DPI)
    assert phase_starts(metrics(tmp_path / "run")) == [(3, 2)]
    assert not (tmp_path / "run" / "tb").exists()  # the default logger writes no event files

    run_train(graph, tmp_path / "quiet", "logger=none", "train.epochs=1")
    assert (tmp_path / "quiet" / "metrics.jsonl").is_file() and not (
        tmp_path / "quiet" / "curves.png"
    ).exists()


def test_compare_shows_the_differing_key_and_both_results(tmp_path, graph):
    small = run_train(graph, tmp_path / "small", "model.hidden=8", "train.epochs=2")
    wide = run_train(graph, tmp_path / "wide", "model.hidden=16", "train.epochs=2")
    out = tmp_path / "cmp"
    result = runner.invoke(
        app, ["compare", str(tmp_path / "small"), str(tmp_path / "wide"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "model.hidden" in text and "small" in text and "wide" in text
    for summary in (small, wide):
        assert f"{summary['test_acc']:.4g}" in text and f"{summary['epoch_time_s']:.4g}" in text
    table = json.loads((out / "compare.json").read_text())
    assert table["differences"] == {"model.hidden": [8, 16]}  # nothing else differs but where they ran
    assert table["results"]["test_acc"] == [small["test_acc"], wide["test_acc"]]
    assert table["results"]["peak RSS (MB)"] == [small["peak_rss_mb"], wide["peak_rss_mb"]]
    assert png_size(out / "val_curves.png")[0] > 0


def test_compare_refuses_a_folder_that_is_not_a_run(tmp_path):
    result = runner.invoke(app, ["compare", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "is not a train run folder" in result.stderr
