"""`gnnscale pipeline task=link`: shard -> build-csr -> train -> infer -> recommend, its headline (test Hits@K and
example recommendations), reuse of every stage, and recommend refused for task=node."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.pipeline.plan import check_stages
from gnnscale.pipeline.report import summary_rows
from gnnscale.stages import pipeline
from gnnscale.storage.run_dir import KEY_FILE
from gnnscale.tasks.link_metrics import LINK_METRICS
from tests.conftest import TINY_SYNTHETIC, compose

runner = CliRunner()
STAGES = ["shard", "build_csr", "train", "infer", "recommend"]
# 600 unlabelled nodes in 20 tight communities; one short epoch of the tiny SAGE, 50 sampled eval negatives.
LINK = (
    *(o for o in TINY_SYNTHETIC if not o.startswith("data.num_classes=")),
    "data.num_classes=20",
    "data.homophily=0.95",
    "data.labels=false",
    "task=link",
    "+exp=debug_tiny",
    "train.epochs=1",
    "task.eval_negatives=50",
    "recommend.k=5",
)


def args(root, name, *extra) -> list[str]:
    return ["pipeline", f"graph_dir={root / 'graph'}", f"run_dir={root / 'runs' / name}", *LINK, *extra]


def skipped(summary) -> dict:
    return {stage: bool(result.get("skipped")) for stage, result in summary["stages"].items()}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The command as a user runs it: its printed table, and the summary.json it leaves."""
    root = tmp_path_factory.mktemp("pipe_link")
    result = runner.invoke(app, args(root, "first"))
    assert result.exit_code == 0, result.output
    return root, result.output, json.loads((root / "runs" / "first" / "summary.json").read_text())


def test_link_pipeline_trains_infers_and_recommends(first):
    root, _, s = first
    assert list(s["stages"]) == STAGES and not any(skipped(s).values())
    rec_dir = root / "runs" / "first" / "recommend"
    assert s["stages"]["recommend"]["run_dir"] == str(rec_dir)
    # recommend read this pipeline's embeddings, of every node
    assert s["stages"]["recommend"]["embeddings"] == str(
        (root / "runs" / "first" / "infer").resolve() / "embeddings.npy"
    )
    recs, scores = np.load(rec_dir / "recommendations.npy"), np.load(rec_dir / "scores.npy")
    assert recs.shape == scores.shape == (600, 5)
    assert (recs != np.arange(600)[:, None]).all() and np.isfinite(scores).all()
    # keyed like train and infer; given only its own config
    key = json.loads((rec_dir / KEY_FILE).read_text())
    assert (
        key["stage"] == "recommend"
        and key["graph_sha256"]
        == json.loads((root / "runs" / "first" / "infer" / KEY_FILE).read_text())["graph_sha256"]
    )
    rcfg = OmegaConf.load(rec_dir / "config.yaml")
    assert rcfg["infer_dir"] == str((root / "runs" / "first" / "infer").resolve())
    assert "train" not in rcfg and "stages" not in rcfg and rcfg["recommend"]["k"] == 5


def test_headline_has_the_test_ranking_metrics_and_example_recommendations(first):
    root, printed, s = first
    h, tr = s["headline"], s["stages"]["train"]
    assert h["task"] == "link" and h["eval_negatives"] == 50
    assert h["link_test"] == {m: tr[f"test_{m}"] for m in LINK_METRICS}
    assert all(0.0 <= h["link_test"][m] <= 1.0 for m in LINK_METRICS)
    rec_dir = root / "runs" / "first" / "recommend"
    assert h["recommendations"] == str(rec_dir / "recommendations.npy") and h["recommend_k"] == 5
    recs, scores = np.load(rec_dir / "recommendations.npy"), np.load(rec_dir / "scores.npy")
    assert [e["node"] for e in h["examples"]] == [0, 1, 2]
    for e in h["examples"]:  # read back from the outputs: the node's row, best first
        assert [p[0] for p in e["partners"]] == recs[e["node"]].tolist()
        assert [p[1] for p in e["partners"]] == pytest.approx(scores[e["node"]].tolist())
    rows = summary_rows(s)
    assert "test auc / mrr (50 sampled negatives each)" in rows and "test hits@10/50/100" in rows
    assert rows["test hits@10/50/100"] == " / ".join(f"{h['link_test'][m]:.4f}" for m in LINK_METRICS[2:])
    assert rows["node 0: top 5"].startswith(f"{recs[0, 0]} (")
    assert not any(k.startswith("test acc") for k in rows)  # a link model has no class predictions
    flat = " ".join(printed.split())  # the table as printed (wrapped at the terminal's width)
    assert "hits@10/50/100" in flat and "node 2: top 5" in flat and "recommend" in flat


def test_second_run_reuses_every_stage(first):
    root, _, s1 = first
    s2 = pipeline.run(compose(*args(root, "second")))
    assert skipped(s2) == dict.fromkeys(STAGES, True)
    for stage in ("train", "infer", "recommend"):
        assert s2["stages"][stage]["run_dir"] == s1["stages"][stage]["run_dir"]
    assert s2["headline"]["link_test"] == s1["headline"]["link_test"]
    assert s2["headline"]["examples"] == s1["headline"]["examples"]
    assert not (root / "runs" / "second" / "recommend").exists()


def test_recommend_alone_finds_the_embeddings_and_reruns_for_another_k(first):
    root, _, s1 = first
    s = pipeline.run(compose(*args(root, "k3", "stages=[recommend]", "recommend.k=3")))
    assert list(s["stages"]) == ["recommend"] and not skipped(s)["recommend"]
    assert s["stages"]["recommend"]["embeddings"] == s1["stages"]["recommend"]["embeddings"]
    assert np.load(root / "runs" / "k3" / "recommend" / "recommendations.npy").shape == (600, 3)
    assert all(len(e["partners"]) == 3 for e in s["headline"]["examples"])


def test_csv_recommendations_give_the_same_examples(first):
    root, _, s1 = first
    s = pipeline.run(compose(*args(root, "csv", "stages=[recommend]", "recommend.format=csv")))
    h, h1 = s["headline"], s1["headline"]
    assert h["recommendations"] == str(root / "runs" / "csv" / "recommend" / "recommendations.csv")
    assert [e["node"] for e in h["examples"]] == [e["node"] for e in h1["examples"]]
    for e, e1 in zip(h["examples"], h1["examples"], strict=True):
        assert [p[0] for p in e["partners"]] == [p[0] for p in e1["partners"]]
        assert [p[1] for p in e["partners"]] == pytest.approx([p[1] for p in e1["partners"]], rel=1e-5)


def test_recommend_is_a_default_stage_only_for_task_link():
    assert check_stages(compose("pipeline")) == ["shard", "build_csr", "partition", "train", "infer"]
    assert check_stages(compose("pipeline", "task=link"))[-2:] == ["infer", "recommend"]
    assert check_stages(compose("pipeline", "+exp=sage_link"))[-1] == "recommend"
    # stages given: exactly those
    assert check_stages(compose("pipeline", "task=link", "stages=[shard,build_csr]")) == [
        "shard",
        "build_csr",
    ]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["stages=[shard,build_csr,train,infer,recommend]"],
            "has recommend, which needs a link-prediction model",
        ),
        (["task=link", "recommend.metric=l2"], "recommend.metric=l2 is not one of ip, cosine"),
        (["task=link", "stages=[recommend,infer]"], "must name each stage once, in pipeline order"),
    ],
)
def test_bad_recommend_stages_are_one_line_exit_2(tmp_path, overrides, expected):
    result = runner.invoke(app, ["pipeline", *overrides, f"run_dir={tmp_path / 'run'}"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert not (tmp_path / "run").exists()  # checked before any folder is made
