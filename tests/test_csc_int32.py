"""int32 CSC indices: what build-csr writes, what every reader accepts, and that sampling is unchanged.

build-csr writes int32 indices when the graph has fewer than 2**31 nodes and edges and records it in
meta.json; a CSC built before (int64, with or without `index_dtype`) keeps working as it is. Every
sampler draws the same batches over the int32 graph as over the int64 graph of the same CSC.
"""

from __future__ import annotations

import itertools
import json
import shutil

import dgl
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import GraphDirError
from gnnscale.sampling import SamplingContext, build_loader, build_sampler
from gnnscale.sampling.graph import csc_to_dgl, to_dgl_graph
from gnnscale.stages import train
from gnnscale.storage import csc as csc_mod
from gnnscale.storage import node_scores
from gnnscale.storage.csc import index_dtype, load_csc, open_csc
from gnnscale.storage.edge_split import ensure_edge_split
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.meta import read_meta, write_meta
from gnnscale.storage.verify import DTYPE_MISMATCH, check_files
from gnnscale.training.data import load_train_data
from gnnscale.utils.atomic import sha256_file
from tests.conftest import build_graph, compose

runner = CliRunner()
GRAPH = (
    "data.num_nodes=800",
    "data.avg_degree=8",
    "data.feat_dim=8",
    "data.num_classes=3",
    "shard.nodes_per_shard=300",
)


def old_format(src, dst, key: bool = True):
    """A copy of graph_dir `src` as build-csr wrote it before int32: int64 indices, meta.json saying int64
    (key) or nothing (an older build), their sha256 recorded as build-csr records it."""
    shutil.copytree(src, dst)
    path = dst / "csc" / "indices.npy"
    np.save(path, np.load(path).astype(np.int64))
    meta = read_meta(dst)
    meta["csc"]["sha256"]["indices.npy"] = sha256_file(path)
    if key:
        meta["csc"]["index_dtype"] = "int64"
    else:
        del meta["csc"]["index_dtype"]
    write_meta(dst, meta)
    return dst


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """(int32 graph_dir as build-csr writes it now, the same CSC in the old int64 format)."""
    root = tmp_path_factory.mktemp("csc32")
    new = build_graph(root, *GRAPH)
    _, indices = open_csc(GraphDir(new))
    node_scores.write_edge_data(GraphDir(new), "w", np.where(indices % 2 == 0, 1.0 + indices % 5, 0.0))
    return new, old_format(new, root / "old")


def test_build_csr_writes_int32_indices_and_records_them(graphs):
    new, _ = graphs
    graph = GraphDir(new)
    assert graph.meta["csc"]["index_dtype"] == "int32"
    assert json.loads((new.parent / "runs" / "csc" / "summary.json").read_text())["index_dtype"] == "int32"
    indptr, indices = open_csc(graph)
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    assert (new / "csc" / "indices.npy").stat().st_size == 128 + 4 * len(indices)
    # the same neighbour lists as the shards' edges
    src = np.concatenate([graph.shard(i)["src"].numpy() for i in range(graph.num_shards)])
    dst = np.concatenate([graph.shard(i)["dst"].numpy() for i in range(graph.num_shards)])
    order = np.lexsort((src, dst))
    assert np.array_equal(indices, src[order])
    assert np.array_equal(np.diff(indptr), np.bincount(dst, minlength=graph.num_nodes))


def test_index_dtype_is_int32_only_while_nodes_and_edges_fit():
    assert index_dtype(2**31 - 1, 2**31 - 1) == np.int32
    assert index_dtype(2**31, 10) == np.int64
    # int32 indices past 2**31 edges would need an int64 DGL graph: a full widened copy, never zero-copy
    assert index_dtype(1000, 2**31) == np.int64


@pytest.mark.parametrize("resident", [False, True])
def test_load_csc_resident_equals_the_memory_map(graphs, resident, monkeypatch):
    monkeypatch.setattr(csc_mod, "_READ_CHUNK", 1000)  # several reads per array, one ending mid-element
    for folder in graphs:
        mapped = open_csc(GraphDir(folder))
        loaded = load_csc(GraphDir(folder), resident=resident)
        for a, b in zip(mapped, loaded, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)
            assert isinstance(b, np.memmap) != resident  # resident: anonymous memory, not a mapping
        if resident:
            assert all(a.flags.owndata and a.flags.writeable for a in loaded)


def test_int32_graph_shares_the_indices_and_copies_only_indptr(graphs):
    new, old = graphs
    indptr, indices = open_csc(GraphDir(new))
    g = csc_to_dgl(indptr, indices, len(indptr) - 1)
    ip, ix, _ = g.adj_tensors("csc")
    assert g.idtype == torch.int32 and ip.dtype == ix.dtype == torch.int32
    assert ix.data_ptr() == indices.ctypes.data  # the mapped file itself, not a copy
    assert np.array_equal(ip.numpy(), indptr)
    wide = csc_to_dgl(indptr, indices, len(indptr) - 1, idtype=torch.int64)  # what METIS is given
    assert wide.idtype == torch.int64 and np.array_equal(wide.adj_tensors("csc")[1].numpy(), indices)
    ip64, ix64 = open_csc(GraphDir(old))
    g64 = csc_to_dgl(ip64, ix64, len(ip64) - 1)  # an old graph_dir: an int64 graph, nothing copied
    assert g64.idtype == torch.int64
    assert [t.data_ptr() for t in g64.adj_tensors("csc")[:2]] == [ip64.ctypes.data, ix64.ctypes.data]
    assert np.array_equal(ix64, indices)


# ---------------------------------------------------------------- equal samples
SAMPLERS = {
    "neighbor": ["sampler=neighbor", "sampler.fanouts=[4,3]"],
    "neighbor-replace": ["sampler=neighbor", "sampler.fanouts=[4,3]", "sampler.replace=true"],
    "labor": ["sampler=labor", "sampler.fanouts=[4,3]"],
    "labor-1": ["sampler=labor", "sampler.fanouts=[4,3]", "sampler.importance_sampling=1"],
    "importance-degree": ["sampler=importance", "sampler.fanouts=[4,3]"],
    "importance-pagerank": ["sampler=importance", "sampler.fanouts=[4,3]", "sampler.score=pagerank"],
    "weighted": ["sampler=weighted", "sampler.fanouts=[4,3]", "sampler.edge_weight=w"],
    "random_walk": ["sampler=random_walk", "sampler.fanouts=[4,3]"],
    "cluster_gcn": ["sampler=cluster_gcn", "sampler.num_parts=8", "sampler.clusters_per_batch=3"],
    "saint-node": ["sampler=saint", "sampler.budget=150", "sampler.num_presample=20"],
    "saint-edge": ["sampler=saint", "sampler.mode=edge", "sampler.budget=100", "sampler.num_presample=20"],
    "saint-walk": ["sampler=saint", "sampler.mode=walk", "sampler.budget=60", "sampler.num_presample=20"],
    "full": ["sampler=full"],
}


def arrays(b) -> list[tuple[str, np.ndarray]]:
    """Everything a batch hands the model, ids as int64 (the only idtype-dependent part is the graph's own
    arrays inside a subgraph, compared by value)."""
    assert b.input_nodes.dtype == torch.int64 and b.seeds.dtype == torch.int64
    out = [("input_nodes", b.input_nodes.numpy()), ("seeds", b.seeds.numpy())]
    for name in ("output_rows", "loss_weight"):
        if getattr(b, name) is not None:
            out.append((name, getattr(b, name).numpy()))
    for i, block in enumerate(b.blocks or []):
        assert block.idtype == torch.int64 and block.srcdata[dgl.NID].dtype == torch.int64
        out += [
            (f"block{i}.src", block.srcdata[dgl.NID].numpy()),
            (f"block{i}.dst", block.dstdata[dgl.NID].numpy()),
        ]
        out += [(f"block{i}.csc{k}", t.numpy()) for k, t in enumerate(block.adj_tensors("csc"))]
        out += [(f"block{i}.{key}", v.numpy()) for key, v in sorted(block.edata.items())]
    if b.subgraph is not None:
        out += [
            (f"subgraph.csc{k}", t.numpy().astype(np.int64))
            for k, t in enumerate(b.subgraph.adj_tensors("csc"))
        ]
        out += [(f"subgraph.{key}", v.numpy()) for key, v in sorted(b.subgraph.edata.items())]
    return out


def batches(folder, overrides, tmp_path, num: int = 3) -> tuple[list, object]:
    """The first `num` batches of a seeded epoch of the sampler, and the graph they were drawn from."""
    graph = GraphDir(folder)
    g = to_dgl_graph(graph)
    cfg = compose("train", *overrides)
    sampler = build_sampler(cfg.sampler, 2)
    if hasattr(sampler, "needs_partition"):
        from gnnscale.partition import ensure_partition

        ensure_partition(graph, *sampler.needs_partition(graph.num_nodes))
    train_ids = graph.split_ids("train")
    if hasattr(sampler, "prepare"):
        sampler.prepare(SamplingContext(graph, g, train_ids, graph.labels(), tmp_path, seed=0))
    loader = build_loader(g, train_ids, sampler, 64, shuffle=True)
    torch.manual_seed(3), np.random.seed(3), dgl.seed(3)
    return [arrays(b) for b in itertools.islice(loader, num)], g


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_sampler_draws_the_same_batches_over_int32_and_int64(graphs, tmp_path, name):
    new, old = graphs
    got32, g32 = batches(new, SAMPLERS[name], tmp_path / "a")
    got64, g64 = batches(old, SAMPLERS[name], tmp_path / "b")
    assert g32.idtype == torch.int32 and g64.idtype == torch.int64
    assert len(got32) == len(got64) > 0
    for b32, b64 in zip(got32, got64, strict=True):
        assert [k for k, _ in b32] == [k for k, _ in b64]
        for (key, a), (_, b) in zip(b32, b64, strict=True):
            assert a.dtype == b.dtype or key.startswith("subgraph.csc"), key
            assert np.array_equal(a, b), f"{name}: {key} differs"


def test_excluded_edges_are_honoured_in_the_graphs_idtype(graphs):
    """Link prediction hands int64 edge ids to exclude: the int32 graph takes them, with the same draws."""
    out = []
    for folder in graphs:
        g = to_dgl_graph(GraphDir(folder))
        sampler = build_sampler(compose("train", "sampler.fanouts=[-1,5]").sampler, 2)
        exclude = torch.arange(0, g.num_edges(), 2)
        dgl.seed(5)
        _, _, blocks = sampler.sample_blocks(g, torch.arange(0, 800, 9), exclude_eids=exclude)
        eids = blocks[-1].edata[dgl.EID]
        assert eids.dtype == torch.int64 and len(eids) and bool((eids % 2 == 1).all())
        out.append([b.edata[dgl.EID].numpy() for b in blocks])
    assert all(np.array_equal(a, b) for a, b in zip(*out, strict=True))


def test_edge_split_holds_int32_indices_from_either_format(graphs):
    splits = [ensure_edge_split(GraphDir(folder), 0, 0.1, 0.1) for folder in graphs]
    for split in splits:
        assert split.indices.dtype == np.int32 and split.indptr.dtype == np.int64
    for name in ("indptr", "indices", "val", "test", "train_eids", "reverse_eids"):
        assert np.array_equal(getattr(splits[0], name), getattr(splits[1], name)), name


# ---------------------------------------------------------------- old graph_dirs, sizes, mismatches
@pytest.mark.parametrize("key", [True, False])
def test_an_old_int64_graph_dir_trains_as_the_int32_one_does(graphs, tmp_path, key):
    new, _ = graphs
    old = old_format(new, tmp_path / "old", key=key)
    assert check_files(old, "full")[-1].dtype == "int64"
    losses = []
    for folder in (new, old):
        run_dir = tmp_path / f"run-{folder.name}"
        cfg = compose(
            "train", f"graph_dir={folder}", f"run_dir={run_dir}", "+exp=debug_tiny", "train.epochs=2",
            "train.diagnostics=false", "train.prefetch=0",
        )  # fmt: skip
        train.run(cfg)
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses.append([(r["loss"], r["val_loss"]) for r in records if "loss" in r])
    assert losses[0] and losses[0] == losses[1]  # the same batches: the same training, bit for bit


def test_csc_bytes_count_the_real_itemsize(graphs):
    from gnnscale.profile.stats import graph_stats

    for folder, size in zip(graphs, (4, 8), strict=True):
        graph = GraphDir(folder)
        n, e = graph.num_nodes, graph.meta["csc"]["num_edges"]
        assert load_train_data(str(folder)).csc_bytes == size * (n + 1 + e)
        assert graph_stats(folder).csc_bytes == size * (n + 1 + e)


@pytest.fixture
def mismatched(graphs, tmp_path):
    """int32 indices whose meta.json says int64 (edited by hand, or written by another builder)."""
    folder = shutil.copytree(graphs[0], tmp_path / "graph")
    meta = read_meta(folder)
    meta["csc"]["index_dtype"] = "int64"
    write_meta(folder, meta)
    return folder


def test_a_dtype_meta_json_does_not_record_is_exit_2_with_one_line(mismatched, tmp_path):
    with pytest.raises(GraphDirError) as err:
        open_csc(GraphDir(mismatched))
    assert "indices.npy holds int32" in err.value.message
    for verify in ("stamp", "off"):  # the integrity check says it first; without it, open_csc does
        result = runner.invoke(
            app, ["train", f"graph_dir={mismatched}", f"run_dir={tmp_path / verify}", f"verify={verify}"]
        )
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1 and "indices.npy holds int32" in line and "int64" in line
        assert f"gnnscale build-csr graph_dir={mismatched}" in line


def test_verify_flags_a_dtype_that_disagrees_with_meta_json(mismatched):
    checks = {c.file: c for c in check_files(mismatched, "full")}
    assert checks["csc/indices.npy"].status == DTYPE_MISMATCH and checks["csc/indptr.npy"].ok
    result = runner.invoke(app, ["verify", f"graph_dir={mismatched}"])
    assert result.exit_code == 2 and "MISMATCH" in result.stdout  # the table's status (folded on 80 columns)
    assert "indices.npy holds int32" in result.stderr and "build-csr" in result.stderr
