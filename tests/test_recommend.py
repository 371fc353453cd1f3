"""gnnscale recommend: top-K non-neighbour partners from infer embeddings, checked against brute force."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.stages import recommend
from gnnscale.storage.csc import open_csc
from gnnscale.storage.graph_dir import GraphDir
from tests.conftest import TINY_SYNTHETIC, build_graph, compose

runner = CliRunner()


def write_infer_run(folder, graph_dir, emb: np.ndarray):
    """An infer run_dir as `gnnscale infer --layerwise` leaves it: embeddings.npy + emb_info.json."""
    folder.mkdir(parents=True)
    np.save(folder / "embeddings.npy", emb)
    info = {
        "file": "embeddings.npy",
        "shape": list(emb.shape),
        "dtype": str(emb.dtype),
        "mode": "layerwise",
        "node_order": "row i is node i",
        "graph_dir": str(graph_dir),
    }
    (folder / "emb_info.json").write_text(json.dumps(info))
    return folder


def random_emb(n: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    """Distinct random vectors: no two candidates tie on score."""
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def neighbour_mask(graph_dir) -> np.ndarray:
    """Dense [n, n]: True where an edge joins the pair in either direction (tiny graphs only)."""
    indptr, indices = open_csc(GraphDir(graph_dir))
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n), np.diff(indptr))
    adj = np.zeros((n, n), dtype=bool)
    adj[dst, indices] = True
    return adj | adj.T


def brute_force(emb: np.ndarray, graph_dir, k: int, metric: str = "ip", nodes=None):
    x = emb.astype(np.float64)
    if metric == "cosine":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    nodes = np.arange(len(x)) if nodes is None else np.asarray(nodes)
    score = x[nodes] @ x.T
    banned = neighbour_mask(graph_dir)[nodes]
    banned[np.arange(len(nodes)), nodes] = True
    score[banned] = -np.inf
    ids = np.argsort(-score, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(score, ids, axis=1)


def run_recommend(tmp_path, infer_dir, name: str, *overrides: str) -> tuple[dict, object]:
    out = tmp_path / "runs" / name
    summary = recommend.run(compose("recommend", f"infer_dir={infer_dir}", f"run_dir={out}", *overrides))
    return summary, out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """600-node undirected synthetic graph + random embeddings in an infer-like run_dir."""
    tmp = tmp_path_factory.mktemp("rec")
    graph_dir = build_graph(tmp, *TINY_SYNTHETIC)
    emb = random_emb(600)
    return graph_dir, emb, write_infer_run(tmp / "infer", graph_dir, emb)


@pytest.mark.parametrize("metric", ["ip", "cosine"])
def test_exact_equals_brute_force_and_skips_neighbours_and_self(tiny, tmp_path, metric):
    graph_dir, emb, infer_dir = tiny
    summary, out = run_recommend(tmp_path, infer_dir, metric, "recommend.k=10", f"recommend.metric={metric}")
    ids, scores = np.load(out / "recommendations.npy"), np.load(out / "scores.npy")
    assert ids.shape == (600, 10) and ids.dtype == np.int64 and scores.dtype == np.float32
    assert summary["index"]["kind"] == "exact" and summary["short_rows"] == 0
    banned = neighbour_mask(graph_dir)
    assert banned.sum() > 600 * 4  # the graph has neighbours to exclude
    assert not banned[np.arange(600)[:, None], ids].any()
    assert (ids != np.arange(600)[:, None]).all()
    want_ids, want_scores = brute_force(emb, graph_dir, 10, metric)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    assert summary["wall_time_s"] >= 0 and summary["peak_anon_mb"] is not None


def test_directed_graph_excludes_in_and_out_neighbours(tmp_path):
    graph_dir = build_graph(tmp_path, *TINY_SYNTHETIC, "data.make_undirected=false")
    indptr, indices = open_csc(GraphDir(graph_dir))
    dst = np.repeat(np.arange(600), np.diff(indptr))
    assert not set(zip(dst.tolist(), indices.tolist(), strict=True)) <= set(
        zip(indices.tolist(), dst.tolist(), strict=True)
    )  # some edge has no reverse: out-neighbours differ from in-neighbours
    emb = random_emb(600, seed=3)
    infer_dir = write_infer_run(tmp_path / "infer", graph_dir, emb)
    summary, out = run_recommend(tmp_path, infer_dir, "dir", "recommend.k=15", "recommend.chunk_size=100")
    assert summary["directed"] is True
    np.testing.assert_array_equal(np.load(out / "recommendations.npy"), brute_force(emb, graph_dir, 15)[0])
    assert not (out / ".neighbours").exists()  # the transposed adjacency was scratch


def test_small_chunks_and_node_subsets_give_the_same_rows(tiny, tmp_path):
    graph_dir, emb, infer_dir = tiny
    _, one = run_recommend(tmp_path, infer_dir, "one", "recommend.k=7")
    _, many = run_recommend(tmp_path, infer_dir, "many", "recommend.k=7", "recommend.chunk_size=37")
    np.testing.assert_array_equal(np.load(one / "recommendations.npy"), np.load(many / "recommendations.npy"))
    # BLAS blocks the inner products by batch shape: scores agree to float32 rounding, not bit for bit
    np.testing.assert_allclose(np.load(one / "scores.npy"), np.load(many / "scores.npy"), rtol=1e-6)
    picked = np.array([599, 0, 17, 17, 300])
    (tmp_path / "ids.txt").write_text("\n".join(map(str, picked)) + "\n")
    _, sub = run_recommend(
        tmp_path,
        infer_dir,
        "sub",
        "recommend.k=7",
        f"recommend.nodes={tmp_path / 'ids.txt'}",
        "recommend.chunk_size=2",
    )
    np.testing.assert_array_equal(np.load(sub / "nodes.npy"), picked)
    np.testing.assert_array_equal(
        np.load(sub / "recommendations.npy"), np.load(one / "recommendations.npy")[picked]
    )


def test_csv_holds_the_same_recommendations(tiny, tmp_path):
    graph_dir, emb, infer_dir = tiny
    _, out = run_recommend(
        tmp_path, infer_dir, "csv", "recommend.k=5", "recommend.nodes=[3,4]", "recommend.format=csv"
    )
    lines = (out / "recommendations.csv").read_text().splitlines()
    assert lines[0] == "node,rank,candidate,score" and len(lines) == 1 + 2 * 5
    want, _ = brute_force(emb, graph_dir, 5, nodes=[3, 4])
    got = np.array([int(line.split(",")[2]) for line in lines[1:]]).reshape(2, 5)
    np.testing.assert_array_equal(got, want)
    assert not (out / "recommendations.npy").exists()


def test_reported_recall_of_an_approximate_index_is_its_recall_against_exact(tiny, tmp_path):
    graph_dir, emb, infer_dir = tiny
    summary, out = run_recommend(
        tmp_path,
        infer_dir,
        "ivf",
        "recommend.k=10",
        "recommend.index=ivf",
        "recommend.nlist=15",
        "recommend.nprobe=1",
        "recommend.recall_sample=150",
    )
    assert summary["index"]["kind"] == "ivf" and summary["index"]["nprobe"] == 1
    rows = np.load(out / "recall_sample.npy")
    assert len(rows) == 150 and len(np.unique(rows)) == 150
    got = np.load(out / "recommendations.npy")[rows]
    want, _ = brute_force(emb, graph_dir, 10, nodes=rows)
    recall = np.mean([len(np.intersect1d(g[g >= 0], w)) / 10 for g, w in zip(got, want, strict=True)])
    assert 0 < recall < 0.9  # one list of 15 misses most true neighbours: the check is not vacuous
    assert summary["recall"]["recall_at_10"] == pytest.approx(recall, abs=1e-4)
    # Every returned candidate is still a non-neighbour and not the node itself.
    banned = neighbour_mask(graph_dir)
    valid = got >= 0
    assert not banned[rows[:, None].repeat(10, 1)[valid], got[valid]].any()


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_tuning_reaches_the_target_recall(tiny, tmp_path, kind):
    _, _, infer_dir = tiny
    summary, _ = run_recommend(
        tmp_path, infer_dir, kind, "recommend.k=10", f"recommend.index={kind}", "recommend.target_recall=0.97"
    )
    assert summary["recall"]["recall_at_10"] >= 0.97
    assert summary["tuning"][-1]["recall"] == summary["recall"]["recall_at_10"]
    assert all(t["recall"] < 0.97 for t in summary["tuning"][:-1])


@pytest.mark.parametrize(
    "override, expected",
    [
        ("recommend.nodes=[0,600]", "outside [0, 600)"),
        ("recommend.nodes=[-1]", "outside [0, 600)"),
        ("recommend.k=0", "recommend.k=0 must be between 1 and num_nodes - 1 = 599"),
        ("recommend.k=600", "recommend.k=600 must be between 1 and num_nodes - 1 = 599"),
        ("recommend.metric=l2", "recommend.metric=l2 is not one of ip, cosine"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny, tmp_path, override, expected):
    _, _, infer_dir = tiny
    result = runner.invoke(
        app, ["recommend", f"infer_dir={infer_dir}", f"run_dir={tmp_path / 'r'}", override]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_missing_or_mismatched_embeddings_are_exit_2(tiny, tmp_path):
    graph_dir, emb, _ = tiny
    cases = [
        ([f"infer_dir={tmp_path / 'nope'}"], "do not exist"),
        ([f"emb={tmp_path / 'nope.npy'}"], "do not exist"),
        (
            [f"infer_dir={write_infer_run(tmp_path / 'short', graph_dir, emb[:599])}"],
            "have 599 rows but the graph has 600 nodes",
        ),
    ]
    (tmp_path / "empty").mkdir()
    cases.append(([f"infer_dir={tmp_path / 'empty'}"], "holds no embeddings.npy"))
    for args, expected in cases:
        result = runner.invoke(app, ["recommend", *args, f"run_dir={tmp_path / 'r'}"])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], lines
        assert not (tmp_path / "r").exists()


def test_default_reads_the_newest_infer_run(tiny, tmp_path, monkeypatch):
    graph_dir, emb, _ = tiny
    monkeypatch.chdir(tmp_path)
    write_infer_run(tmp_path / "runs" / "infer" / "20260101-000000", graph_dir, random_emb(600, seed=9))
    newest = write_infer_run(tmp_path / "runs" / "infer" / "20260102-000000", graph_dir, emb)
    (tmp_path / "runs" / "infer" / "20260103-000000").mkdir()  # unfinished: no embeddings yet
    summary = recommend.run(compose("recommend", "run_dir=out", "recommend.k=5", "recommend.nodes=[1]"))
    assert summary["embeddings"] == str(Path("runs/infer/20260102-000000/embeddings.npy"))
    np.testing.assert_array_equal(
        np.load(tmp_path / "out" / "recommendations.npy"), brute_force(emb, graph_dir, 5, nodes=[1])[0]
    )
    assert newest.is_dir()
