"""Summing layers by source chunks (inference/chunked.py) and by streamed tiles (inference/tiled.py):
bit-equal to DGL's own conv for one chunk, to each other for many, close to the full-graph forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnscale.inference import chunked, tiled
from gnnscale.inference.blocks import Adjacency
from gnnscale.inference.layerwise import layer_paths, run_layers
from gnnscale.models.checkpoint import load_model
from gnnscale.models.sums import sage_from_sums
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from tests.conftest import build_graph
from tests.test_infer_support import make_ckpt, reference_layers


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    # 700 nodes over three shards whose boundaries cut the source chunks mid-way
    return build_graph(
        tmp_path_factory.mktemp("chunked_graph"),
        "data.num_nodes=700",
        "data.avg_degree=9",
        "data.feat_dim=8",
        "data.num_classes=3",
        "shard.nodes_per_shard=260",
    )


@pytest.mark.parametrize("aggregator", ["mean", "gcn"])
def test_sums_then_dense_part_equal_the_conv_bit_for_bit(aggregator):
    import dgl
    import dgl.nn as dglnn

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, e = 300, 2400
    dst, src = rng.integers(0, n, e), rng.integers(0, n, e)
    order = np.lexsort((src, dst))
    dst, src = dst[order], src[order]
    ip = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ip[1:])
    x = torch.randn(n, 8)
    conv = dglnn.SAGEConv(8, 16, aggregator).eval()
    with torch.no_grad():
        bias = conv.fc_self.bias if aggregator == "mean" else conv.bias
        bias.add_(0.1)
        block = dgl.create_block(
            ("csc", (torch.from_numpy(ip), torch.from_numpy(src), torch.empty(0, dtype=torch.int64))),
            num_src_nodes=n,
            num_dst_nodes=n,
        )
        want = conv(block, (x, x))
        # the sums carried across uneven chunks of the sources, as a streamed tile builds them
        bounds = np.array([0, 7, 120, 121, 260, n])
        split = chunked.ChunkEdges(ip, src, bounds)
        sums = torch.empty((n, 8))
        for c in range(len(bounds) - 1):
            buf = torch.zeros((n + bounds[c + 1] - bounds[c], 8))
            buf[n:] = x[bounds[c] : bounds[c + 1]]
            buf[:n] = sums
            cip, csrc = split.edges(c)
            sums = chunked.carried_sum(cip, csrc, buf, n, carry=c > 0)
        assert torch.equal(sums, chunked.chunk_sum(ip, src, x))
        got = sage_from_sums(conv, sums, torch.from_numpy(np.diff(ip)), x)
    assert torch.equal(got, want)


def test_chunk_edges_split_every_row_in_csc_order():
    ip = np.array([0, 3, 3, 7])
    src = np.array([1, 4, 9, 0, 2, 5, 8])
    split = chunked.ChunkEdges(ip, src, np.array([0, 3, 6, 10]))
    got = [split.edges(c) for c in range(3)]
    assert [g[0].tolist() for g in got] == [[0, 1, 1, 3], [0, 1, 1, 2], [0, 1, 1, 2]]
    assert [g[1].tolist() for g in got] == [[1, 0, 2], [1, 2], [3, 2]]


def _layers(tmp_path, graph, ckpt, name, free_bytes):
    g = GraphDir(graph)
    model = load_model(ckpt).model
    indptr, indices = open_csc(g)
    paths = layer_paths(tmp_path / name, model.num_layers)
    stats = run_layers(
        model,
        Adjacency(indptr, indices),
        FeatureStore(g),
        paths,
        mode="disk" if free_bytes is not None else "memory",
        batch_size=97,
        free_bytes=free_bytes,
    )
    return [np.load(p) for p in paths], [s.sources for s in stats]


@pytest.mark.parametrize(
    "layers,free_bytes,tiles", [(2, 1, "8 tiles of 97 rows"), (3, 1 << 30, "1 tile of 700 rows")]
)
def test_streamed_tiles_equal_the_in_memory_run_bit_for_bit(
    tmp_path, graph, monkeypatch, layers, free_bytes, tiles
):
    # 8 -> 16 (sums, then projects) ... -> 3 (projects first); chunks of 40 rows of 8 floats (18 chunks),
    # sums of 30 destinations at a time (several to a batch of 97)
    monkeypatch.setattr(tiled, "MIN_CHUNK_BYTES", 40 * 8 * 4)
    monkeypatch.setattr(tiled, "MAX_CHUNK_BYTES", 40 * 8 * 4)
    monkeypatch.setattr(tiled, "SUM_ROWS", 30)
    ckpt = make_ckpt(tmp_path / "train", graph, hidden=16, num_layers=layers, norm="batch")
    mem, how_mem = _layers(tmp_path, graph, ckpt, "memory", None)
    disk, how_disk = _layers(tmp_path, graph, ckpt, "disk", free_bytes)
    assert how_mem[0] == "in place"
    assert how_disk[0] == f"streamed: {tiles}, input read in 18 chunks per tile"
    assert how_mem[-1] == how_disk[-1] == "projected"
    for a, b in zip(mem, disk, strict=True):
        assert np.array_equal(a, b)
    ref = reference_layers(ckpt, graph)
    for got, want in zip(mem, ref, strict=True):
        assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("degree", [False, True])
def test_feature_chunks_read_exactly_the_stored_rows(graph, monkeypatch, degree):
    # pieces of 7 rows: ranges crossing the shard boundaries at 260 and 520 take several reads each
    monkeypatch.setattr(tiled, "_PIECE_BYTES", 7 * 8 * 4)
    g = GraphDir(graph)
    store = FeatureStore(g, degree_indptr=np.asarray(open_csc(g)[0]) if degree else None)
    chunks = tiled.FeatureChunks(store)
    try:
        for lo, hi in [(0, 1), (0, 700), (250, 530), (519, 521), (699, 700), (3, 260)]:
            out = torch.full((hi - lo + 5, store.feat_dim), float("nan"))
            chunks.read(lo, hi, out)
            want = store.gather(torch.arange(lo, hi)).float()
            assert torch.equal(out[: hi - lo], want) and out[hi - lo :].isnan().all()
            assert torch.equal(chunks.rows(lo, hi), want)
    finally:
        chunks.close()


def test_streamed_progress_only_moves_forward_to_every_row(tmp_path, graph, monkeypatch):
    monkeypatch.setattr(tiled, "MIN_CHUNK_BYTES", 40 * 8 * 4)
    monkeypatch.setattr(tiled, "MAX_CHUNK_BYTES", 40 * 8 * 4)
    ckpt = make_ckpt(tmp_path / "train", graph, hidden=16, num_layers=2, norm="batch")
    g = GraphDir(graph)
    indptr, indices = open_csc(g)
    seen: list[tuple[int, int, int]] = []
    run_layers(
        load_model(ckpt).model,
        Adjacency(indptr, indices),
        FeatureStore(g),
        layer_paths(tmp_path / "p", 2),
        mode="disk",
        batch_size=97,
        free_bytes=1,
        progress=lambda layer, done, total: seen.append((layer, done, total)),
    )
    first = [d for layer, d, t in seen if layer == 0]
    # 8 tiles of 97 rows: 18 chunk steps and one batch each
    assert first == sorted(first) and first[-1] == 700 and len(first) == 8 * (18 + 1)
    assert {t for _, _, t in seen} == {700}
