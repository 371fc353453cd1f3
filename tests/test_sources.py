"""Every raw-format source, sharded through the real stages and checked against an independent
scipy.sparse reference: node/edge/feature/class/split counts, and the CSC edge for edge."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from gnnscale.errors import DataError
from gnnscale.storage.csc import open_csc
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.shard_writer import staging_dir_for
from tests.conftest import build_graph, compose, shared_data

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- helpers
def reference_csc(n: int, src, dst) -> sp.csc_matrix:
    """What the default policy must store: symmetrised, no self-loops, no duplicates."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    a = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    a = a + a.T
    a.setdiag(0)
    a.eliminate_zeros()
    a.data[:] = 1
    a = a.tocsc()  # column j = destination j, rows = its in-neighbours (CSC orientation)
    a.sort_indices()
    return a


def load_graph(graph_dir: Path) -> dict:
    g = GraphDir(graph_dir)
    parts = [g.shard(i) for i in range(g.num_shards)]
    cat = {
        k: np.concatenate([p[k].numpy() for p in parts])
        for k in ("feat", "label", "train_mask", "val_mask", "test_mask")
    }
    indptr, indices = open_csc(g)
    return {"meta": g.meta, "indptr": np.asarray(indptr), "indices": np.asarray(indices), **cat}


def assert_same_edges(got: dict, ref: sp.csc_matrix) -> None:
    assert got["meta"]["num_edges"] == ref.nnz
    np.testing.assert_array_equal(got["indptr"], ref.indptr)
    np.testing.assert_array_equal(got["indices"], ref.indices)


def split_counts(meta: dict) -> tuple[int, int, int]:
    s = meta["splits"]
    return s["train"], s["val"], s["test"]


def shard(tmp_path: Path, *overrides: str) -> dict:
    return load_graph(build_graph(tmp_path, *overrides, "shard.nodes_per_shard=37"))


def assert_nothing_published(graph_dir: Path) -> None:
    assert not graph_dir.exists(), "a failed shard must not leave a graph_dir behind"
    assert not staging_dir_for(graph_dir).exists()


def shard_fails(tmp_path: Path, *overrides: str) -> DataError:
    """Run the shard stage expecting a DataError; nothing may be published."""
    from gnnscale.stages import shard as shard_stage

    graph_dir = tmp_path / "bad_graph"
    cfg = compose("shard", f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'runs' / 'bad'}", *overrides)
    with pytest.raises(DataError) as info:
        shard_stage.run(cfg)
    err = info.value
    assert err.hint, "every user error says how to fix it"
    assert "\n" not in err.one_line()
    assert_nothing_published(graph_dir)
    return err


def random_graph(n: int, m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random edges including self-loops and duplicates, so the policy has work to do."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    src[:3], dst[:3] = [1, 1, 2], [1, 2, 1]  # a self-loop, and an edge given in both directions
    return np.concatenate([src, src[:5]]), np.concatenate([dst, dst[:5]])


# ---------------------------------------------------------------- planetoid
def kipf_reference(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray, sp.csc_matrix]:
    """The reference loader (Kipf gcn/utils.py) written independently: vstack, then reorder the test rows."""
    raw = {}
    for part in ("x", "tx", "allx", "y", "ty", "ally", "graph"):
        with open(folder / f"ind.{name}.{part}", "rb") as fh:
            raw[part] = pickle.load(
                fh, encoding="latin1"
            )  # trusted fixture; the source uses its own unpickler
    order = np.loadtxt(folder / f"ind.{name}.test.index", dtype=np.int64)
    ordered = np.sort(order)
    full = np.arange(ordered.min(), ordered.max() + 1)
    tx = sp.lil_matrix((len(full), raw["tx"].shape[1]))
    tx[ordered - ordered.min(), :] = raw["tx"]
    ty = np.zeros((len(full), raw["ty"].shape[1]))
    ty[ordered - ordered.min(), :] = raw["ty"]
    feat = sp.vstack((raw["allx"], tx)).tolil()
    feat[order, :] = feat[ordered, :]
    onehot = np.vstack((raw["ally"], ty))
    onehot[order, :] = onehot[ordered, :]
    label = np.where(onehot.any(axis=1), onehot.argmax(axis=1), -1)
    src = [u for u, nbrs in raw["graph"].items() for _ in nbrs]
    dst = [v for nbrs in raw["graph"].values() for v in nbrs]
    return feat.toarray(), label, reference_csc(feat.shape[0], src, dst)


@pytest.mark.parametrize(
    "folder, name, nodes, edges, feats, classes, splits",
    [
        ("planetoid_cora", "cora", 2708, 10556, 1433, 7, (140, 500, 1000)),
        ("planetoid_citeseer", "citeseer", 3327, 9104, 3703, 6, (120, 500, 1000)),
    ],
)
def test_planetoid_real(tmp_path, folder, name, nodes, edges, feats, classes, splits):
    path = shared_data(folder)
    got = load_graph(build_graph(tmp_path, "data=planetoid", f"data.path={path}"))
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["num_edges"], meta["feat_dim"], meta["num_classes"]) == (
        name,
        nodes,
        edges,
        feats,
        classes,
    )
    assert split_counts(meta) == splits and meta["splits"]["origin"] == "source"
    feat, label, ref = kipf_reference(path, name)
    assert_same_edges(got, ref)
    np.testing.assert_array_equal(got["feat"], feat.astype(np.float32))
    np.testing.assert_array_equal(got["label"], label)
    assert got["train_mask"][: splits[0]].all() and got["val_mask"][splits[0] : splits[0] + 500].all()
    test_ids = np.loadtxt(path / f"ind.{name}.test.index", dtype=np.int64)
    assert got["test_mask"][test_ids].all()
    # CiteSeer's 15 isolated nodes (missing from test.index) have zero features and no label.
    assert int((got["label"] == -1).sum()) == (15 if name == "citeseer" else 0)
    assert not got["feat"][got["label"] == -1].any()


def _dump_py2_like(path: Path, obj) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def write_tiny_planetoid(folder: Path, name: str = "toy") -> None:
    """The real layout at the smallest scale the public split allows: 2 train + 500 val nodes in allx."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    n_all, n_test, f, c = 503, 4, 5, 3
    onehot = lambda k: np.eye(c)[rng.integers(0, c, k)]  # noqa: E731
    _dump_py2_like(folder / f"ind.{name}.x", sp.csr_matrix(rng.random((2, f))))
    _dump_py2_like(folder / f"ind.{name}.y", onehot(2))
    _dump_py2_like(folder / f"ind.{name}.allx", sp.csr_matrix(rng.random((n_all, f))))
    _dump_py2_like(folder / f"ind.{name}.ally", onehot(n_all))
    _dump_py2_like(folder / f"ind.{name}.tx", sp.csr_matrix(rng.random((n_test, f))))
    _dump_py2_like(folder / f"ind.{name}.ty", onehot(n_test))
    # Test ids out of order, with a gap at 505 (an isolated node, like CiteSeer's).
    (folder / f"ind.{name}.test.index").write_text("506\n503\n504\n507\n")
    graph = {i: [(i + 1) % 508, (i * 7) % 508] for i in range(508)}
    _dump_py2_like(folder / f"ind.{name}.graph", graph)


def test_planetoid_tiny_reorder_and_gap(tmp_path):
    folder = tmp_path / "raw"
    write_tiny_planetoid(folder)
    got = shard(tmp_path, "data=planetoid", f"data.path={folder}")
    meta = got["meta"]
    assert (meta["num_nodes"], meta["feat_dim"], meta["num_classes"]) == (508, 5, 3)
    assert split_counts(meta) == (2, 500, 4)
    feat, label, ref = kipf_reference(folder, "toy")
    assert_same_edges(got, ref)
    np.testing.assert_allclose(got["feat"], feat.astype(np.float32))
    np.testing.assert_array_equal(got["label"], label)
    assert got["label"][505] == -1 and not got["feat"][505].any()


def test_restricted_unpickler_refuses_code(tmp_path):
    from gnnscale.datasets.planetoid import restricted_load

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "ind.evil.x"
    _dump_py2_like(path, Evil())
    with pytest.raises(DataError, match="system"):
        restricted_load(path)
    assert not marker.exists()
    # A genuine-looking folder whose graph file is a trap fails the whole source, cleanly.
    folder = tmp_path / "raw"
    write_tiny_planetoid(folder)
    _dump_py2_like(folder / "ind.toy.graph", Evil())
    err = shard_fails(tmp_path, "data=planetoid", f"data.path={folder}")
    assert "ind.toy.graph" in err.message and not marker.exists()


def test_planetoid_bad_folders(tmp_path):
    err = shard_fails(tmp_path, "data=planetoid", f"data.path={tmp_path / 'nope'}")
    assert "does not exist" in err.message
    folder = tmp_path / "raw"
    write_tiny_planetoid(folder)
    (folder / "ind.toy.ty").unlink()
    assert "ind.toy.ty" in shard_fails(tmp_path, "data=planetoid", f"data.path={folder}").message
    (folder / "ind.toy.ty").write_bytes(b"not a pickle")
    assert "cannot read" in shard_fails(tmp_path, "data=planetoid", f"data.path={folder}").message


# ---------------------------------------------------------------- npz
def test_npz_gnnbench_cora_real(tmp_path):
    path = shared_data("gnnbench_cora") / "cora.npz"
    got = load_graph(build_graph(tmp_path, "data=npz", f"data.path={path}"))
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["num_edges"], meta["feat_dim"], meta["num_classes"]) == (
        "cora",
        2708,
        10556,
        1433,
        7,
    )
    assert meta["splits"]["origin"] == "random" and sum(split_counts(meta)) == 2708
    z = np.load(path)
    adj = sp.csr_matrix(
        (z["adj_data"], z["adj_indices"], z["adj_indptr"]), shape=tuple(z["adj_shape"])
    ).tocoo()
    assert_same_edges(got, reference_csc(2708, adj.row, adj.col))
    attr = sp.csr_matrix((z["attr_data"], z["attr_indices"], z["attr_indptr"]), shape=tuple(z["attr_shape"]))
    np.testing.assert_array_equal(got["feat"], attr.toarray())
    np.testing.assert_array_equal(got["label"], z["labels"])


def test_npz_tolokers_real(tmp_path):
    path = shared_data("het_tolokers") / "tolokers.npz"
    got = load_graph(build_graph(tmp_path, "data=npz", f"data.path={path.parent}", "data.split_index=3"))
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["num_edges"], meta["feat_dim"], meta["num_classes"]) == (
        "tolokers",
        11758,
        1038000,
        10,
        2,
    )
    z = np.load(path)
    assert split_counts(meta) == tuple(int(z[k][3].sum()) for k in ("train_masks", "val_masks", "test_masks"))
    np.testing.assert_array_equal(got["train_mask"], z["train_masks"][3])
    assert_same_edges(got, reference_csc(11758, z["edges"][:, 0], z["edges"][:, 1]))
    np.testing.assert_array_equal(got["feat"], z["node_features"])


def test_npz_tiny_benchmark_layout(tmp_path):
    n, f = 90, 6
    src, dst = random_graph(n, 300)
    adj = sp.csr_matrix(
        (np.ones(len(src), np.float32), (src, dst)), shape=(n, n)
    )  # duplicates summed by scipy
    attr = sp.random(n, f, density=0.3, format="csr", random_state=1, dtype=np.float32)
    labels = np.random.default_rng(2).integers(0, 4, n)
    labels[:5] = -1
    path = tmp_path / "toy.npz"
    np.savez(
        path,
        adj_data=adj.data,
        adj_indices=adj.indices,
        adj_indptr=adj.indptr,
        adj_shape=adj.shape,
        attr_data=attr.data,
        attr_indices=attr.indices,
        attr_indptr=attr.indptr,
        attr_shape=attr.shape,
        labels=labels,
    )
    got = shard(
        tmp_path,
        "data=npz",
        f"data.path={path}",
        "data.chunk_edges=17",
        "data.split_fractions=[0.5,0.25,0.25]",
    )
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["feat_dim"], meta["num_classes"]) == ("toy", n, f, 4)
    assert meta["splits"]["origin"] == "random" and sum(split_counts(meta)) == n - 5
    assert not (got["train_mask"] | got["val_mask"] | got["test_mask"])[
        :5
    ].any()  # unlabelled nodes are in no split
    assert_same_edges(got, reference_csc(n, src, dst))
    np.testing.assert_array_equal(got["feat"], attr.toarray())


def write_hetero(path: Path, n: int = 80, splits: int = 3, **replace) -> dict:
    rng = np.random.default_rng(3)
    arrays = {
        "node_features": rng.standard_normal((n, 4)).astype(np.float32),
        "node_labels": rng.integers(0, 2, n),
    }
    src, dst = random_graph(n, 200)
    arrays["edges"] = np.stack([src, dst], axis=1)
    perm = np.stack([rng.permutation(n) for _ in range(splits)])
    arrays["train_masks"], arrays["val_masks"], arrays["test_masks"] = (
        perm < 40,
        (perm >= 40) & (perm < 60),
        perm >= 60,
    )
    arrays.update(replace)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return arrays


def test_npz_tiny_hetero_layout(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    arrays = write_hetero(folder / "het.npz")
    got = shard(tmp_path, "data=npz", f"data.path={folder}", "data.split_index=2", "data.chunk_edges=50")
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["feat_dim"], meta["num_classes"]) == ("het", 80, 4, 2)
    assert split_counts(meta) == (40, 20, 20) and meta["splits"]["origin"] == "source"
    np.testing.assert_array_equal(got["val_mask"], arrays["val_masks"][2])
    assert_same_edges(got, reference_csc(80, arrays["edges"][:, 0], arrays["edges"][:, 1]))
    # use_source_split=false ignores the shipped masks.
    again = load_graph(
        build_graph(tmp_path / "r", "data=npz", f"data.path={folder}", "data.use_source_split=false")
    )
    assert again["meta"]["splits"]["origin"] == "random"


def test_npz_bad_inputs(tmp_path):
    path = tmp_path / "het.npz"
    write_hetero(path)
    err = shard_fails(tmp_path, "data=npz", f"data.path={path}", "data.split_index=3")
    assert "split_index=3 is out of range" in err.message and "0..2" in err.hint
    write_hetero(path, node_labels=np.zeros(79, dtype=np.int64))
    assert "expected (80,)" in shard_fails(tmp_path, "data=npz", f"data.path={path}").message
    write_hetero(path, edges=np.array([[0, 1], [2, 80]]))
    assert "out of range for 80 nodes" in shard_fails(tmp_path, "data=npz", f"data.path={path}").message
    write_hetero(path, edges=np.array([[0.5, 1.0]]))
    assert "expected integers" in shard_fails(tmp_path, "data=npz", f"data.path={path}").message
    np.savez(path, foo=np.zeros(3))
    assert "unknown .npz layout" in shard_fails(tmp_path, "data=npz", f"data.path={path}").message
    np.savez(
        path,
        node_features=np.array([{"a": 1}], dtype=object),
        node_labels=np.zeros(1),
        edges=np.zeros((0, 2), int),
    )
    assert "unreadable" in shard_fails(tmp_path, "data=npz", f"data.path={path}").message
    path.write_bytes(b"garbage")
    assert "cannot read" in shard_fails(tmp_path, "data=npz", f"data.path={path}").message
    np.savez(tmp_path / "second.npz", foo=np.zeros(1))
    assert "holds 2 .npz files" in shard_fails(tmp_path, "data=npz", f"data.path={tmp_path}").message


# ---------------------------------------------------------------- edgelist
def write_edges(
    path: Path, src, dst, sep: str = ",", header: str | None = None, comment: str | None = None
) -> None:
    lines = (
        ([comment] if comment else [])
        + ([header] if header else [])
        + [f"{u}{sep}{v}" for u, v in zip(src, dst, strict=True)]
    )
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "sep, header, comment, delimiter",
    [
        (",", "src,dst", None, "auto"),
        ("\t", None, None, "auto"),
        (" ", None, "# SNAP-style comment", "auto"),
        ("\t", "from\tto", None, "tab"),
    ],
    ids=["csv-header", "tsv", "space-comment", "tsv-header-explicit"],
)
def test_edgelist_formats(tmp_path, sep, header, comment, delimiter):
    n = 70
    src, dst = random_graph(n, 250)
    write_edges(tmp_path / "edges.txt", src, dst, sep, header, comment)
    rng = np.random.default_rng(4)
    feat, labels = rng.standard_normal((n, 3)).astype(np.float32), rng.integers(-1, 3, n)
    split = rng.integers(-1, 3, n)
    np.save(tmp_path / "f.npy", feat)
    np.save(tmp_path / "y.npy", labels)
    np.save(tmp_path / "s.npy", split)
    got = shard(
        tmp_path,
        "data=edgelist",
        f"data.path={tmp_path / 'edges.txt'}",
        f"data.features={tmp_path / 'f.npy'}",
        f"data.labels={tmp_path / 'y.npy'}",
        f"data.split={tmp_path / 's.npy'}",
        f"data.delimiter={delimiter}",
        "data.chunk_edges=40",
    )
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["feat_dim"], meta["num_classes"]) == ("edges", n, 3, 3)
    assert meta["input_edges"] == len(src)  # a header or comment line is never read as an edge
    assert split_counts(meta) == tuple(int((split == k).sum()) for k in range(3))
    assert_same_edges(got, reference_csc(n, src, dst))
    np.testing.assert_array_equal(got["feat"], feat)
    np.testing.assert_array_equal(got["label"], labels)


def test_edgelist_random_features_and_split(tmp_path):
    src, dst = random_graph(50, 120)
    with gzip.open(tmp_path / "e.csv.gz", "wt") as fh:
        fh.write("".join(f"{u},{v}\n" for u, v in zip(src, dst, strict=True)))
    np.save(tmp_path / "y.npy", np.arange(50) % 4)
    args = (
        "data=edgelist",
        f"data.path={tmp_path / 'e.csv.gz'}",
        f"data.labels={tmp_path / 'y.npy'}",
        "data.feat_dim=5",
    )
    a = shard(tmp_path / "a", *args)
    b = shard(tmp_path / "b", *args)
    assert (
        a["meta"]["name"] == "e" and a["meta"]["feat_dim"] == 5 and a["meta"]["splits"]["origin"] == "random"
    )
    assert sum(split_counts(a["meta"])) == 50
    np.testing.assert_array_equal(a["feat"], b["feat"])  # seeded: the same every time
    assert a["feat"].std() > 0.5
    c = shard(tmp_path / "c", *args, "data.feat_seed=1")
    assert not np.array_equal(a["feat"], c["feat"])
    assert_same_edges(a, reference_csc(50, src, dst))


def test_edgelist_bad_inputs(tmp_path):
    write_edges(tmp_path / "e.csv", [0, 1, 2], [1, 2, 3])
    np.save(tmp_path / "y.npy", np.zeros(4, dtype=np.int64))
    np.save(tmp_path / "f5.npy", np.zeros((5, 2), dtype=np.float32))
    base = ("data=edgelist", f"data.path={tmp_path / 'e.csv'}")
    labels = f"data.labels={tmp_path / 'y.npy'}"
    assert (
        "5 rows but the label file has 4"
        in shard_fails(tmp_path, *base, labels, f"data.features={tmp_path / 'f5.npy'}").message
    )
    assert "data.num_nodes=9" in shard_fails(tmp_path, *base, labels, "data.num_nodes=9").message
    assert "does not exist" in shard_fails(tmp_path, *base, f"data.labels={tmp_path / 'nope.npy'}").message
    np.save(tmp_path / "s.npy", np.array([0, 1, 5, 2]))
    assert (
        "split file holds 5"
        in shard_fails(tmp_path, *base, labels, f"data.split={tmp_path / 's.npy'}").message
    )
    np.save(tmp_path / "yf.npy", np.array([0.0, 1.5, 2.0, 0.0]))
    assert "non-integer" in shard_fails(tmp_path, *base, f"data.labels={tmp_path / 'yf.npy'}").message
    (tmp_path / "e.csv").write_text("0,1\n1,x\n")
    assert "non-integer node id" in shard_fails(tmp_path, *base, labels).message
    (tmp_path / "e.csv").write_text("0,1\n1,9\n")
    assert "out of range for 4 nodes" in shard_fails(tmp_path, *base, labels).message
    (tmp_path / "e.csv").write_text("# only a comment\n")
    assert "holds no edges" in shard_fails(tmp_path, *base, labels).message


# ---------------------------------------------------------------- dgl
def test_dgl_graph(tmp_path):
    import dgl
    import torch

    n = 60
    src, dst = random_graph(n, 150)
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)
    g.ndata["x"] = torch.randn(n, 4)
    g.ndata["y"] = torch.arange(n) % 3
    g.ndata["train_mask"] = torch.arange(n) < 30
    g.ndata["test_mask"] = torch.arange(n) >= 50  # no val_mask shipped: val is empty
    other = dgl.graph((torch.tensor([0]), torch.tensor([1])))
    other.ndata["x"], other.ndata["y"] = torch.zeros(2, 4), torch.zeros(2, dtype=torch.long)
    path = tmp_path / "g.bin"
    dgl.save_graphs(str(path), [other, g])
    got = shard(
        tmp_path, "data=dgl", f"data.path={path}", "data.graph_index=1", "data.feat_key=x", "data.label_key=y"
    )
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["feat_dim"], meta["num_classes"]) == ("g", n, 4, 3)
    assert split_counts(meta) == (30, 0, 10)
    assert_same_edges(got, reference_csc(n, src, dst))
    np.testing.assert_array_equal(got["feat"], g.ndata["x"].numpy())

    err = shard_fails(tmp_path, "data=dgl", f"data.path={path}", "data.graph_index=1")
    assert "no node data 'feat'" in err.message and "x, y" in err.message
    assert (
        "graph_index=5 is out of range"
        in shard_fails(tmp_path, "data=dgl", f"data.path={path}", "data.graph_index=5").message
    )
    hetero = dgl.heterograph({("a", "r", "b"): (torch.tensor([0]), torch.tensor([0]))})
    dgl.save_graphs(str(tmp_path / "h.bin"), [hetero])
    assert "heterogeneous" in shard_fails(tmp_path, "data=dgl", f"data.path={tmp_path / 'h.bin'}").message
    (tmp_path / "junk.bin").write_bytes(b"junk" * 10)
    err = shard_fails(tmp_path, "data=dgl", f"data.path={tmp_path / 'junk.bin'}")
    assert "cannot read" in err.message and "Stack trace" not in err.message


# ---------------------------------------------------------------- ogb
def write_gz(path: Path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write("".join(f"{line}\n" for line in lines))


def write_ogb(root: Path, n: int = 75, count_file: bool = True, splits=("time",)) -> dict:
    rng = np.random.default_rng(5)
    src, dst = random_graph(n, 220)
    feat = rng.standard_normal((n, 3)).astype(np.float32)
    labels = rng.integers(0, 4, n).astype(float)
    labels[[3, 7]] = np.nan
    write_gz(root / "raw" / "edge.csv.gz", [f"{u},{v}" for u, v in zip(src, dst, strict=True)])
    write_gz(root / "raw" / "node-feat.csv.gz", [",".join(f"{x:.6f}" for x in row) for row in feat])
    write_gz(root / "raw" / "node-label.csv.gz", ["nan" if np.isnan(y) else str(int(y)) for y in labels])
    if count_file:
        write_gz(root / "raw" / "num-node-list.csv.gz", [n])
    perm = rng.permutation(n)
    for name in splits:
        for part, ids in zip(("train", "valid", "test"), (perm[:40], perm[40:55], perm[55:70]), strict=True):
            write_gz(root / "split" / name / f"{part}.csv.gz", ids)
    return {
        "src": src,
        "dst": dst,
        "feat": np.loadtxt(
            gzip.open(root / "raw" / "node-feat.csv.gz"), delimiter=",", dtype=np.float32, ndmin=2
        ),
        "labels": np.where(np.isnan(labels), -1, labels).astype(np.int64),
        "train": perm[:40],
    }


@pytest.mark.parametrize("count_file", [True, False], ids=["num-node-list", "count-label-rows"])
def test_ogb_layout(tmp_path, count_file, monkeypatch):
    import gnnscale.datasets.ogb as ogb

    monkeypatch.setattr(ogb, "BLOCK_ROWS", 16)  # several node blocks even on a tiny graph
    root = tmp_path / "ogbn_toy"
    ref = write_ogb(root, count_file=count_file)
    got = shard(tmp_path, "data=ogb", f"data.path={root}", "data.chunk_edges=64")
    meta = got["meta"]
    assert (meta["name"], meta["num_nodes"], meta["feat_dim"], meta["num_classes"]) == ("ogbn_toy", 75, 3, 4)
    assert split_counts(meta) == (40, 15, 15) and meta["splits"]["origin"] == "source"
    assert np.flatnonzero(got["train_mask"]).tolist() == sorted(ref["train"].tolist())
    assert_same_edges(got, reference_csc(75, ref["src"], ref["dst"]))
    np.testing.assert_array_equal(got["feat"], ref["feat"])
    np.testing.assert_array_equal(got["label"], ref["labels"])


def test_ogb_bad_inputs(tmp_path):
    root = tmp_path / "ogbn_toy"
    write_ogb(root, splits=("a", "b"))
    err = shard_fails(tmp_path, "data=ogb", f"data.path={root}")
    assert "several splits: a, b" in err.message and "data.split_name=" in err.hint
    assert split_counts(
        load_graph(build_graph(tmp_path / "ok", "data=ogb", f"data.path={root}", "data.split_name=b"))["meta"]
    ) == (40, 15, 15)
    assert (
        "no split 'c'" in shard_fails(tmp_path, "data=ogb", f"data.path={root}", "data.split_name=c").message
    )
    write_gz(root / "raw" / "num-node-list.csv.gz", [80])
    assert (
        "75 rows for 80 nodes"
        in shard_fails(tmp_path, "data=ogb", f"data.path={root}", "data.split_name=a").message
    )
    write_gz(root / "raw" / "num-node-list.csv.gz", [75])
    write_gz(root / "raw" / "node-label.csv.gz", ["1.5"] * 75)
    assert (
        "not a class id"
        in shard_fails(tmp_path, "data=ogb", f"data.path={root}", "data.split_name=a").message
    )
    (root / "raw" / "edge.csv.gz").unlink()
    assert (
        "edge.csv.gz" in shard_fails(tmp_path, "data=ogb", f"data.path={root}", "data.split_name=a").message
    )


@pytest.mark.parametrize("part", ["train", "valid", "test"])
@pytest.mark.parametrize("content", [[], [""]], ids=["no-bytes", "blank-line"])
def test_ogb_empty_split_file_is_refused(tmp_path, part, content):
    from typer.testing import CliRunner

    from gnnscale.cli import app

    root = tmp_path / "ogbn_toy"
    write_ogb(root)
    empty = root / "split" / "time" / f"{part}.csv.gz"
    write_gz(empty, content)
    err = shard_fails(tmp_path, "data=ogb", f"data.path={root}")
    assert f"OGB split file '{empty}' lists no node ids" in err.message
    assert "data.use_source_split=false" in err.hint
    args = [
        "shard",
        f"graph_dir={tmp_path / 'g'}",
        f"run_dir={tmp_path / 'r'}",
        "data=ogb",
        f"data.path={root}",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "lists no node ids" in result.stderr
    # The way out the hint names works: the seeded random split covers every labelled node.
    meta = load_graph(
        build_graph(tmp_path / "ok", "data=ogb", f"data.path={root}", "data.use_source_split=false")
    )["meta"]
    assert meta["splits"]["origin"] == "random" and min(split_counts(meta)) > 0


# ---------------------------------------------------------------- the CLI
def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DGLBACKEND": "pytorch"}
    cmd = [sys.executable, "-m", "gnnscale.cli", "shard", f"run_dir={tmp_path / 'runs' / 'cli'}", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["non-integer-edge", "npz-split-index"])
def test_cli_bad_input_exit_2_one_line(tmp_path, case):
    graph_dir = tmp_path / "graph"
    if case == "non-integer-edge":
        (tmp_path / "e.csv").write_text("src,dst\n0,1\n1,2.5\n")
        np.save(tmp_path / "y.npy", np.zeros(3, dtype=np.int64))
        args = ("data=edgelist", f"data.path={tmp_path / 'e.csv'}", f"data.labels={tmp_path / 'y.npy'}")
        expected = "non-integer node id"
    else:
        write_hetero(tmp_path / "het.npz")
        args = ("data=npz", f"data.path={tmp_path / 'het.npz'}", "data.split_index=10")
        expected = "data.split_index=10 is out of range"
    proc = run_cli(tmp_path, f"graph_dir={graph_dir}", *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert_nothing_published(graph_dir)


def test_meta_records_source_provenance(tmp_path):
    path = tmp_path / "het.npz"
    write_hetero(path)
    meta = json.loads(
        (
            build_graph(tmp_path, "data=npz", f"data.path={path}", "data.split_index=1", csc=False)
            / "meta.json"
        ).read_text()
    )
    assert meta["source"] == {"kind": "npz", "path": str(path), "layout": "heterophilous", "split_index": 1}
