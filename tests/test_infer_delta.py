"""Delta propagation for linear aggregators: an update equals a full recomputation on the updated graph.

Every case runs a base layer-wise run, an update (new features, added and removed edges) that also writes
the updated graph, and a full run on that graph; layers must agree within 1e-5 and rows outside the
affected sets must be the base run's, bit for bit.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from gnnscale.inference import update as upd
from gnnscale.inference.blocks import Adjacency
from gnnscale.inference.layerfile import LayerFile
from gnnscale.inference.layerwise import finish_layer
from gnnscale.inference.propagate import InEdgeChange
from gnnscale.inference.streamfile import StreamReader, StreamWriter
from gnnscale.models.checkpoint import load_model
from tests.conftest import TINY_SYNTHETIC, build_graph
from tests.test_infer_incremental import (
    affected_masks,
    assert_unaffected_rows_are_base,
    layers,
    random_changes,
    save,
)
from tests.test_infer_support import infer, make_ckpt


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("delta_graph"), *TINY_SYNTHETIC)


def force(monkeypatch, method: str | None) -> None:
    """delta: every layer a delta can reach; full: none. None: the cost model decides."""
    if method == "delta":
        monkeypatch.setattr(upd, "DELTA_MAX_CHANGED", 1.0)
        monkeypatch.setattr(upd, "delta_cost", lambda *a, **k: (0.0, 1.0))
    elif method == "full":
        monkeypatch.setattr(upd, "delta_cost", lambda *a, **k: (1.0, 0.0))
        monkeypatch.setattr(upd, "_FULL_IN_UPDATE", 0.0)  # its full layers, not a full run (tested below)


def pin_base_time(base_dir, seconds: float) -> None:
    """The base run's measured time, which an update's whole-run choice compares its estimate with: on a
    tiny graph both are milliseconds, and the choice would follow the machine's noise."""
    summary = base_dir / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "infer_time_s": seconds}))


def run_case(tmp_path, graph, ckpt, changes, num_layers, base="base", name="upd", batch=64):
    s = infer(
        tmp_path,
        name,
        f"infer.changes={save(tmp_path / f'{name}.npz', changes)}",
        f"infer.base={tmp_path / base}",
        f"infer.write_graph={tmp_path / (name + '_graph')}",
        f"infer.batch_size={batch}",
    )
    infer(tmp_path, name + "_full", f"ckpt={ckpt}", f"graph_dir={tmp_path / (name + '_graph')}")
    got, want = layers(tmp_path / name, num_layers), layers(tmp_path / (name + "_full"), num_layers)
    for i, (u, f) in enumerate(zip(got, want, strict=True)):
        assert np.abs(u - f).max() < 1e-5, f"layer {i + 1}: {np.abs(u - f).max()}"
    assert np.array_equal(
        np.load(tmp_path / name / "predictions.npy"), np.load(tmp_path / (name + "_full") / "predictions.npy")
    )
    return s


def assert_untouched_rows_are_base(tmp_path, name, base, changes, summary, num_layers, arch="sage"):
    run_dir, base_dir = tmp_path / name, tmp_path / base
    for i, (u, b) in enumerate(zip(layers(run_dir, num_layers), layers(base_dir, num_layers), strict=True)):
        differ = np.flatnonzero(~np.all(u == b, axis=1))
        assert len(differ) <= summary["affected"][i]["rows"], f"layer {i + 1}"
    # The rows themselves, against an affected set derived from the updated graph, not the code's own count.
    masks = affected_masks(tmp_path / f"{name}_graph", changes, num_layers, arch)
    assert_unaffected_rows_are_base(run_dir, base_dir, tmp_path / f"{name}_full", masks)


@pytest.mark.parametrize(
    "aggregator, norm, num_layers, method",
    [
        ("mean", "batch", 2, "delta"),
        ("mean", "none", 3, "delta"),
        ("gcn", "batch", 2, "delta"),
        ("gcn", "layer", 3, "delta"),
        ("mean", "batch", 3, None),
        ("mean", "batch", 2, "full"),
    ],
)
def test_delta_update_equals_full_recompute(
    tmp_path, graph, monkeypatch, aggregator, norm, num_layers, method
):
    force(monkeypatch, method)
    ckpt = make_ckpt(
        tmp_path / "train", graph, aggregator=aggregator, norm=norm, num_layers=num_layers, steps=3
    )
    infer(tmp_path, "base", f"ckpt={ckpt}", "infer.batch_size=128")
    pin_base_time(tmp_path / "base", 1e9)  # the per-layer paths under test, not a full run
    changes = random_changes(graph, np.random.default_rng(7), n_remove=6)
    s = run_case(tmp_path, graph, ckpt, changes, num_layers)
    methods = [x["method"] for x in s["layers"]]
    if method == "delta":
        assert methods == ["delta"] * num_layers
        assert s["layers"][0]["rows_projected"] == len(changes["feat_nodes"])
        assert s["layers"][0]["changed_edges"] == 2 * (len(changes["add_src"]) + len(changes["remove_src"]))
    elif method == "full":
        assert "delta" not in methods
    else:
        assert methods[0] == "delta"
    assert [x["rows_computed"] for x in s["layers"]] == [a["rows"] for a in s["affected"]]
    assert_untouched_rows_are_base(tmp_path, "upd", "base", changes, s, num_layers)
    # The update's cache is complete: conv outputs for every hidden layer, as for a full run.
    info = json.loads((tmp_path / "upd" / "emb_info.json").read_text())
    assert info["cache"]["preact"] == [f"z_{i + 1}.npy" for i in range(num_layers - 1)]


def test_update_price_adds_what_the_delta_estimate_leaves_out():
    plan = [("delta", {"estimated_s": {"delta": 0.5, "full": 9.0}}), ("full", {}), ("reused", {})]
    affected = [np.arange(10), np.arange(1000), np.arange(0)]
    want = 0.5 + 1000 * 16 * upd._STREAM + 10 * 16 * upd._FIRST_ROW + 2.0 * upd._FULL_IN_UPDATE
    assert upd.update_seconds(plan, 1000, (8, 16, 16, 4), affected, [1.0, 2.0, 3.0]) == pytest.approx(want)
    assert upd.update_seconds(plan, 1000, (8, 16, 16, 4), affected, None) is None  # no measured full run
    rows = [("rows", {}), ("full", {}), ("full", {})]
    assert upd.update_seconds(rows, 1000, (8, 16, 16, 4), affected, [1.0, 2.0, 3.0]) is None


@pytest.mark.parametrize("base_s, path", [(1e-9, "full run"), (1e9, "update")])
def test_update_or_full_run_whichever_is_estimated_faster(tmp_path, graph, monkeypatch, base_s, path):
    """The same change, the base run's measured time set below and above any estimate: the choice flips,
    and either way the layers equal a full recomputation on the updated graph."""
    force(monkeypatch, "delta")
    ckpt = make_ckpt(tmp_path / "train", graph, num_layers=2, steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}", "infer.batch_size=128")
    pin_base_time(tmp_path / "base", base_s)
    changes = random_changes(graph, np.random.default_rng(7), n_remove=6)
    s = run_case(tmp_path, graph, ckpt, changes, 2, batch=128)  # the base run's batches: see _choose
    assert s["choice"]["path"] == path and s["choice"]["full_run_s"] == base_s
    assert (s["choice"]["estimated_update_s"] > base_s) == (path == "full run")
    methods = [x["method"] for x in s["layers"]]
    if path == "full run":
        assert methods == ["full run"] * 2
        assert [x["rows_computed"] for x in s["layers"]] == [600, 600]  # every row, not the affected ones
    else:
        assert methods == ["delta"] * 2
    assert_untouched_rows_are_base(tmp_path, "upd", "base", changes, s, 2)
    info = json.loads((tmp_path / "upd" / "emb_info.json").read_text())
    assert info["cache"]["preact"] == ["z_1.npy"]  # the next update can propagate through either run


def test_cached_layers_are_their_conv_outputs_finished(tmp_path, graph):
    """h_l = finish(z_l) row by row, bit for bit: what lets a delta pass skip reading h back."""
    ckpt = make_ckpt(tmp_path / "train", graph, num_layers=3, norm="layer", steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}", "infer.batch_size=97")
    model = load_model(ckpt).model
    info = json.loads((tmp_path / "base" / "emb_info.json").read_text())
    assert (
        info["cache"]["preact"] == ["z_1.npy", "z_2.npy"]
        and info["cache"]["preact_bytes"] >= 2 * 600 * 16 * 4
    )
    for i in range(2):
        z = torch.from_numpy(np.load(tmp_path / "base" / "layers" / f"z_{i + 1}.npy"))
        h = np.load(tmp_path / "base" / "layers" / f"h_{i + 1}.npy")
        with torch.no_grad():
            assert np.array_equal(finish_layer(model, i, z[:50].clone()).numpy(), h[:50])
            assert np.array_equal(finish_layer(model, i, z.clone()).numpy(), h)


def test_chained_delta_updates(tmp_path, graph, monkeypatch):
    force(monkeypatch, "delta")
    ckpt = make_ckpt(tmp_path / "train", graph, num_layers=3, steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}")
    c1 = random_changes(graph, np.random.default_rng(11))
    run_case(tmp_path, graph, ckpt, c1, 3, base="base", name="u1")
    # the second update undoes part of the first and changes some of the same features again
    c2 = {
        "feat_nodes": np.concatenate([c1["feat_nodes"][:2], [9]]).astype(np.int64),
        "feat": np.random.default_rng(12).standard_normal((3, 8)).astype(np.float32),
        "add_src": c1["remove_src"][:2],
        "add_dst": c1["remove_dst"][:2],
        "remove_src": c1["add_src"][:2],
        "remove_dst": c1["add_dst"][:2],
    }
    s = run_case(tmp_path, graph, ckpt, c2, 3, base="u1", name="u2")
    assert [x["method"] for x in s["layers"]] == ["delta"] * 3
    assert_untouched_rows_are_base(tmp_path, "u2", "u1", c2, s, 3)


@pytest.mark.parametrize("arch, aggregator", [("sage", "pool"), ("mlp", "mean")])
def test_other_layers_recompute_rows_exactly(tmp_path, graph, arch, aggregator):
    ckpt = make_ckpt(tmp_path / "train", graph, arch=arch, aggregator=aggregator, num_layers=2, steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}")
    assert json.loads((tmp_path / "base" / "emb_info.json").read_text())["cache"]["preact"] == []
    changes = random_changes(graph, np.random.default_rng(3))
    s = run_case(tmp_path, graph, ckpt, changes, 2)
    assert all(x["method"] in ("rows", "full") for x in s["layers"])
    assert_untouched_rows_are_base(tmp_path, "upd", "base", changes, s, 2, arch)


def test_base_without_conv_outputs_falls_back(tmp_path, graph):
    """A base run from before conv outputs were cached: recompute, and leave a cache the next update can use."""
    ckpt = make_ckpt(tmp_path / "train", graph, num_layers=2, steps=3)
    infer(tmp_path, "base", f"ckpt={ckpt}")
    info_path = tmp_path / "base" / "emb_info.json"
    info = json.loads(info_path.read_text())
    for f in info["cache"].pop("preact"):
        (tmp_path / "base" / "layers" / f).unlink()
    info_path.write_text(json.dumps(info))
    changes = random_changes(graph, np.random.default_rng(4))
    s = run_case(tmp_path, graph, ckpt, changes, 2)
    assert "delta" not in [x["method"] for x in s["layers"]]
    assert_untouched_rows_are_base(tmp_path, "upd", "base", changes, s, 2)
    z = json.loads((tmp_path / "upd" / "emb_info.json").read_text())["cache"]["preact"]
    assert z == (["z_1.npy"] if s["layers"][0]["method"] == "full" else [])


def test_in_edge_change_matches_the_two_graphs():
    rng = np.random.default_rng(0)
    n = 120
    for trial in range(20):
        src, dst = rng.integers(0, n, 900), rng.integers(0, n, 900)
        order = np.lexsort((src, dst))
        src, dst = src[order], dst[order]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])

        def patched(indptr=indptr, src=src):
            removed = np.sort(rng.choice(len(src), int(rng.integers(0, 40)), replace=False))
            k = int(rng.integers(0, 40))
            return Adjacency(indptr, src, removed, rng.integers(0, n, k), rng.integers(0, n, k))

        old = Adjacency(indptr, src) if trial % 4 == 0 else patched()
        new = patched()
        ch = InEdgeChange.between(old, new)
        ipo, so = old.in_edges(np.arange(n))
        ipn, sn = new.in_edges(np.arange(n))
        for v in range(n):
            before, after = (
                Counter(so[ipo[v] : ipo[v + 1]].tolist()),
                Counter(sn[ipn[v] : ipn[v + 1]].tolist()),
            )
            want = {u: after[u] - before[u] for u in before | after if after[u] != before[u]}
            i = np.searchsorted(ch.rows, v)
            listed = i < len(ch.rows) and ch.rows[i] == v
            assert listed == bool(want)
            if listed:
                mine = ch.edge_row == i
                assert (
                    dict(zip(ch.edge_src[mine].tolist(), ch.edge_weight[mine].tolist(), strict=True)) == want
                )
                assert (ch.deg_old[i], ch.deg_new[i]) == (ipo[v + 1] - ipo[v], ipn[v + 1] - ipn[v])


@pytest.mark.parametrize("rows, dim, batch", [(1000, 16, 97), (5, 3, 2), (70_000, 40, 16384)])
@pytest.mark.parametrize("direct_from", [0, 1 << 40])  # O_DIRECT (where the filesystem has it), page cache
def test_stream_files_round_trip(tmp_path, monkeypatch, rows, dim, batch, direct_from):
    from gnnscale.inference import streamfile

    monkeypatch.setattr(streamfile, "DIRECT_MIN_BYTES", direct_from)
    x = torch.randn(rows, dim)
    w = StreamWriter(tmp_path / "s.npy", (rows, dim))
    for lo in range(0, rows, batch):
        w.write_range(lo, x[lo : lo + batch])
    w.close()
    assert np.array_equal(np.load(tmp_path / "s.npy"), x.numpy())
    r = StreamReader(tmp_path / "s.npy", batch)
    for lo in range(0, rows, batch):
        assert torch.equal(r.batch(lo, min(rows, lo + batch)), x[lo : lo + batch])
    r.close()
    f = LayerFile(tmp_path / "m.npy", shape=(rows, dim))
    f.write(np.arange(rows), x)
    f.close()
    assert np.array_equal(np.load(tmp_path / "m.npy"), x.numpy())


def test_stream_writer_refuses_gaps(tmp_path):
    w = StreamWriter(tmp_path / "s.npy", (10, 4))
    w.write_range(0, torch.zeros(3, 4))
    with pytest.raises(ValueError, match="in order"):
        w.write_range(5, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="of 160 bytes written"):
        w.close()
