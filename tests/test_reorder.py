"""shard.reorder: a valid permutation, data that follows its node, outputs in the user's ids (issue 13)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.verify import check_files
from tests.conftest import TINY_SYNTHETIC, build_graph
from tests.test_infer_support import infer, make_ckpt
from tests.test_sources import load_graph

runner = CliRunner()


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The tiny synthetic graph sharded three ways (CSC built)."""
    return {
        m: build_graph(tmp_path_factory.mktemp(f"reorder_{m}"), *TINY_SYNTHETIC, f"shard.reorder={m}")
        for m in ("none", "degree", "rcm")
    }


def _order(graph_dir):
    folder = graph_dir / "node_order"
    return np.load(folder / "new_to_old.npy"), np.load(folder / "old_to_new.npy")


def _edges(got: dict) -> set[tuple[int, int]]:
    dst = np.repeat(np.arange(len(got["indptr"]) - 1), np.diff(got["indptr"]))
    return set(zip(got["indices"].tolist(), dst.tolist(), strict=True))


@pytest.mark.parametrize("method", ["degree", "rcm"])
def test_permutation_and_meta(graphs, method):
    n2o, o2n = _order(graphs[method])
    n = len(n2o)
    assert n2o.dtype == o2n.dtype == np.int64 and n == 600
    assert np.array_equal(np.sort(n2o), np.arange(n)) and np.array_equal(o2n[n2o], np.arange(n))
    meta = json.loads((graphs[method] / "meta.json").read_text())
    assert meta["node_order"]["method"] == method and set(meta["node_order"]["sha256"]) == {
        "new_to_old.npy",
        "old_to_new.npy",
    }
    # the map is covered by verify like the shards: recorded, hashed, and a changed byte is caught
    checks = {c.file: c for c in check_files(graphs[method], "full")}
    assert checks["node_order/new_to_old.npy"].status == "ok (hashed)"
    assert json.loads((graphs["none"] / "meta.json").read_text())["node_order"] == {"method": "none"}


def test_degree_sorts_in_degree_descending(graphs):
    got = load_graph(graphs["degree"])
    deg = np.diff(got["indptr"])
    assert (np.diff(deg) <= 0).all() and deg[0] > deg[-1]
    n2o, _ = _order(graphs["degree"])
    ref = np.diff(load_graph(graphs["none"])["indptr"])
    assert np.array_equal(deg, ref[n2o])  # in-degree of the node itself, not of a row position
    ties = deg[1:] == deg[:-1]
    assert (n2o[1:][ties] > n2o[:-1][ties]).all()  # stable: ties by original id


def test_rcm_is_scipys_and_reduces_bandwidth(graphs):
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    def bandwidth(got):
        dst = np.repeat(np.arange(len(got["indptr"]) - 1), np.diff(got["indptr"]))
        return np.abs(got["indices"] - dst).mean()

    ref, got = load_graph(graphs["none"]), load_graph(graphs["rcm"])
    n = len(ref["indptr"]) - 1
    adj = sp.csr_matrix((np.ones(len(ref["indices"])), ref["indices"], ref["indptr"]), shape=(n, n))
    n2o, _ = _order(graphs["rcm"])
    assert np.array_equal(n2o, reverse_cuthill_mckee(adj, symmetric_mode=True))
    assert bandwidth(got) < 0.8 * bandwidth(ref)  # a random graph: RCM helps little, but it helps


@pytest.mark.parametrize("method", ["degree", "rcm"])
def test_data_follows_its_node(graphs, method):
    ref, got = load_graph(graphs["none"]), load_graph(graphs[method])
    n2o, o2n = _order(graphs[method])
    for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(got[key], ref[key][n2o], err_msg=key)
    assert got["meta"]["splits"] == ref["meta"]["splits"]
    mapped = {(int(n2o[s]), int(n2o[d])) for s, d in _edges(got)}
    assert mapped == _edges(ref)


def _hetero_npz(path, n=120, seed=3):
    rng = np.random.default_rng(seed)
    masks = rng.random((2, 3, n)) < 0.3  # two published splits of train / val / test
    train, val, test = masks[1]
    val &= ~train
    test &= ~(train | val)
    np.savez(
        path,
        node_features=rng.standard_normal((n, 5)).astype(np.float32),
        node_labels=rng.integers(0, 3, n),
        edges=rng.integers(0, n, (500, 2)),
        train_masks=np.stack([masks[0][0], train]),
        val_masks=np.stack([masks[0][1], val]),
        test_masks=np.stack([masks[0][2], test]),
    )
    return path


@pytest.mark.parametrize("directed", [False, True])
def test_source_split_follows_its_node(tmp_path, directed):
    path = _hetero_npz(tmp_path / "toy.npz")
    common = ("data=npz", f"data.path={path}", "data.split_index=1", "shard.nodes_per_shard=50")
    common += (f"data.make_undirected={str(not directed).lower()}",)
    ref = load_graph(build_graph(tmp_path / "a", *common))
    for method in ("degree", "rcm"):
        gdir = build_graph(tmp_path / method, *common, f"shard.reorder={method}")
        got, (n2o, _) = load_graph(gdir), _order(gdir)
        assert got["meta"]["splits"]["origin"] == "source"
        for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
            np.testing.assert_array_equal(got[key], ref[key][n2o], err_msg=f"{method} {key}")
        assert {(int(n2o[s]), int(n2o[d])) for s, d in _edges(got)} == _edges(ref)


def test_bad_value_exits_2(tmp_path):
    res = runner.invoke(app, ["shard", f"graph_dir={tmp_path / 'g'}", "shard.reorder=bogus"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "shard.reorder='bogus'" in lines[0] and "none|degree|rcm" in lines[0]
    assert not (tmp_path / "g").exists()


def test_fingerprint_changes_with_reorder():
    from gnnscale.config.compose import compose_config
    from gnnscale.datasets import source_fingerprint

    fps = {m: source_fingerprint(compose_config("shard", [f"shard.reorder={m}"])) for m in ("none", "degree")}
    assert fps["none"] != fps["degree"]


# ---------------------------------------------------------------- outputs in the user's ids
@pytest.fixture(scope="module")
def ckpt(graphs, tmp_path_factory):
    """Trained once, on the original order; the same weights are run on every order."""
    return make_ckpt(tmp_path_factory.mktemp("reorder_train"), graphs["none"])


@pytest.mark.parametrize("method", ["degree", "rcm"])
def test_layerwise_infer_invisible(tmp_path, graphs, ckpt, method):
    """Issue 13's acceptance: infer outputs on a reordered graph_dir equal those on the original order."""
    runs = {}
    for m in ("none", method):
        s = infer(
            tmp_path,
            m,
            f"ckpt={ckpt}",
            f"graph_dir={graphs[m]}",
            "infer.batch_size=97",
            "infer.probabilities=true",
            "infer.split=test",
        )
        runs[m] = (tmp_path / m, s)
    (a, sa), (b, sb) = runs["none"], runs[method]
    np.testing.assert_allclose(np.load(b / "embeddings.npy"), np.load(a / "embeddings.npy"), atol=1e-4)
    np.testing.assert_allclose(np.load(b / "probabilities.npy"), np.load(a / "probabilities.npy"), atol=1e-5)
    assert np.array_equal(np.load(b / "predictions.npy"), np.load(a / "predictions.npy"))
    assert sa["metric"] == sb["metric"]
    info = json.loads((b / "emb_info.json").read_text())
    assert "user's node id" in info["node_order"] and method in info["node_order"]
    # the cached layers stay in graph_dir's order (what --update reads)
    n2o, _ = _order(graphs[method])
    np.testing.assert_allclose(
        np.load(b / "layers" / "h_1.npy"), np.load(a / "layers" / "h_1.npy")[n2o], atol=1e-4
    )


def test_sampled_infer_takes_and_gives_user_ids(tmp_path, graphs, ckpt):
    ids = np.array([5, 599, 0, 321], dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    for m in ("none", "degree"):
        infer(
            tmp_path,
            m,
            f"ckpt={ckpt}",
            f"graph_dir={graphs[m]}",
            "infer.mode=sampled",
            f"infer.nodes={tmp_path / 'ids.npy'}",
            "infer.fanouts=[-1,-1]",
        )
    for m in ("none", "degree"):
        assert np.array_equal(np.load(tmp_path / m / "node_ids.npy"), ids)
    # full fanouts: the same neighbourhoods, so the same embeddings
    np.testing.assert_allclose(
        np.load(tmp_path / "degree" / "embeddings.npy"),
        np.load(tmp_path / "none" / "embeddings.npy"),
        atol=1e-4,
    )
    # a split comes in the user's id order, and is the same set of nodes on either order
    for m in ("none", "degree"):
        infer(tmp_path, f"{m}_val", f"ckpt={ckpt}", f"graph_dir={graphs[m]}", "infer.mode=sampled",
              "infer.nodes=val", "infer.fanouts=[-1,-1]")  # fmt: skip
    val = [np.load(tmp_path / f"{m}_val" / "node_ids.npy") for m in ("none", "degree")]
    assert np.array_equal(val[0], val[1]) and (np.diff(val[0]) > 0).all()


def test_recommend_in_user_ids(tmp_path, graphs, ckpt):
    """Queries, partners and the neighbour exclusion all in the user's ids: same output on either order."""
    from gnnscale.config.compose import compose_config
    from gnnscale.stages import recommend

    for m in ("none", "degree"):
        infer(tmp_path, f"inf_{m}", f"ckpt={ckpt}", f"graph_dir={graphs[m]}")
        for name, nodes in (("all", []), ("some", ["recommend.nodes=[3,17,400]"])):
            overrides = [f"infer_dir={tmp_path / f'inf_{m}'}", f"run_dir={tmp_path / f'rec_{m}_{name}'}"]
            recommend.run(compose_config("recommend", [*overrides, "recommend.k=5", *nodes]))
    for name in ("all", "some"):
        a, b = tmp_path / f"rec_none_{name}", tmp_path / f"rec_degree_{name}"
        assert np.array_equal(np.load(a / "recommendations.npy"), np.load(b / "recommendations.npy")), name
        np.testing.assert_allclose(np.load(a / "scores.npy"), np.load(b / "scores.npy"), atol=1e-4)
    assert np.load(tmp_path / "rec_degree_some" / "recommendations.npy").shape == (3, 5)


def test_verify_catches_a_changed_map(tmp_path):
    gdir = build_graph(tmp_path, *TINY_SYNTHETIC, "shard.reorder=degree", csc=False)
    path = gdir / "node_order" / "old_to_new.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    res = runner.invoke(app, ["verify", f"graph_dir={gdir}"])
    assert res.exit_code == 2 and "old_to_new.npy" in res.output
    GraphDir(gdir)  # meta itself still reads


def test_pipeline_does_not_reuse_another_order(graphs):
    """pipeline's up-to-date check: a graph_dir sharded with another shard.reorder is not taken as current."""
    from gnnscale.config.compose import compose_config
    from gnnscale.errors import GraphDirError
    from gnnscale.pipeline.plan import graph_up_to_date

    def cfg(method):
        return compose_config(
            "pipeline", [f"graph_dir={graphs[method]}", *TINY_SYNTHETIC, f"shard.reorder={method}"]
        )

    assert graph_up_to_date("shard", cfg("none")) and graph_up_to_date("shard", cfg("degree"))
    other = compose_config(
        "pipeline", [f"graph_dir={graphs['none']}", *TINY_SYNTHETIC, "shard.reorder=degree"]
    )
    with pytest.raises(GraphDirError, match="different data config"):
        graph_up_to_date("shard", other)


def test_update_on_a_reordered_graph_takes_user_ids(tmp_path, graphs, ckpt):
    """--update's changes.npz names the user's ids: on a degree-ordered graph_dir the updated embeddings and
    predictions equal those of the same update on the original order, and the graph it writes keeps the
    map (a full infer of it gives the same outputs again)."""
    rng = np.random.default_rng(5)
    n = GraphDir(graphs["none"]).num_nodes
    ref = load_graph(graphs["none"])
    dst = np.repeat(np.arange(n), np.diff(ref["indptr"]))
    gone = rng.choice(len(dst), 3, replace=False)
    np.savez(
        tmp_path / "c.npz",
        add_src=rng.integers(0, n, 4),
        add_dst=rng.integers(0, n, 4),
        remove_src=ref["indices"][gone],
        remove_dst=dst[gone],
        feat_nodes=np.array([3, 77, 401]),
        feat=rng.standard_normal((3, ref["feat"].shape[1])).astype(np.float32),
    )
    for m in ("none", "degree"):
        infer(tmp_path, f"base_{m}", f"ckpt={ckpt}", f"graph_dir={graphs[m]}")
        s = infer(
            tmp_path,
            f"upd_{m}",
            f"infer.changes={tmp_path / 'c.npz'}",
            f"infer.base={tmp_path / f'base_{m}'}",
            f"infer.write_graph={tmp_path / f'g2_{m}'}",
        )
        assert s["changes"]["edges_removed"] == 6 and s["changes"]["feature_rows_changed"] == 3
    outputs = ("embeddings.npy", "predictions.npy")
    a, b = tmp_path / "upd_none", tmp_path / "upd_degree"
    np.testing.assert_allclose(np.load(b / outputs[0]), np.load(a / outputs[0]), atol=1e-4)
    assert np.array_equal(np.load(b / outputs[1]), np.load(a / outputs[1]))
    assert not np.allclose(np.load(a / outputs[0]), np.load(tmp_path / "base_none" / outputs[0]), atol=1e-4)
    written = GraphDir(tmp_path / "g2_degree")
    assert written.node_order.method == "degree"
    assert np.array_equal(written.node_order.new_to_old, _order(graphs["degree"])[0])
    assert {c.status for c in check_files(written.path, "full")} <= {"ok (hashed)", "ok"}
    infer(tmp_path, "full_degree", f"ckpt={ckpt}", f"graph_dir={written.path}")
    np.testing.assert_allclose(
        np.load(tmp_path / "full_degree" / outputs[0]), np.load(a / outputs[0]), atol=1e-4
    )
