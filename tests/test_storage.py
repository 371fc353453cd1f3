"""Shard format, CSC round trip against a scipy reference, FeatureStore gathers, DGL graph view."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnscale.config import compose_config
from gnnscale.datasets import build_source
from gnnscale.sampling.graph import to_dgl_graph
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.utils.atomic import sha256_file
from tests.conftest import TINY_SYNTHETIC, build_graph


def reference_csc(src: np.ndarray, dst: np.ndarray, n: int) -> sp.csc_matrix:
    """Symmetrised, self-loop-free, deduplicated adjacency; column j = in-edges of node j."""
    s, d = np.concatenate([src, dst]), np.concatenate([dst, src])
    keep = s != d
    a = sp.coo_matrix((np.ones(keep.sum()), (s[keep], d[keep])), shape=(n, n)).tocsc()
    a.sum_duplicates()
    a.sort_indices()
    return a


def source_edges(*overrides: str):
    cfg = compose_config("shard", list(overrides))
    source = build_source(cfg.data)
    chunks = list(source.edge_chunks())
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]), source


def test_meta_and_shards_follow_the_contract(tiny_graph):
    meta = json.loads((tiny_graph / "meta.json").read_text())
    assert (
        meta["format_version"] == 1
        and meta["num_nodes"] == 600
        and meta["feat_dim"] == 8
        and meta["num_classes"] == 3
    )
    assert [(s["node_start"], s["node_end"]) for s in meta["shards"]] == [(0, 250), (250, 500), (500, 600)]
    assert meta["splits"]["train"] + meta["splits"]["val"] + meta["splits"]["test"] == 600
    total = 0
    for info in meta["shards"]:
        path = tiny_graph / info["file"]
        assert sha256_file(path) == info["sha256"]
        part = torch.load(str(path), weights_only=True)
        n = info["node_end"] - info["node_start"]
        assert part["feat"].shape == (n, 8) and part["feat"].dtype == torch.float32
        assert part["label"].dtype == torch.int64 and part["label"].shape == (n,)
        masks = torch.stack([part["train_mask"], part["val_mask"], part["test_mask"]])
        assert masks.dtype == torch.bool and int(masks.sum(0).max()) <= 1
        assert part["src"].dtype == torch.int64 and len(part["src"]) == info["num_edges"]
        assert int(part["dst"].min()) >= info["node_start"] and int(part["dst"].max()) < info["node_end"]
        total += info["num_edges"]
    assert total == meta["num_edges"]


def test_csc_equals_reference_adjacency_edge_for_edge(tiny_graph):
    src, dst, source = source_edges(*TINY_SYNTHETIC)
    ref = reference_csc(src, dst, source.num_nodes)
    indptr, indices = open_csc(GraphDir(tiny_graph))
    assert np.array_equal(indptr, ref.indptr) and np.array_equal(indices, ref.indices)
    assert GraphDir(tiny_graph).meta["num_edges"] == ref.nnz


def test_dgl_graph_view_matches_csc(tiny_graph):
    graph = GraphDir(tiny_graph)
    g = to_dgl_graph(graph)
    indptr, indices = open_csc(graph)
    assert g.num_nodes() == 600 and g.num_edges() == len(indices)
    for v in (0, 17, 599):
        u, _ = g.in_edges(v)
        assert sorted(u.tolist()) == sorted(indices[indptr[v] : indptr[v + 1]].tolist())


def test_shard_size_does_not_change_the_graph(tmp_path):
    a = build_graph(tmp_path / "a", *TINY_SYNTHETIC)
    b = build_graph(tmp_path / "b", *TINY_SYNTHETIC, "shard.nodes_per_shard=1000")
    ia, xa = open_csc(GraphDir(a))
    ib, xb = open_csc(GraphDir(b))
    assert np.array_equal(ia, ib) and np.array_equal(xa, xb)
    fa, fb = FeatureStore(GraphDir(a)), FeatureStore(GraphDir(b))
    ids = torch.arange(600)
    assert torch.equal(fa.gather(ids), fb.gather(ids))
    assert torch.equal(GraphDir(a).mask("train"), GraphDir(b).mask("train"))


def test_same_seed_same_bytes_other_seed_other_graph(tmp_path):
    a = build_graph(tmp_path / "a", *TINY_SYNTHETIC, csc=False)
    b = build_graph(tmp_path / "b", *TINY_SYNTHETIC, csc=False)
    c = build_graph(tmp_path / "c", *TINY_SYNTHETIC, "data.seed=1", csc=False)
    sha = [[s["sha256"] for s in GraphDir(p).meta["shards"]] for p in (a, b, c)]
    assert sha[0] == sha[1] and sha[0] != sha[2]


@pytest.mark.parametrize("in_memory", [False, True])
def test_feature_store_gathers_equal_direct_indexing(tiny_graph, in_memory):
    graph = GraphDir(tiny_graph)
    full = torch.cat([graph.shard(i)["feat"] for i in range(graph.num_shards)])
    store = FeatureStore(graph, in_memory=in_memory)
    ids = torch.from_numpy(
        np.random.default_rng(0).integers(0, 600, size=1000)
    )  # repeats, all shards, any order
    assert torch.equal(store.gather(ids), full[ids])
    assert store.gather(torch.tensor([], dtype=torch.int64)).shape == (0, 8)
    with pytest.raises(IndexError):
        store.gather(torch.tensor([600]))


def test_shards_are_read_lazily_through_mmap(tiny_graph):
    part = GraphDir(tiny_graph).shard(1)
    assert float(part["feat"].sum()) != 0.0
    maps = open("/proc/self/maps").read()
    assert str((tiny_graph / "part_00001.pt").resolve()) in maps


def test_self_loop_and_duplicate_policies(tmp_path):
    kept = build_graph(tmp_path / "k", *TINY_SYNTHETIC, "data.self_loops=add", "data.duplicate_edges=remove")
    indptr, indices = open_csc(GraphDir(kept))
    for v in (0, 300, 599):
        assert list(indices[indptr[v] : indptr[v + 1]]).count(v) == 1
    dup = build_graph(tmp_path / "d", *TINY_SYNTHETIC, "data.duplicate_edges=keep", "data.self_loops=keep")
    src, dst, _ = source_edges(*TINY_SYNTHETIC)
    assert GraphDir(dup).meta["num_edges"] == 2 * len(src)


def test_random_split_follows_fractions_and_seed(tmp_path):
    g = build_graph(tmp_path, *TINY_SYNTHETIC, "data.split_fractions=[0.5,0.25,0.25]", csc=False)
    splits = GraphDir(g).meta["splits"]
    assert splits["origin"] == "random"
    assert (
        abs(splits["train"] - 300) < 45 and abs(splits["val"] - 150) < 40 and abs(splits["test"] - 150) < 40
    )
    # The stage seed (`seed=`) draws the split; data.seed (the graph itself) stays fixed.
    fractions = "data.split_fractions=[0.5,0.25,0.25]"
    same = build_graph(tmp_path / "same", *TINY_SYNTHETIC, fractions, csc=False)
    other = build_graph(tmp_path / "other", *TINY_SYNTHETIC, fractions, "seed=1", csc=False)
    shards = [[(p / s["file"]).read_bytes() for s in GraphDir(p).meta["shards"]] for p in (g, same, other)]
    assert shards[0] == shards[1]  # same seed: byte-identical shards
    assert shards[0] != shards[2]
    masks = {
        p: [
            torch.cat([GraphDir(p).shard(i)[k] for i in range(3)])
            for k in ("train_mask", "val_mask", "test_mask")
        ]
        for p in (g, other)
    }
    assert all(not torch.equal(a, b) for a, b in zip(masks[g], masks[other], strict=True))
    ids = torch.arange(600)
    assert torch.equal(FeatureStore(GraphDir(g)).gather(ids), FeatureStore(GraphDir(other)).gather(ids))
    assert GraphDir(other).meta["splits"]["origin"] == "random"
