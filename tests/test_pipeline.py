"""`gnnscale pipeline`: shard -> build-csr -> train -> infer, reuse of up-to-date stages, resume, bad stages."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.config import compose_config
from gnnscale.errors import ConfigError
from gnnscale.stages import pipeline, train
from gnnscale.storage.run_dir import KEY_FILE
from gnnscale.training.curves import CURVES_INCHES, DPI
from tests.conftest import NEIGHBOURHOOD_DECIDES, TINY_SYNTHETIC, compose

runner = CliRunner()
STAGES = ["shard", "build_csr", "train", "infer"]
# debug_tiny trains 6 epochs of a 2x32 SAGE; a clear class signal keeps "learns" far from chance (1/3).
TINY = (*TINY_SYNTHETIC, "data.feature_signal=1.0", "+exp=debug_tiny")


class Killed(Exception):
    pass


def run_pipeline(root, name, *overrides):
    cfg = compose(
        "pipeline", f"graph_dir={root / 'graph'}", f"run_dir={root / 'runs' / name}", *TINY, *overrides
    )
    return pipeline.run(cfg)


def skipped(summary) -> dict:
    return {stage: bool(result.get("skipped")) for stage, result in summary["stages"].items()}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    return root, run_pipeline(root, "first")


def test_runs_every_stage_and_writes_outputs(first):
    root, s = first
    assert list(s["stages"]) == STAGES and not any(skipped(s).values())
    tr, inf = s["stages"]["train"], s["stages"]["infer"]
    assert tr["run_dir"] == str(root / "runs" / "first" / "train")
    assert tr["epochs_run"] == 6 and tr["model"]["hidden"] == 32
    # infer read this run's model, on the whole graph
    assert inf["ckpt"] == str((root / "runs" / "first" / "train" / "checkpoints" / "best.pt").resolve())
    emb = np.load(root / "runs" / "first" / "infer" / "embeddings.npy")
    pred = np.load(root / "runs" / "first" / "infer" / "predictions.npy")
    assert emb.shape == (600, 32) and np.isfinite(emb).all()
    assert pred.shape == (600,) and pred.min() >= 0 and pred.max() < 3
    assert inf["test_acc"] > 0.8 and tr["test_acc"] > 0.8  # 3 classes: chance is 1/3

    h = s["headline"]
    assert (h["graph"], h["num_nodes"], h["infer_mode"]) == ("synthetic", 600, "layerwise")
    assert h["num_edges"] == s["stages"]["shard"]["num_edges"]
    assert (h["infer_test_acc"], h["train_test"], h["epochs_run"]) == (inf["test_acc"], tr["test_acc"], 6)
    assert h["embeddings"] == str(root / "runs" / "first" / "infer" / "embeddings.npy")
    assert set(s["wall_time_s"]) == {*STAGES, "total"}
    on_disk = json.loads((root / "runs" / "first" / "summary.json").read_text())
    assert on_disk["headline"] == h and list(on_disk["stages"]) == STAGES
    # make demo's train stage leaves its curves picture (training/curves.py: CURVES_INCHES at DPI)
    png = (root / "runs" / "first" / "train" / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (CURVES_INCHES[0] * DPI, CURVES_INCHES[1] * DPI)


def test_each_stage_gets_only_its_own_config(first):
    root, _ = first
    train_dir = root / "runs" / "first" / "train"
    tcfg = OmegaConf.load(train_dir / "config.yaml")
    assert "stages" not in tcfg and "infer" not in tcfg and tcfg["train"]["epochs"] == 6
    # The pipeline's key is the hash the train stage itself records: `gnnscale train` with the same
    # options computes the same one.
    key = json.loads((train_dir / KEY_FILE).read_text())
    assert (
        key["config_hash"]
        == torch.load(train_dir / "checkpoints" / "last.pt", weights_only=True)["config_hash"]
    )
    icfg = OmegaConf.load(root / "runs" / "first" / "infer" / "config.yaml")
    assert icfg["ckpt"] == str(train_dir.resolve()) and "train" not in icfg


def test_second_run_reuses_every_stage(first):
    root, s1 = first
    s2 = run_pipeline(root, "second")
    assert skipped(s2) == dict.fromkeys(STAGES, True)
    assert s2["stages"]["train"]["run_dir"] == s1["stages"]["train"]["run_dir"]
    assert s2["stages"]["infer"]["run_dir"] == s1["stages"]["infer"]["run_dir"]
    assert s2["headline"]["infer_test_acc"] == s1["headline"]["infer_test_acc"]
    assert not (root / "runs" / "second" / "train").exists()


def test_infer_alone_finds_the_model_this_config_trains(first):
    root, s1 = first
    s = run_pipeline(root, "infer_only", "stages=[infer]", "infer.batch_size=100")
    assert list(s["stages"]) == ["infer"] and not skipped(s)["infer"]  # another infer config: runs again
    assert s["stages"]["infer"]["ckpt"].startswith(str((root / "runs" / "first" / "train").resolve()))
    assert s["stages"]["infer"]["test_acc"] == pytest.approx(s1["stages"]["infer"]["test_acc"])


def test_reused_run_dir_with_another_config_is_refused(first):
    root, _ = first
    with pytest.raises(ConfigError, match="already holds a pipeline run whose train stage"):
        run_pipeline(root, "first", "train.epochs=3")


def test_changed_train_config_retrains_and_overwrite_reruns_all(tmp_path):
    run_pipeline(tmp_path, "a")
    s = run_pipeline(tmp_path, "b", "train.epochs=3")
    assert skipped(s) == {"shard": True, "build_csr": True, "train": False, "infer": False}
    assert s["stages"]["train"]["epochs_run"] == 3
    assert s["stages"]["infer"]["ckpt"].startswith(str((tmp_path / "runs" / "b" / "train").resolve()))
    s = run_pipeline(tmp_path, "c", "overwrite=true")
    assert not any(skipped(s).values())


def test_interrupted_train_is_resumed(tmp_path, monkeypatch):
    real_run = train.run

    def killed_after_3(cfg):
        def stop(epoch):
            if epoch == 3:
                raise Killed  # after last.pt for epoch 3 was written, as a crash would leave it

        return real_run(cfg, on_epoch_end=stop)

    monkeypatch.setattr(train, "run", killed_after_3)
    with pytest.raises(Killed):
        run_pipeline(tmp_path, "cut")
    monkeypatch.undo()
    s = run_pipeline(tmp_path, "again")
    tr = s["stages"]["train"]
    assert skipped(s) == {"shard": True, "build_csr": True, "train": False, "infer": False}
    assert tr["run_dir"] == str(tmp_path / "runs" / "cut" / "train")
    assert (tr["resumed_from_epoch"], tr["epochs_run"]) == (3, 6)
    assert s["stages"]["infer"]["test_acc"] > 0.8


def test_message_passing_beats_features_only_end_to_end(tmp_path):
    """Train and layer-wise inference of a GNN against a features-only MLP with the same settings, on a graph
    where only the neighbourhood tells the classes apart: a broken message-passing path in either fails."""
    runs = {}
    for arch in ("sage", "mlp"):
        cfg = compose(
            "pipeline",
            f"graph_dir={tmp_path / 'graph'}",
            f"run_dir={tmp_path / 'runs' / arch}",
            *NEIGHBOURHOOD_DECIDES,
            "+exp=debug_tiny",
            "train.epochs=10",
            f"model={arch}",
        )
        runs[arch] = pipeline.run(cfg)["stages"]
        assert OmegaConf.load(tmp_path / "runs" / arch / "train" / "config.yaml")["model"]["arch"] == arch
    gnn, mlp = runs["sage"], runs["mlp"]
    for stage in ("train", "infer"):
        assert mlp[stage]["test_acc"] < 0.5, (stage, mlp[stage]["test_acc"])  # 3 classes: chance is 1/3
        assert gnn[stage]["test_acc"] >= mlp[stage]["test_acc"] + 0.15, (
            stage,
            gnn[stage]["test_acc"],
            mlp[stage]["test_acc"],
        )


def test_presets_and_stage_options_compose():
    cfg = compose_config(
        "pipeline", ["+exp=sage_2hop", "train.epochs=5", "model.hidden=64", "infer.batch_size=4096"]
    )
    assert list(cfg.stages) == [*STAGES[:2], "partition", *STAGES[2:]]  # partition: only for cluster_gcn
    assert (cfg.model.norm, cfg.train.patience, cfg.train.epochs, cfg.model.hidden) == ("batch", 50, 5, 64)
    assert cfg.infer.batch_size == 4096 and cfg.infer.mode == "layerwise"
    result = runner.invoke(app, ["pipeline", "--cfg", "+exp=sage_2hop"])
    assert result.exit_code == 0 and "norm: batch" in result.stdout and "epochs: 200" in result.stdout


@pytest.mark.parametrize(
    "override, expected",
    [
        ("stages=[shard,bogus]", "error: unknown pipeline stage(s) ['bogus']; choose from"),
        ("stages=[train,shard]", "must name each stage once, in pipeline order"),
        ("train.resume=true", "resumes an interrupted train stage by itself"),
        ("train.epochs=0", "train.epochs=0 must be at least 1"),
        ("infer.storage=tape", "infer.storage='tape' is not known"),
    ],
)
def test_bad_stages_are_one_line_exit_2(tmp_path, override, expected):
    result = runner.invoke(app, ["pipeline", override, f"run_dir={tmp_path / 'run'}"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # checked before any folder is made
