"""Batch formation in training: stratified seed order, two-phase schedules (train.phases) and the health
diagnostics (train.diagnostics)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import ConfigError
from gnnscale.sampling.stratified import stratified_order
from gnnscale.stages import train
from gnnscale.training.diagnostics import Diagnostics, label_balance
from gnnscale.training.loop import BatchEnd
from tests.conftest import TINY_SYNTHETIC, build_graph, compose

runner = CliRunner()
# 2 epochs of big batches over small fanouts, then 3 of small batches over debug_tiny's fanouts [5, 5].
PHASES = "train.phases=[{epochs:2,batch_size:128,fanouts:[2,2]},{epochs:3,batch_size:32}]"
COMMON = ("+exp=debug_tiny", "train.warmup_epochs=1", "model.dropout=0.5")
# Values a run computes (the rest of a metrics line: times, rates, memory readings).
VOLATILE = ("seeds_per_s", "peak_rss_mb", "peak_gpu_mb")


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("tiny"), *TINY_SYNTHETIC)


def run(graph, run_dir, *overrides, **kwargs):
    return train.run(compose("train", f"graph_dir={graph}", f"run_dir={run_dir}", *overrides), **kwargs)


def metrics(run_dir, computed_only=True):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if not computed_only:
        return rows
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in VOLATILE} for r in rows]


def train_size(graph) -> int:
    return json.loads((graph / "meta.json").read_text())["splits"]["train"]


# ---------------------------------------------------------------- diagnostics, on crafted batches
def batch(step: int, labels, loss: float = 1.0, nodes=None, grad: float | None = 1.0) -> BatchEnd:
    y = torch.as_tensor(labels)
    ids = torch.as_tensor(nodes if nodes is not None else np.arange(len(y)))
    return BatchEnd(step, loss, len(y), {}, y, ids, grad)


def epoch(diag: Diagnostics, e: int, batches, best: bool = False, **record) -> dict:
    diag.on_epoch_start(e, len(batches))
    for b in batches:
        diag.on_batch_end(e, b)
    record = {"epoch": e, "loss": 1.0, "best": best, "val_acc": 0.5, **record}
    diag.on_epoch_record(e, record, model=None)
    return record


def test_imbalance_warning_fires_on_dominated_batches_only():
    split = torch.tensor([0, 1, 2] * 100)  # a balanced training split
    said: list[str] = []
    diag = Diagnostics(3, split, say=said.append)
    # 90% of each batch is one class (the class changes from batch to batch): the epoch as a whole is
    # balanced, but every batch is dominated by one class.
    skewed = [batch(i + 1, [i % 3] * 27 + [(i + 1) % 3] * 3) for i in range(10)]
    record = epoch(diag, 1, skewed)
    assert record["diag_dominated"] == 1.0 and record["diag_label_tv"] == pytest.approx(17 / 30, abs=1e-4)
    assert len(said) == 1 and said[0].startswith("warning: batches are dominated by one class")
    assert "sampler.seed_order=stratified" in said[0] and "train.class_weights=true" in said[0]
    assert list(record["diag_warnings"]) == ["imbalance"]
    epoch(diag, 2, skewed)
    assert len(said) == 1  # said once per run

    # A resumed run knows what was said before it (from the kept metrics lines): not said again.
    again: list[str] = []
    resumed = Diagnostics(3, split, say=again.append)
    resumed.on_resume([record])
    epoch(resumed, 2, skewed)
    assert again == []

    quiet: list[str] = []
    balanced = Diagnostics(3, split, say=quiet.append)
    record = epoch(balanced, 1, [batch(i + 1, [0, 1, 2] * 10) for i in range(10)])
    assert record["diag_dominated"] == 0.0 and record["diag_label_tv"] == 0.0
    assert quiet == [] and "diag_warnings" not in record


def test_label_balance_leaves_out_the_small_remainder_batch():
    share = np.array([0.5, 0.5])
    counts = np.array([[16, 16], [15, 17], [1, 0]])  # the last: an epoch's one-seed remainder
    tv, dominated = label_balance(counts, share)
    assert tv == pytest.approx(1 / 32) and dominated == 0.0


def test_oscillation_warning_needs_noisy_batches_on_a_loss_that_stays_large():
    split = torch.tensor([0, 1] * 50)
    said: list[str] = []
    diag = Diagnostics(2, split, say=said.append)
    labels = [0, 1] * 8
    noisy = [batch(i + 1, labels, loss=0.3 if i % 2 else 2.0, grad=0.2 if i % 2 else 3.0) for i in range(8)]
    steady = [batch(i + 1, labels, loss=1.0 + 0.01 * i) for i in range(8)]
    epoch(diag, 1, steady, loss=1.2)
    for e in (2, 3):
        epoch(diag, e, noisy, loss=1.1)
    assert said == []  # two noisy epochs after the first: not yet
    record = epoch(diag, 4, noisy, loss=1.1)
    assert record["diag_loss_cv"] > 0.5 and record["diag_grad_cv"] > 0.5
    assert len(said) == 1 and "the curve oscillates" in said[0] and "fanouts may be too small" in said[0]

    # The same spread on a loss near zero (a fitted training set) is no warning.
    calm: list[str] = []
    fitted = Diagnostics(2, split, say=calm.append)
    epoch(fitted, 1, steady, loss=1.2)
    for e in (2, 3, 4, 5):
        epoch(fitted, e, noisy, loss=0.05)
    assert calm == []


class FakeProbe:
    def __init__(self, values):
        self.values = iter(values)

    def measure(self, model, features):
        return next(self.values)


@pytest.mark.parametrize("random_pairs, warns", [(0.95, True), (0.6, False)])
def test_smoothing_warning_when_every_node_becomes_alike_while_val_stalls(random_pairs, warns):
    said: list[str] = []
    cos = [0.8, 0.91, 0.93, 0.95]
    diag = Diagnostics(
        2, torch.tensor([0, 1]), probe=FakeProbe([(c, random_pairs) for c in cos]), say=said.append
    )
    labels = [batch(1, [0, 1])]
    epoch(diag, 1, labels, best=True)
    for e in (2, 3, 4):
        record = epoch(diag, e, labels, best=False)
    assert record["diag_smooth_cos"] == 0.95 and record["diag_smooth_rand"] == random_pairs
    assert bool(said) == warns
    if warns:
        assert "over-smooths" in said[0] and "val_acc stalls" in said[0]


# ---------------------------------------------------------------- stratified seed order
@pytest.mark.parametrize("batch_size", [1, 7, 32, 64, 100])
def test_stratified_batches_hold_each_class_within_one_seed_of_its_share(batch_size):
    rs = np.random.RandomState(batch_size)
    for trial in range(10):
        labels = rs.choice(5, size=rs.randint(50, 1500), p=[0.5, 0.2, 0.15, 0.1, 0.05]) * 2 + 3
        classes = np.unique(labels)
        share = np.array([(labels == c).mean() for c in classes])
        order = stratified_order(labels, np.random.RandomState(trial), batch_size)
        assert np.array_equal(np.sort(order), np.arange(len(labels)))  # a permutation
        for lo in range(0, len(labels), batch_size):  # every batch, the last partial one included
            window = labels[order[lo : lo + batch_size]]
            counts = np.array([(window == c).sum() for c in classes])
            assert np.all(np.abs(counts - len(window) * share) <= 1), (lo, counts, len(window) * share)
    # Random: another RNG state, another order; the same state, the same order.
    a = stratified_order(labels, np.random.RandomState(1), batch_size)
    assert np.array_equal(a, stratified_order(labels, np.random.RandomState(1), batch_size))
    assert batch_size == 1 or not np.array_equal(
        a, stratified_order(labels, np.random.RandomState(2), batch_size)
    )


def test_stratified_train_run_exits_0_with_balanced_batches(tmp_path, graph):
    args = ["train", f"graph_dir={graph}", "+exp=debug_tiny", "train.epochs=2"]
    result = runner.invoke(app, [*args, f"run_dir={tmp_path / 's'}", "sampler.seed_order=stratified"])
    assert result.exit_code == 0, result.output
    strat = metrics(tmp_path / "s")
    assert runner.invoke(app, [*args, f"run_dir={tmp_path / 'r'}"]).exit_code == 0
    plain = metrics(tmp_path / "r")
    # Batches of 64 over 3 classes: within one seed of each share is a TV distance under 3 / 128.
    assert all(r["diag_label_tv"] < 3 / 128 for r in strat), strat
    assert all(r["diag_label_tv"] > 3 / 128 for r in plain)  # a plain shuffle varies by more


# ---------------------------------------------------------------- two phases
def test_two_phase_switches_batch_size_and_fanouts_at_the_boundary(tmp_path, graph):
    summary = run(graph, tmp_path / "r", *COMMON, PHASES)
    rows = metrics(tmp_path / "r")
    n = train_size(graph)
    assert [r["phase"] for r in rows] == [1, 1, 2, 2, 2]
    assert [r["batch_size"] for r in rows] == [128, 128, 32, 32, 32]
    assert [r["fanouts"] for r in rows] == [[2, 2]] * 2 + [[5, 5]] * 3
    assert [r["steps"] for r in rows] == [math.ceil(n / 128)] * 2 + [math.ceil(n / 32)] * 3
    assert rows[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # cosine ends at the run's last step
    assert summary["epochs_run"] == 5
    assert [p["epochs"] for p in summary["phases"]] == [[1, 2], [3, 5]]
    used = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert used["train"]["epochs"] == 5  # the phases' sum, recorded
    steps = torch.load(tmp_path / "r" / "checkpoints" / "last.pt", weights_only=True)["optimizer"]["state"]
    assert {int(s["step"]) for s in steps.values()} == {2 * math.ceil(n / 128) + 3 * math.ceil(n / 32)}


def test_two_phase_samplers_and_preset(tmp_path, graph):
    from gnnscale.training.build import build_samplers
    from gnnscale.training.data import load_train_data

    cfg = compose("train", f"graph_dir={graph}", *COMMON, PHASES)
    samplers = build_samplers(cfg, load_train_data(str(graph)))
    assert [s.fanouts for s in samplers["train"]] == [[2, 2], [5, 5]]
    preset = compose("train", "+exp=two_phase")
    assert [(p.epochs, p.batch_size, list(p.fanouts)) for p in preset.train.phases] == [
        (50, 4096, [5, 5]),
        (150, 1024, [25, 10]),
    ]


def kill_after(n):
    def hook(epoch):
        if epoch == n:
            raise Killed

    return hook


@pytest.mark.parametrize("killed_after", [2, 3], ids=["at-the-boundary", "inside-phase-2"])
def test_resume_lands_in_the_right_phase_and_equals_the_uninterrupted_run(tmp_path, graph, killed_after):
    run(graph, tmp_path / "full", *COMMON, PHASES)
    with pytest.raises(Killed):
        run(graph, tmp_path / "cut", *COMMON, PHASES, on_epoch_end=kill_after(killed_after))
    assert [r["epoch"] for r in metrics(tmp_path / "cut")] == list(range(1, killed_after + 1))
    resumed = train.run(compose("train", f"graph_dir={graph}", f"resume={tmp_path / 'cut'}", *COMMON, PHASES))
    assert resumed["resumed_from_epoch"] == killed_after
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "full")  # phases, steps, losses, LRs, diagnostics
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    steps = [{int(s["step"]) for s in c["optimizer"]["state"].values()} for c in (a, b)]
    assert steps[0] == steps[1]


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.phases=[{epochs:0}]", "train.phases[0].epochs=0 must be at least 1"),
        (
            "train.phases=[{epochs:2},{epochs:2,batch_size:0}]",
            "train.phases[1].batch_size=0 must be positive",
        ),
        (
            "train.phases=[{epochs:2,fanouts:[5]}]",
            "train.phases[0].fanouts has 1 entries but model.num_layers=2",
        ),
        ("train.phases=[{epochs:2,fanouts:[5,0]}]", "train.phases[0].fanouts=[5, 0] holds 0"),
        ("train.phases=[{batch_size:32}]", "train.phases[0].epochs is missing"),
    ],
)
def test_bad_phases_exit_2_with_one_line(tmp_path, graph, override, needle):
    result = runner.invoke(app, ["train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", override])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_train_epochs_must_match_the_phases_when_given(tmp_path, graph):
    args = ["train", f"graph_dir={graph}", "+exp=debug_tiny", PHASES]
    result = runner.invoke(app, [*args, f"run_dir={tmp_path / 'bad'}", "train.epochs=7"])
    assert result.exit_code == 2
    assert "train.epochs=7 disagrees with train.phases, whose epochs add up to 5" in result.stderr
    assert "set train.epochs=5" in result.stderr
    # Equal to the sum, or left to the preset (debug_tiny says 6): the phases decide.
    assert runner.invoke(app, [*args, f"run_dir={tmp_path / 'ok'}", "train.epochs=5"]).exit_code == 0
    assert len(metrics(tmp_path / "ok")) == 5


def test_phase_fanouts_need_a_sampler_with_fanouts(graph):
    from omegaconf import OmegaConf

    from gnnscale.training.phases import check_phases

    cfg = compose("train", f"graph_dir={graph}", "train.phases=[{epochs:2,fanouts:[5,5]}]")
    cfg.sampler = OmegaConf.create({"kind": "full", "seed_order": "random"})
    with pytest.raises(ConfigError, match=r"train.phases\[0\].fanouts is set but sampler.kind=full"):
        check_phases(cfg)


# ---------------------------------------------------------------- diagnostics change nothing
@pytest.mark.parametrize("clip", ["1.0", "0.0"], ids=["clipped", "norm-computed"])
def test_diagnostics_on_and_off_give_equal_losses(tmp_path, graph, clip):
    common = (*COMMON, "train.epochs=4", f"train.grad_clip={clip}")
    on = run(graph, tmp_path / "on", *common, "train.diagnostics=true")
    off = run(graph, tmp_path / "off", *common, "train.diagnostics=false")
    rows_on, rows_off = metrics(tmp_path / "on"), metrics(tmp_path / "off")
    assert all("diag_label_tv" in r and "diag_smooth_cos" in r for r in rows_on)
    assert all(r["diag_grad_cv"] is not None for r in rows_on)
    assert not any(k.startswith("diag_") for r in rows_off for k in r)
    stripped = [{k: v for k, v in r.items() if not k.startswith("diag_")} for r in rows_on]
    assert stripped == rows_off  # losses, accuracies, LRs: bit-equal after rounding to 1e-6
    a = torch.load(tmp_path / "on" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "off" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # the weights themselves: bit-equal
    assert on["test_acc"] == off["test_acc"]
    assert on["warnings"] == off["warnings"] == []
    assert set(on["diagnostics"]) >= {"diag_label_tv", "diag_loss_cv", "diag_smooth_cos"}
    assert off["diagnostics"] == {}
