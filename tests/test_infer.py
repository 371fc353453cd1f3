"""Layer-wise and sampled inference: exact against the full-graph forward, eval mode, outputs, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import ConfigError, DataError
from tests.conftest import TINY_SYNTHETIC, build_graph
from tests.test_infer_support import infer, make_ckpt, reference_layers

runner = CliRunner()


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("infer_graph"), *TINY_SYNTHETIC)


@pytest.fixture(scope="module")
def ckpt(graph, tmp_path_factory):
    """2-layer SAGE with BatchNorm and dropout 0.5, trained a few steps."""
    return make_ckpt(tmp_path_factory.mktemp("train"), graph)


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_layerwise_equals_full_graph_forward(tmp_path, graph, ckpt, storage):
    s = infer(
        tmp_path,
        "run",
        f"ckpt={ckpt}",
        f"infer.storage={storage}",
        "infer.batch_size=97",
        "infer.probabilities=true",
    )
    assert s["files"]["probabilities"] == "probabilities.npy" and s["embeddings"] == {
        "shape": [600, 16],
        "layer": 1,
    }
    ref = reference_layers(ckpt, graph)
    run = tmp_path / "run"
    emb = np.load(run / "embeddings.npy")
    assert emb.shape == ref[0].shape == (600, 16)
    assert np.abs(emb - ref[0]).max() < 1e-4
    for i, r in enumerate(ref):
        assert np.abs(np.load(run / "layers" / f"h_{i + 1}.npy") - r).max() < 1e-4
    pred = np.load(run / "predictions.npy")
    assert pred.dtype == np.int64 and np.array_equal(pred, ref[-1].argmax(1))
    prob = np.load(run / "probabilities.npy")
    assert np.allclose(prob.sum(1), 1.0, atol=1e-5) and np.array_equal(prob.argmax(1), pred)
    info = json.loads((run / "emb_info.json").read_text())
    assert info["shape"] == [600, 16] and info["dtype"] == "float32" and info["layer"] == 1
    assert info["node_order"].startswith("row i is global node id i")
    assert len(info["model_cfg_hash"]) == 16 and info["cache"]["files"] == ["h_1.npy", "h_2.npy"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["storage"]["layers"] == storage
    assert summary["nodes_per_s"] > 0 and summary["peak_rss_mb"] > 0 and summary["peak_anon_mb"] > 0
    from gnnscale.storage.graph_dir import GraphDir

    g = GraphDir(graph)
    test = g.mask("test").numpy()
    expected = float((pred[test] == g.labels().numpy()[test]).mean())
    assert summary["metric"]["split"] == "test" and summary["test_acc"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "arch, aggregator, norm, layers",
    [
        ("gcn", "mean", "layer", 3),
        ("sage", "pool", "none", 3),
        ("sage", "gcn", "batch", 2),
        ("mlp", "mean", "batch", 2),
        ("sage", "mean", "none", 1),
    ],
)
def test_every_arch_matches_full_graph(tmp_path, graph, arch, aggregator, norm, layers):
    # GCN normalises by source out-degree, which a batch's block does not see: the stage corrects it.
    ckpt = make_ckpt(
        tmp_path / "train", graph, arch=arch, aggregator=aggregator, norm=norm, num_layers=layers, steps=3
    )
    infer(tmp_path, "run", f"ckpt={ckpt}", "infer.batch_size=64")
    ref = reference_layers(ckpt, graph)
    for i, r in enumerate(ref):
        assert np.abs(np.load(tmp_path / "run" / "layers" / f"h_{i + 1}.npy") - r).max() < 1e-4, (
            f"layer {i + 1}"
        )
    emb = np.load(tmp_path / "run" / "embeddings.npy")
    assert np.array_equal(emb, np.load(tmp_path / "run" / "layers" / f"h_{max(layers - 1, 1)}.npy"))


def test_eval_mode_is_deterministic_and_not_train_mode(tmp_path, graph, ckpt):
    infer(tmp_path, "a", f"ckpt={ckpt}", "infer.batch_size=128")
    infer(tmp_path, "b", f"ckpt={ckpt}", "infer.batch_size=128", "infer.storage=disk")
    a, b = np.load(tmp_path / "a" / "embeddings.npy"), np.load(tmp_path / "b" / "embeddings.npy")
    assert np.array_equal(a, b)
    # Dropout on and BatchNorm on batch statistics would give other numbers: eval mode is what we ran.
    train_mode = reference_layers(ckpt, graph, train_mode=True)[0]
    assert np.abs(a - train_mode).max() > 1e-2


def test_chosen_layer_and_no_cache(tmp_path, graph, ckpt):
    s = infer(tmp_path, "run", f"ckpt={ckpt}", "infer.layer=2", "infer.cache_layers=false")
    run = tmp_path / "run"
    ref = reference_layers(ckpt, graph)
    assert np.abs(np.load(run / "embeddings.npy") - ref[1]).max() < 1e-4
    assert not (run / "layers").exists() and json.loads((run / "emb_info.json").read_text())["cache"] is None
    assert s["embeddings"]["shape"] == [600, 3]
    with pytest.raises(ConfigError, match="infer.layer=3 is outside 1..2"):
        infer(tmp_path, "bad", f"ckpt={ckpt}", "infer.layer=3")


def test_memory_budget_decides_storage(tmp_path, graph, ckpt):
    s = infer(tmp_path, "small", f"ckpt={ckpt}", "infer.memory_budget=10KB")
    assert (
        s["storage"]["layers"] == "disk"
        and "exceeds the memory budget 0.00 GB (infer.memory_budget=10KB)" in s["storage"]["why"]
    )
    s2 = infer(tmp_path, "big", f"ckpt={ckpt}")
    assert s2["storage"]["layers"] == "memory" and "fits" in s2["storage"]["why"]
    assert np.array_equal(
        np.load(tmp_path / "small" / "embeddings.npy"), np.load(tmp_path / "big" / "embeddings.npy")
    )


def test_ckpt_resolution_run_dir_and_newest(tmp_path, graph, ckpt, monkeypatch):
    train_run = ckpt.parent.parent
    infer(tmp_path, "from_dir", f"ckpt={train_run}")
    assert json.loads((tmp_path / "from_dir" / "emb_info.json").read_text())["ckpt"] == str(ckpt.resolve())
    # Default: the newest train run under ./runs/train.
    monkeypatch.chdir(tmp_path)
    newest = make_ckpt(tmp_path / "runs" / "train" / "20990101-000000", graph, steps=0)
    infer(tmp_path, "newest")
    assert json.loads((tmp_path / "newest" / "emb_info.json").read_text())["ckpt"] == str(newest.resolve())


def test_sampled_full_fanout_equals_layerwise(tmp_path, graph, ckpt):
    infer(tmp_path, "lw", f"ckpt={ckpt}")
    ids = np.array([5, 3, 599, 3, 0], dtype=np.int64)  # any order, repeats allowed: rows follow node_ids
    np.save(tmp_path / "ids.npy", ids)
    s = infer(
        tmp_path,
        "sp",
        f"ckpt={ckpt}",
        "infer.mode=sampled",
        "infer.fanouts=[-1,-1]",
        f"infer.nodes={tmp_path / 'ids.npy'}",
    )
    assert s["num_nodes"] == 5
    emb = np.load(tmp_path / "sp" / "embeddings.npy")
    assert np.array_equal(np.load(tmp_path / "sp" / "node_ids.npy"), ids)
    assert np.abs(emb - np.load(tmp_path / "lw" / "embeddings.npy")[ids]).max() < 1e-4
    # Sampled with small fanouts on the test split: deterministic given the seed.
    a = infer(tmp_path, "s1", f"ckpt={ckpt}", "infer.mode=sampled", "infer.fanouts=[2,2]")
    infer(tmp_path, "s2", f"ckpt={ckpt}", "infer.mode=sampled", "infer.fanouts=[2,2]")
    assert a["metric"]["split"] == "test" and a["num_nodes"] == a["metric"]["labelled_nodes"]
    assert np.array_equal(
        np.load(tmp_path / "s1" / "embeddings.npy"), np.load(tmp_path / "s2" / "embeddings.npy")
    )
    with pytest.raises(ConfigError, match="infer.fanouts has 1 entries but the model has 2 layers"):
        infer(tmp_path, "bad", f"ckpt={ckpt}", "infer.mode=sampled", "infer.fanouts=[5]")
    np.save(tmp_path / "bad.npy", np.array([0, 600]))
    with pytest.raises(DataError, match=r"node id 600 outside \[0, 600\)"):
        infer(tmp_path, "bad2", f"ckpt={ckpt}", "infer.mode=sampled", f"infer.nodes={tmp_path / 'bad.npy'}")


def _cli(*args):
    return runner.invoke(app, ["infer", *args])


def test_cli_ckpt_feature_dim_mismatch_exits_2(tmp_path, graph):
    bad = make_ckpt(tmp_path / "train", graph, in_dim=16, steps=0)
    result = _cli(f"ckpt={bad}", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}")
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in result.output
    assert err.startswith("error: checkpoint") and "expects 16 input features" in err and "feat_dim 8" in err
    assert "pass graph_dir=" in err


def test_cli_bad_ckpts_exit_2(tmp_path, graph, ckpt):
    cases = [
        ([f"ckpt={tmp_path / 'nope.pt'}"], "does not exist"),
        ([f"ckpt={tmp_path}"], "holds no checkpoints/best.pt or checkpoints/last.pt"),
        (
            ["--sampled", "--update", str(tmp_path / "c.npz"), f"ckpt={ckpt}"],
            "cannot be combined with --sampled",
        ),
    ]
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    cases.append(([f"ckpt={tmp_path / 'junk.pt'}"], "cannot read checkpoint"))
    for args, message in cases:
        result = _cli(*args, f"run_dir={tmp_path / 'r'}")
        assert result.exit_code == 2, result.output
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_cli_layerwise_runs_and_prints_accuracy(tmp_path, graph, ckpt):
    result = _cli("--layerwise", f"ckpt={ckpt}", f"run_dir={tmp_path / 'r'}")
    assert result.exit_code == 0, result.output
    assert "test accuracy" in result.stdout and (tmp_path / "r" / "embeddings.npy").is_file()
    shown = _cli("--sampled", "--cfg", f"ckpt={ckpt}")
    assert shown.exit_code == 0 and "mode: sampled" in shown.stdout
