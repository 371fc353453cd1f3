"""Incremental re-inference: reuse cached layers, recompute only what the change reaches, equal a full run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import ConfigError, DataError
from gnnscale.storage.csc import open_csc
from gnnscale.storage.graph_dir import GraphDir
from tests.conftest import TINY_SYNTHETIC, build_graph
from tests.test_infer_support import infer, make_ckpt

runner = CliRunner()


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("incr_graph"), *TINY_SYNTHETIC)


def edge_set(graph_dir) -> set:
    indptr, indices = open_csc(GraphDir(graph_dir))
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return set(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))


def random_changes(graph_dir, rng, feat_frac=0.01, add_frac=0.005, n_remove=4) -> dict:
    """1% of nodes get new features, 0.5% new (undirected) edges, a few existing edges go."""
    g = GraphDir(graph_dir)
    n, f = g.num_nodes, int(g.meta["feat_dim"])
    edges = edge_set(graph_dir)
    feat_nodes = rng.choice(n, max(1, int(feat_frac * n)), replace=False)
    add = set()
    while len(add) < max(1, int(add_frac * len(edges) / 2)):
        s, d = (int(v) for v in rng.choice(n, 2, replace=False))
        if (s, d) not in edges and (d, s) not in add:
            add.add((s, d))
    existing = sorted((s, d) for s, d in edges if s < d)
    remove = [existing[i] for i in rng.choice(len(existing), n_remove, replace=False)]
    return {
        "feat_nodes": feat_nodes.astype(np.int64),
        "feat": rng.standard_normal((len(feat_nodes), f)).astype(np.float32),
        "add_src": np.array([a for a, _ in add], dtype=np.int64),
        "add_dst": np.array([b for _, b in add], dtype=np.int64),
        "remove_src": np.array([a for a, _ in remove], dtype=np.int64),
        "remove_dst": np.array([b for _, b in remove], dtype=np.int64),
    }


def save(path, changes) -> str:
    np.savez(path, **changes)
    return str(path)


def layers(run_dir, num_layers):
    return [np.load(run_dir / "layers" / f"h_{i + 1}.npy") for i in range(num_layers)]


def affected_masks(graph_dir, changes, num_layers, arch="sage") -> list[np.ndarray]:
    """Per layer, the rows a change can reach, computed independently on the updated graph's own CSC:
    h_l(v) reads h_{l-1} of v and of its in-neighbours over v's in-edges; GCN also divides each message by
    its source's degree, so a node whose degree changed perturbs all of its out-neighbours."""
    indptr, indices = open_csc(GraphDir(graph_dir))
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    src = np.asarray(indices)
    n = len(indptr) - 1
    cur = np.zeros(n, bool)
    cur[changes.get("feat_nodes", [])] = True
    if arch == "mlp":  # features only: a row depends on its own features alone
        return [cur.copy() for _ in range(num_layers)]
    touched = np.zeros(n, bool)
    for k in ("add_src", "add_dst", "remove_src", "remove_dst"):
        touched[changes.get(k, [])] = True  # undirected: both endpoints are destinations of a changed edge
    if arch == "gcn":
        touched[dst[touched[src]]] = True
    out = []
    for _ in range(num_layers):
        nxt = cur.copy()
        nxt[dst[cur[src]]] = True
        cur = nxt | touched
        out.append(cur.copy())
    return out


def expected_affected(graph_dir, changes, num_layers, arch="sage") -> list[int]:
    """The affected set sizes computed independently, on the updated graph's own CSC."""
    return [int(m.sum()) for m in affected_masks(graph_dir, changes, num_layers, arch)]


def assert_unaffected_rows_are_base(run_dir, base_dir, full_dir, masks) -> None:
    """Row values, layer by layer: outside the independently computed affected set the update kept the base
    run's rows bit for bit (and they still equal a full recomputation, so the set is not too small); inside
    it, the rows equal the full recomputation on the updated graph and differ from the base run."""
    num_layers = len(masks)
    runs = (layers(run_dir, num_layers), layers(base_dir, num_layers), layers(full_dir, num_layers))
    trio = zip(*runs, masks, strict=True)
    for i, (u, b, f, m) in enumerate(trio, start=1):
        assert m.any() and not m.all(), f"layer {i}: the check needs rows on both sides"
        assert np.array_equal(u[~m], b[~m]), (
            f"layer {i}: a row outside the affected set is not the base run's"
        )
        assert np.abs(b[~m] - f[~m]).max() < 1e-5, (
            f"layer {i}: a row outside the set changed on the new graph"
        )
        assert np.abs(u[m] - f[m]).max() < 1e-5, f"layer {i}: an affected row differs from the full run"
        assert np.abs(b[m] - f[m]).max() > 1e-4, f"layer {i}: the change left every affected row as it was"


@pytest.mark.parametrize("arch, num_layers", [("sage", 2), ("gcn", 2)])
def test_update_equals_full_recompute(tmp_path, graph, arch, num_layers):
    ckpt = make_ckpt(tmp_path / "train", graph, arch=arch, num_layers=num_layers, steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}", "infer.batch_size=128")
    changes = random_changes(graph, np.random.default_rng(1))
    s = infer(
        tmp_path,
        "upd",
        f"infer.changes={save(tmp_path / 'c1.npz', changes)}",
        f"infer.base={tmp_path / 'base'}",
        f"infer.write_graph={tmp_path / 'g2'}",
        "infer.batch_size=64",
    )
    full = infer(tmp_path, "full", f"ckpt={ckpt}", f"graph_dir={tmp_path / 'g2'}", "infer.batch_size=128")
    upd_l, full_l, base_l = (
        layers(tmp_path / "upd", num_layers),
        layers(tmp_path / "full", num_layers),
        layers(tmp_path / "base", num_layers),
    )
    for u, f in zip(upd_l, full_l, strict=True):
        assert np.abs(u - f).max() < 1e-5
    assert (
        np.abs(
            np.load(tmp_path / "upd" / "embeddings.npy") - np.load(tmp_path / "full" / "embeddings.npy")
        ).max()
        < 1e-5
    )
    assert np.array_equal(
        np.load(tmp_path / "upd" / "predictions.npy"), np.load(tmp_path / "full" / "predictions.npy")
    )
    assert s["test_acc"] == full["test_acc"]
    # Only the affected rows were recomputed: the others are the base run's rows, bit for bit.
    changed_rows = [int((~np.all(u == b, axis=1)).sum()) for u, b in zip(upd_l, base_l, strict=True)]
    reported = [a["rows"] for a in s["affected"]]
    assert all(c <= r for c, r in zip(changed_rows, reported, strict=True))
    assert reported[0] < GraphDir(graph).num_nodes
    if arch == "sage":  # GCN adds the changed edges' sources' out-neighbours (degree normalisation)
        assert reported == expected_affected(tmp_path / "g2", changes, num_layers)
    masks = affected_masks(tmp_path / "g2", changes, num_layers, arch)
    assert reported == [int(m.sum()) for m in masks]
    assert_unaffected_rows_are_base(tmp_path / "upd", tmp_path / "base", tmp_path / "full", masks)
    emb = [np.load(tmp_path / r / "embeddings.npy") for r in ("upd", "base", "full")]
    m = masks[num_layers - 2]  # embeddings.npy: the last hidden layer's output
    assert np.array_equal(emb[0][~m], emb[1][~m]) and np.abs(emb[0][m] - emb[2][m]).max() < 1e-5
    assert [x["rows_computed"] for x in s["layers"]] == [r if r < 600 else 600 for r in reported]
    assert s["changes"]["edges_added"] == 2 * len(changes["add_src"]) and s["changes"][
        "edges_removed"
    ] == 2 * len(changes["remove_src"])
    info = json.loads((tmp_path / "upd" / "emb_info.json").read_text())
    assert info["base_run"] == str((tmp_path / "base").resolve()) and info["delta"]["edges_added"] == 2 * len(
        changes["add_src"]
    )


def test_chained_updates_compose(tmp_path, graph):
    ckpt = make_ckpt(tmp_path / "train", graph, num_layers=2, steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}")
    c1 = random_changes(graph, np.random.default_rng(2))
    infer(tmp_path, "u1", f"infer.changes={save(tmp_path / 'c1.npz', c1)}", f"infer.base={tmp_path / 'base'}")
    # The second change undoes part of the first: re-adds a removed edge, removes an added one.
    c2 = {
        "feat_nodes": np.concatenate([c1["feat_nodes"][:2], [7]]).astype(np.int64),
        "feat": np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32),
        "add_src": c1["remove_src"][:1],
        "add_dst": c1["remove_dst"][:1],
        "remove_src": c1["add_src"][:1],
        "remove_dst": c1["add_dst"][:1],
    }
    s = infer(
        tmp_path,
        "u2",
        f"infer.changes={save(tmp_path / 'c2.npz', c2)}",
        f"infer.base={tmp_path / 'u1'}",
        f"infer.write_graph={tmp_path / 'g3'}",
    )
    # The written graph is the stored one with both changes, in both directions.
    want = edge_set(graph)
    for ch in (c1, c2):
        for s_, d in zip(ch["remove_src"].tolist(), ch["remove_dst"].tolist(), strict=True):
            want -= {(s_, d), (d, s_)}
        for s_, d in zip(ch["add_src"].tolist(), ch["add_dst"].tolist(), strict=True):
            want |= {(s_, d), (d, s_)}
    assert edge_set(tmp_path / "g3") == want
    feat3 = np.concatenate([GraphDir(tmp_path / "g3").shard(i)["feat"].numpy() for i in range(3)])
    assert np.array_equal(feat3[7], c2["feat"][2]) and np.array_equal(
        feat3[c1["feat_nodes"][5]], c1["feat"][5]
    )
    infer(tmp_path, "full", f"ckpt={ckpt}", f"graph_dir={tmp_path / 'g3'}")
    for u, f in zip(layers(tmp_path / "u2", 2), layers(tmp_path / "full", 2), strict=True):
        assert np.abs(u - f).max() < 1e-5
    masks = affected_masks(tmp_path / "g3", c2, 2)
    assert_unaffected_rows_are_base(tmp_path / "u2", tmp_path / "u1", tmp_path / "full", masks)
    assert (
        s["changes"]["edges_added"] == 2
        and s["changes"]["edges_removed"] == 2
        and s["changes"]["feature_rows_changed"] == 3
    )


def test_bad_changes_are_refused(tmp_path, graph):
    ckpt = make_ckpt(tmp_path / "train", graph, steps=0)
    infer(tmp_path, "base", f"ckpt={ckpt}")
    base = f"infer.base={tmp_path / 'base'}"
    bad = [
        ({"bogus": np.zeros(1)}, DataError, "unknown key"),
        ({"feat_nodes": np.array([600])}, DataError, r"node id 600 outside \[0, 600\)"),
        (
            {"feat_nodes": np.array([1]), "feat": np.zeros((1, 3), np.float32)},
            DataError,
            r"'feat' has shape \(1, 3\), expected \(1, 8\)",
        ),
        ({"feat_nodes": np.array([1]), "feat": np.full((1, 8), np.nan, np.float32)}, DataError, "NaN"),
        ({"add_src": np.array([1, 2]), "add_dst": np.array([3])}, DataError, "different lengths"),
    ]
    s, d = next(iter(edge_set(graph)))
    missing = next((a, b) for a in range(600) for b in range(600) if a != b and (a, b) not in edge_set(graph))
    bad.append(
        (
            {"remove_src": np.array([missing[0]]), "remove_dst": np.array([missing[1]])},
            DataError,
            "not in the graph",
        )
    )
    for i, (content, exc, msg) in enumerate(bad):
        with pytest.raises(exc, match=msg):
            infer(tmp_path, f"bad{i}", f"infer.changes={save(tmp_path / f'b{i}.npz', content)}", base)
    other = make_ckpt(tmp_path / "other", graph, steps=0, seed=5)
    ok = save(tmp_path / "ok.npz", {"remove_src": np.array([s]), "remove_dst": np.array([d])})
    with pytest.raises(ConfigError, match="is not the model of base run"):
        infer(tmp_path, "wrong_ckpt", f"infer.changes={ok}", base, f"ckpt={other}")
    infer(tmp_path, "nocache", f"ckpt={ckpt}", "infer.cache_layers=false")
    with pytest.raises(ConfigError, match="kept no layer cache"):
        infer(tmp_path, "upd_nocache", f"infer.changes={ok}", f"infer.base={tmp_path / 'nocache'}")


def test_cli_update_uses_newest_cached_run(tmp_path, graph, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = make_ckpt(tmp_path / "train", graph, steps=0)
    assert runner.invoke(app, ["infer", f"ckpt={ckpt}", "run_dir=runs/infer/20990101-000000"]).exit_code == 0
    np.savez(tmp_path / "ch.npz", feat_nodes=np.array([3]), feat=np.ones((1, 8), np.float32))
    result = runner.invoke(
        app, ["infer", "--update", str(tmp_path / "ch.npz"), "run_dir=runs/infer/20990101-000001"]
    )
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "runs/infer/20990101-000001/emb_info.json").read_text())
    assert (
        info["base_run"].endswith("runs/infer/20990101-000000")
        and info["delta"]["feature_rows_replaced"] == 1
    )
    assert "rows recomputed per layer" in result.stdout


@pytest.mark.parametrize("chunk", [7, 1 << 22])
def test_patched_adjacency_matches_rebuilt_rows(monkeypatch, chunk):
    """In-edges of contiguous, dense and sparse batches, out-neighbours and out-degrees of a patched CSC
    equal those of the graph rebuilt with the same removals and additions (sources in id order)."""
    from gnnscale.inference import blocks

    monkeypatch.setattr(blocks, "_SCAN_CHUNK", chunk)  # small: exercise the row-block streaming
    rng = np.random.default_rng(0)
    n = 300
    edges: set = set()
    while len(edges) < 2500:
        edges.add(tuple(int(v) for v in rng.integers(0, n, 2)))
    base = sorted(edges, key=lambda e: (e[1], e[0]))
    src, dst = np.array([e[0] for e in base]), np.array([e[1] for e in base])
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    removed = np.sort(rng.choice(len(base), 200, replace=False))
    adds: set = set()
    while len(adds) < 300:
        e = tuple(int(v) for v in rng.integers(0, n, 2))
        if e not in edges:
            adds.add(e)
    adds = sorted(adds)
    adj = blocks.Adjacency(
        indptr, src, removed, np.array([a for a, _ in adds]), np.array([b for _, b in adds])
    )
    new = (edges - {base[i] for i in removed}) | set(adds)
    by_dst: dict = {}
    for a, b in new:
        by_dst.setdefault(b, []).append(a)
    for trial in range(150):
        k = int(rng.integers(1, 60))
        if trial % 3 == 0:
            lo = int(rng.integers(0, n - k))
            rows = np.arange(lo, lo + k)
        elif trial % 3 == 1:
            lo = int(rng.integers(0, n - 2 * k))
            rows = np.sort(rng.choice(np.arange(lo, lo + 2 * k), k, replace=False))
        else:
            rows = np.sort(rng.choice(n, k, replace=False))
        ip, s = adj.in_edges(rows)
        for i, r in enumerate(rows.tolist()):
            assert s[ip[i] : ip[i + 1]].tolist() == sorted(by_dst.get(r, []))
    mask = np.zeros(n, bool)
    mask[rng.choice(n, 20, replace=False)] = True
    want = np.zeros(n, bool)
    for a, b in new:
        want[b] |= mask[a]
    assert np.array_equal(adj.out_neighbours(mask), want)
    assert np.array_equal(adj.out_degrees(), np.bincount([a for a, _ in new], minlength=n))
