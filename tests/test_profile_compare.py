"""profile.compare_samplers: equal steps for full-graph training, the winner's rule, the agreement line,
and the stage's comparison and speed prediction on a tiny graph."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.profile.compare import agreement, comparison_epochs, pick_winner
from tests.conftest import TINY_SYNTHETIC, build_graph, compose


def _row(sampler, val, train_time, steps=10):
    return {"sampler": sampler, "val_acc": val, "train_time_s": train_time, "steps": steps}


def test_full_graph_gets_as_many_steps_as_neighbour_sampling_has():
    assert comparison_epochs("full", 1, num_train=2500, batch_size=1024) == 3
    assert comparison_epochs("full", 2, num_train=100, batch_size=1024) == 2
    assert comparison_epochs("neighbor", 2, num_train=2500, batch_size=1024) == 2


def test_winner_is_the_best_metric_and_ties_go_to_the_shortest_training():
    rows = [_row("neighbor", 0.90, 5.0), _row("full", 0.897, 2.0), _row("saint", 0.80, 0.5)]
    w = pick_winner(rows, "acc")
    assert w["sampler"] == "full" and w["tied"] == ["neighbor"]
    clear = pick_winner([_row("neighbor", 0.95, 5.0), _row("full", 0.90, 1.0)], "acc")
    assert clear["sampler"] == "neighbor" and clear["tied"] == []
    assert pick_winner([_row("x", math.nan, 1.0)], "acc")["sampler"] is None


def test_agreement_says_why_not_with_the_comparisons_numbers():
    rows = [_row("neighbor", 0.95, 5.0, steps=30), _row("full", 0.90, 1.0, steps=30)]
    assert agreement("neighbor", pick_winner(rows, "acc"), rows, "acc").startswith("agrees with the plan")
    why = agreement("full", pick_winner(rows, "acc"), rows, "acc")
    assert "0.9000" in why and "0.9500" in why and "30 vs 30 steps" in why
    tied = [_row("neighbor", 0.90, 5.0), _row("full", 0.899, 9.0)]
    assert "tied with the winner neighbor" in agreement("full", pick_winner(tied, "acc"), tied, "acc")
    assert "did not run" in agreement("importance", pick_winner(tied, "acc"), tied, "acc")
    assert "one host is not enough" in agreement("distributed", pick_winner(tied, "acc"), tied, "acc")


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    from gnnscale.stages import profile

    tmp = tmp_path_factory.mktemp("profile_compare")
    # > 1,024 training nodes: the neighbour preset's epoch has 2 batches, so full-graph gets 2 epochs
    graph = build_graph(tmp, *TINY_SYNTHETIC, "data.num_nodes=2500")
    out = profile.run(
        compose("profile", f"graph_dir={graph}", f"run_dir={tmp / 'p'}", "profile.compare_samplers=true",
                "profile.samplers=[neighbor,full]", "profile.plots=false")
    )  # fmt: skip
    return out, tmp


def test_stage_compares_each_formation_and_names_a_winner(compared):
    out, tmp = compared
    saved = json.loads((tmp / "p" / "profile.json").read_text())
    c = saved["comparison"]
    assert [r["sampler"] for r in c["rows"]] == ["neighbor", "full"]
    num_train = saved["plan"]["graph"]["num_train"]
    neighbor, full = c["rows"]
    assert neighbor["epochs"] == 1 and neighbor["steps"] == math.ceil(num_train / 1024) == 2
    assert full["epochs"] == full["steps"] == neighbor["steps"]  # one step per full-graph epoch
    assert len(full["loss_curve"]) == full["epochs"]
    for r in c["rows"]:
        assert (tmp / "p" / "compare" / r["sampler"] / "metrics.jsonl").is_file()
    assert c["winner"]["sampler"] in ("neighbor", "full")
    planned = saved["recommendation"]["formation"]
    assert c["agreement"] == agreement(planned, c["winner"], c["rows"], c["metric"])


def test_plan_predicts_seeds_per_second_from_its_parts(compared):
    out, _ = compared
    speed, num_train = out["plan"]["speed"], out["plan"]["graph"]["num_train"]
    assert speed["seeds_per_s"] == pytest.approx(min(1024, num_train) / sum(speed["parts_s"].values()))
    assert all(v > 0 for v in speed["parts_s"].values())


def test_an_unknown_sampler_to_compare_exits_2(tmp_path):
    graph = build_graph(tmp_path, *TINY_SYNTHETIC)
    r = CliRunner().invoke(app, ["profile", f"graph_dir={graph}", f"run_dir={tmp_path / 'p'}",
                                 "profile.compare_samplers=true", "profile.samplers=[neighbor,bogus]"])  # fmt: skip
    assert r.exit_code == 2 and "profile.samplers=['bogus'] has no preset" in r.stderr
