"""The train stage on a tiny graph: presets learn, run_dir contract, precision, alignment, bad configs."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import ConfigError, GraphDirError
from gnnscale.stages import train
from tests.conftest import NEIGHBOURHOOD_DECIDES, TINY_SYNTHETIC, build_graph, compose

runner = CliRunner()
CKPT_KEYS = {
    "model",
    "signature",
    "signature_hash",
    "model_cfg",
    "graph",
    "epoch",
    "optimizer",
    "scheduler",
    "scaler",
    "rng",
    "config_hash",
    "best_val",
}
# The big presets' schedules, shortened: a tiny graph needs only a few epochs to show it learns.
SHORT = ("train.epochs=10", "train.patience=0", "train.batch_size=64", "train.lr=0.01", "model.hidden=32")
# Clearer class signal than the shared tiny graph, so "learns" is far from chance in a few epochs.
TINY = (*TINY_SYNTHETIC, "data.feature_signal=1.0")
# Computed values in a metrics.jsonl line; the rest are times, rates and memory readings.
COMPUTED = ("epoch", "loss", "train_acc", "lr", "val_acc", "val_loss", "steps", "best")


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("tiny"), *TINY)


def run_train(tmp_path, graph, *overrides, name="run", **kwargs):
    cfg = compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / name}", *overrides)
    return train.run(cfg, **kwargs), tmp_path / name


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "preset, extra", [("debug_tiny", ()), ("sage_2hop", SHORT), ("sage_3hop", SHORT), ("gcn_2hop", SHORT)]
)
def test_preset_learns_and_writes_the_run_dir(tmp_path, graph, preset, extra):
    summary, run_dir = run_train(tmp_path, graph, f"+exp={preset}", *extra)
    # 3 balanced classes: chance is 1/3; a GNN on this homophilous graph does far better.
    assert summary["test_acc"] > 0.8, summary
    assert summary["val_acc"] > 0.8
    records = read_metrics(run_dir)
    assert len(records) == summary["epochs_run"] and [r["epoch"] for r in records] == list(
        range(1, len(records) + 1)
    )
    for key in (
        "loss",
        "val_acc",
        "lr",
        "epoch_time_s",
        "sample_s",
        "gather_s",
        "forward_s",
        "backward_s",
        "step_s",
        "seeds_per_s",
        "peak_rss_mb",
    ):
        assert key in records[0], key
    assert records[-1]["loss"] < records[0]["loss"]
    assert (run_dir / "config.yaml").is_file()
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in (
        "val_acc",
        "test_acc",
        "best_epoch",
        "epochs_run",
        "epoch_time_s",
        "peak_rss_mb",
        "num_params",
    ):
        assert on_disk[key] is not None, key
    for name in ("last.pt", "best.pt"):
        ckpt = torch.load(run_dir / "checkpoints" / name, weights_only=True)
        assert CKPT_KEYS <= set(ckpt), CKPT_KEYS - set(ckpt)
        assert ckpt["graph"]["num_classes"] == 3 and ckpt["graph"]["feat_dim"] == 8
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert best["epoch"] == summary["best_epoch"]
    assert best["best_val"] == pytest.approx(max(r["val_acc"] for r in records), abs=1e-6)


@pytest.fixture(scope="module")
def hard_graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("hard"), *NEIGHBOURHOOD_DECIDES)


@pytest.mark.parametrize("preset", ["debug_tiny", "sage_2hop", "sage_3hop", "gcn_2hop"])
def test_message_passing_beats_features_only(tmp_path, hard_graph, preset):
    """The GNN and a features-only MLP with the same settings: only the neighbourhood tells the classes apart."""
    import yaml

    gnn, gnn_dir = run_train(tmp_path, hard_graph, f"+exp={preset}", *SHORT, name="gnn")
    mlp, mlp_dir = run_train(tmp_path, hard_graph, f"+exp={preset}", *SHORT, "model=mlp", name="mlp")
    archs = [yaml.safe_load((d / "config.yaml").read_text())["model"]["arch"] for d in (gnn_dir, mlp_dir)]
    assert archs[0] in ("sage", "gcn") and archs[1] == "mlp"
    assert mlp["test_acc"] < 0.5, mlp["test_acc"]  # 3 balanced classes: chance is 1/3
    assert gnn["test_acc"] >= mlp["test_acc"] + 0.15, (gnn["test_acc"], mlp["test_acc"])
    assert gnn["val_acc"] >= mlp["val_acc"] + 0.15, (gnn["val_acc"], mlp["val_acc"])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_trains(tmp_path, graph, precision):
    summary, run_dir = run_train(tmp_path, graph, "+exp=debug_tiny", f"precision={precision}")
    losses = [r["loss"] for r in read_metrics(run_dir)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert summary["precision"] == precision and summary["test_acc"] > 0.5
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    if precision == "fp16":
        assert ckpt["scaler"]["scale"] > 0  # the CPU loss scaler's state travels with the checkpoint


def test_mmap_features_and_memory_features_train_alike(tmp_path, graph):
    a, _ = run_train(
        tmp_path, graph, "+exp=debug_tiny", "train.epochs=2", "train.feature_cache=memory", name="mem"
    )
    b, _ = run_train(
        tmp_path,
        graph,
        "+exp=debug_tiny",
        "train.epochs=2",
        "train.feature_cache=mmap",
        "train.prefetch=0",
        name="mmap",
    )
    assert (a["feature_cache"], b["feature_cache"]) == ("memory", "mmap")
    assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1e-6)
    # Same rows, same order, same arithmetic: every computed value and every weight is identical.
    runs = [tmp_path / "mem", tmp_path / "mmap"]
    computed = [[{k: r[k] for k in COMPUTED if k in r} for r in read_metrics(d)] for d in runs]
    assert len(computed[0]) == 2 and all("loss" in r and "val_acc" in r for r in computed[0])
    assert computed[0] == computed[1]
    weights = [torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"] for d in runs]
    assert weights[0].keys() == weights[1].keys()
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key


def test_sampled_features_align_with_full_graph_computation(graph):
    """Full-neighbour sampled blocks + gathered rows must reproduce a whole-graph forward pass exactly."""
    from gnnscale.models import build_model
    from gnnscale.sampling import build_loader, build_sampler
    from gnnscale.training.batches import BatchStream
    from gnnscale.training.data import load_train_data

    cfg = compose("train", f"graph_dir={graph}", "model.hidden=16", "sampler.fanouts=[-1,-1]")
    data = load_train_data(str(graph), feature_cache="mmap")  # 3 shards: rows come from several files
    assert data.graph.num_shards == 3
    torch.manual_seed(0)
    model = build_model(cfg.model, data.feat_dim, data.num_classes).eval()
    seeds = torch.randperm(data.graph.num_nodes)[:200]  # scattered IDs, not sorted
    sampler = build_sampler(cfg.sampler, 2)
    stream = BatchStream(
        lambda: build_loader(data.g, seeds, sampler, 37, shuffle=True), data.features, data.labels, prefetch=2
    )
    with torch.no_grad():
        h = data.features.gather(torch.arange(data.graph.num_nodes))
        for i in range(2):
            h = model.layer_forward(i, data.g, h)
        got, ids = [], []
        for b in stream:
            assert torch.equal(b.x, h.new_tensor(data.features.gather(b.input_nodes)))
            got.append(model(b.blocks, b.x))
            ids.append(b.seeds)
    stream.close()
    ids = torch.cat(ids)
    assert sorted(ids.tolist()) == sorted(seeds.tolist())
    torch.testing.assert_close(torch.cat(got), h[ids], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("sampler.fanouts=[5]", "sampler.fanouts has 1 entries but model.num_layers=2"),
        ("train.batch_size=0", "train.batch_size=0 must be positive"),
        ("model.aggregator=median", "model.aggregator='median' is not known"),
        ("train.metric=roc_auc", "needs a binary task"),
        ("train.eval_fanouts=[5,5,5]", "train.eval_fanouts has 3 entries"),
        ("train.lr=-1", "train.lr=-1.0 must be positive"),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path, graph, override, needle):
    result = runner.invoke(app, ["train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", override])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_graph_without_csc_is_refused(tmp_path):
    graph_dir = build_graph(tmp_path, *TINY_SYNTHETIC, csc=False)
    with pytest.raises(GraphDirError, match="has no CSC"):
        train.run(compose("train", f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'r'}"))


def test_existing_run_dir_is_not_silently_reused(tmp_path, graph):
    run_train(tmp_path, graph, "+exp=debug_tiny", "train.epochs=1")
    with pytest.raises(ConfigError, match="already holds a training run"):
        run_train(tmp_path, graph, "+exp=debug_tiny", "train.epochs=1")
    summary, _ = run_train(tmp_path, graph, "+exp=debug_tiny", "train.epochs=1", "overwrite=true")
    assert summary["epochs_run"] == 1


def test_metrics_match_reference_values():
    from gnnscale.tasks.metrics import class_weights, compute_metric

    y = torch.tensor([0, 0, 1, 1])
    logits = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.4, 0.6], [0.2, 0.8]])
    assert compute_metric("acc", logits, y, 2) == pytest.approx(0.75)
    assert compute_metric("roc_auc", logits, y, 2) == pytest.approx(0.75)  # sklearn: 0.75
    assert compute_metric("f1_macro", logits, y, 2) == pytest.approx((2 / 3 + 0.8) / 2)
    torch.testing.assert_close(class_weights(torch.tensor([0, 0, 0, 1]), 2), torch.tensor([2 / 3, 2.0]))


def test_few_labels_profile_replaces_settings_but_not_the_users(tmp_path, graph):
    """sage_2hop's few-labels profile applies on a graph with < 1,000 labelled train nodes (this one has 362),
    is recorded in config.yaml and the checkpoint, keeps a value the user set, and can be turned off."""
    import yaml

    summary, run_dir = run_train(tmp_path, graph, "+exp=sage_2hop", *SHORT, name="profile")
    applied = summary["few_labels_applied"]
    assert applied["model.aggregator"] == "gcn" and applied["train.weight_decay"] == 0.005
    assert "train.lr" not in applied  # SHORT sets train.lr=0.01 on the command line: the user's value wins
    used = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (used["model"]["aggregator"], used["model"]["norm"], used["train"]["lr"]) == ("gcn", "none", 0.01)
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["model_cfg"]["aggregator"] == "gcn"
    assert summary["test_acc"] > 0.8

    off, off_dir = run_train(
        tmp_path, graph, "+exp=sage_2hop", *SHORT, "train.few_labels.below=0", "train.epochs=1", name="off"
    )
    assert off["few_labels_applied"] == {}
    assert yaml.safe_load((off_dir / "config.yaml").read_text())["model"]["aggregator"] == "mean"
    few, _ = run_train(
        tmp_path, graph, "+exp=sage_2hop", *SHORT, "train.few_labels.below=362", "train.epochs=1", name="edge"
    )
    assert few["few_labels_applied"] == {}  # 362 labelled train nodes: "fewer than 362" does not hold
    few, _ = run_train(
        tmp_path,
        graph,
        "+exp=sage_2hop",
        *SHORT,
        "train.few_labels.below=363",
        "train.epochs=1",
        name="edge2",
    )
    assert few["few_labels_applied"]["model.aggregator"] == "gcn"
