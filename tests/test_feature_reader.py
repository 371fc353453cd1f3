"""FeatureReader: explicit coalesced row reads equal the mmap gather bit for bit, whatever the id set,
the I/O mode (O_DIRECT or buffered), the threads, the buffer and the request size; plan() says what a
read costs; the shard layout is checked, not guessed."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

from gnnscale.errors import GraphDirError
from gnnscale.storage.feature_reader import (
    ALIGN,
    FeatureReader,
    _Ring,
    aligned_buffer,
    direct_works,
    feat_extent,
    open_read,
    plan_requests,
    read_into,
)
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.shard_writer import EdgePolicy, ShardWriter
from tests.conftest import build_graph

NODES, DIM, PER_SHARD = 3000, 64, 1000  # 256-byte rows, 256 KB of features per shard


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> GraphDir:
    """3 shards of 1000 nodes x 64 float32 features (no CSC: the reader needs none)."""
    root = tmp_path_factory.mktemp("reader")
    overrides = (
        f"data.num_nodes={NODES}",
        "data.avg_degree=4",
        f"data.feat_dim={DIM}",
        "data.num_classes=3",
        f"shard.nodes_per_shard={PER_SHARD}",
    )
    return GraphDir(build_graph(root, *overrides, csc=False))


@pytest.fixture(scope="module")
def store(graph) -> FeatureStore:
    return FeatureStore(graph)


def need_direct(direct: bool, path) -> None:
    if direct and not direct_works(path):
        pytest.skip("the filesystem of pytest's tmp_path refuses O_DIRECT")


def first_shard(graph: GraphDir):
    return graph.path / graph.meta["shards"][0]["file"]


def id_sets() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "random_with_duplicates": torch.randint(0, NODES, (2000,), generator=gen),
        "unsorted_unique": torch.randperm(NODES, generator=gen)[:700],
        "sorted_unique": torch.sort(torch.randperm(NODES, generator=gen)[:900]).values,
        "all_rows": torch.arange(NODES),
        "reversed": torch.arange(NODES - 1, -1, -1),
        "first_and_last": torch.tensor([0, NODES - 1]),
        "cross_shard_edges": torch.tensor([999, 1000, 1999, 2000, 0, 2999, 1000, 999]),
        "single_row": torch.tensor([1234]),
        "empty": torch.empty(0, dtype=torch.int64),
        "dense_run": torch.arange(500, 2600, 2),
    }


def check_all_sets(reader: FeatureReader, store: FeatureStore) -> None:
    for name, ids in id_sets().items():
        got = reader.read_rows(ids)
        assert got.shape == (len(ids), store.feat_dim) and got.dtype == store.dtype, name
        assert torch.equal(got, store.gather(ids)), name


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("in_flight", [1, 8])
def test_rows_equal_the_mmap_gather(graph, store, direct, in_flight):
    need_direct(direct, first_shard(graph))
    with FeatureReader(graph, in_flight=in_flight, direct=direct) as reader:
        assert reader.direct is direct
        check_all_sets(reader, store)


@pytest.mark.parametrize("direct", [True, False])
def test_tiny_buffers_and_requests_force_many_windows(graph, store, direct):
    need_direct(direct, first_shard(graph))
    # gap 0 and one-row requests: every row its own request, the ring wraps many times
    with FeatureReader(
        graph, in_flight=3, direct=direct, gap_bytes=0, max_request_bytes=1, buffer_bytes=1
    ) as reader:
        assert reader.buffer_bytes < 128 << 10  # grown only to what one row's requests need
        check_all_sets(reader, store)
        plan = reader.plan(torch.arange(NODES))
        assert plan["bytes"] > 8 * reader.buffer_bytes  # a whole read passes through the ring many times
        assert plan["requests"] >= plan["bytes"] / reader.max_request_bytes


def test_direct_none_falls_back_to_buffered_where_refused(graph, store, monkeypatch):
    import gnnscale.storage.feature_reader as fr

    monkeypatch.setattr(fr, "direct_works", lambda path: False)
    with FeatureReader(graph, direct=None) as reader:
        assert reader.direct is False
        check_all_sets(reader, store)
    with pytest.raises(GraphDirError, match="O_DIRECT"):
        FeatureReader(graph, direct=True)


def test_out_is_filled_in_place(graph, store):
    ids = torch.tensor([5, 2999, 5, 1000, 17])
    buf = torch.full((len(ids) + 3, DIM), float("nan"))
    with FeatureReader(graph, direct=False) as reader:
        got = reader.read_rows(ids, out=buf[: len(ids)])
        assert got.data_ptr() == buf.data_ptr()
        assert torch.equal(buf[: len(ids)], store.gather(ids)) and torch.isnan(buf[len(ids) :]).all()
        sorted_ids = torch.tensor([3, 4, 900, 2500])
        reader.read_rows(sorted_ids, out=buf[1:5])  # the sorted-unique path writes straight into out
        assert torch.equal(buf[1:5], store.gather(sorted_ids))
        with pytest.raises(ValueError, match="out must be"):
            reader.read_rows(ids, out=torch.empty(len(ids), DIM + 1))
        with pytest.raises(ValueError, match="out must be"):
            reader.read_rows(ids, out=torch.empty(len(ids), DIM, dtype=torch.float64))
        with pytest.raises(IndexError):
            reader.read_rows(torch.tensor([NODES]))
        with pytest.raises(IndexError):
            reader.read_rows(torch.tensor([-1]))


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("gap", [0, 4096, 1 << 20])
def test_plan_counts_what_a_read_does(graph, direct, gap):
    need_direct(direct, first_shard(graph))
    gen = torch.Generator().manual_seed(gap)
    ids = torch.unique(torch.randint(0, NODES, (400,), generator=gen))
    with FeatureReader(graph, direct=direct, gap_bytes=gap, max_request_bytes=64 << 10) as reader:
        plan = reader.plan(ids)
        reader.read_rows(ids)
        assert reader.stats["requests"] == plan["requests"]
        assert reader.stats["bytes_read"] == plan["bytes"]
        assert reader.stats["rows"] == plan["rows"] == len(ids)
        assert plan["useful_bytes"] == len(ids) * reader.row_bytes <= plan["bytes"]
        # duplicates and order do not change what is read
        reader.read_rows(torch.cat([ids.flip(0), ids[:10]]))
        assert reader.stats["requests"] == 2 * plan["requests"]
        assert reader.stats["bytes_read"] == 2 * plan["bytes"]
    if gap == 1 << 20:  # every shard's rows merge, split only by the request size
        assert plan["requests"] <= 3 * (-(-PER_SHARD * DIM * 4 // (64 << 10)) + 1)
    if gap == 0 and not direct:
        assert plan["bytes"] == plan["useful_bytes"]  # buffered, no gaps read: exactly the rows


def test_plan_requests_respect_alignment_size_and_gaps():
    rng = np.random.default_rng(1)
    row_bytes, align, gap, max_req = 300, ALIGN, 8192, 64 << 10
    stride = max_req - row_bytes - 2 * align
    shard = np.repeat([0, 1], 500)
    rows = np.concatenate([np.sort(rng.choice(20000, 500, replace=False)) for _ in range(2)])
    row_start = 100 + rows * row_bytes
    eof = np.array([10**9, 10**9])
    reqs = plan_requests(shard, row_start, row_bytes, align=align, gap=gap, stride=stride, eof=eof)
    assert (reqs.start % align == 0).all() and (reqs.length % align == 0).all()
    assert (reqs.length <= max_req).all() and (reqs.length >= reqs.needed).all()
    # every row lies inside its request, in the request's shard
    assert (reqs.within >= 0).all() and (reqs.within + row_bytes <= reqs.length[reqs.req]).all()
    assert (reqs.shard[reqs.req] == shard).all()
    # neighbouring requests of one shard are apart by more than the gap, or split by the size cap
    end = reqs.start + reqs.length
    same = reqs.shard[1:] == reqs.shard[:-1]
    apart = reqs.start[1:] - end[:-1] > gap
    capped = reqs.length[:-1] + (reqs.start[1:] - end[:-1]) + reqs.length[1:] > stride
    assert (~same | apart | capped).all()


def test_ring_never_hands_out_overlapping_space():
    rng = random.Random(0)
    ring, live = _Ring(1000), []
    for _ in range(5000):
        if live and (rng.random() < 0.45 or len(live) > 20):
            ring.free_oldest()
            live.pop(0)
            continue
        n = rng.randint(1, 250)
        at = ring.alloc(n)
        if at is None:
            assert live  # an empty ring always has room for a quarter of itself
            continue
        assert 0 <= at and at + n <= 1000
        assert all(at + n <= a or b <= at for a, b in live)
        live.append((at, at + n))


def test_read_into_stops_at_end_of_file(tmp_path):
    path = tmp_path / "short.bin"
    data = os.urandom(5000)
    path.write_bytes(data)
    for direct in (True, False):
        if direct and not direct_works(path):
            continue
        fd = open_read(path, direct)
        buf = aligned_buffer(8192)
        try:
            got = read_into(fd, memoryview(buf)[:8192], 0, direct)
            assert got == 5000 and bytes(buf[:5000]) == data
            assert read_into(fd, memoryview(buf)[:4096], 8192, direct) == 0
        finally:
            os.close(fd)
            buf.close()


def test_fp16_features(tmp_path):
    rng = np.random.default_rng(0)
    n, dim = 1500, 24
    writer = ShardWriter(
        tmp_path / "g16",
        name="fp16",
        num_nodes=n,
        feat_dim=dim,
        num_classes=2,
        nodes_per_shard=600,
        policy=EdgePolicy(),
        feat_dtype="float16",
    )
    writer.add_nodes(0, rng.standard_normal((n, dim)).astype(np.float16), rng.integers(0, 2, n), None)
    writer.add_edges(rng.integers(0, n, 3000), rng.integers(0, n, 3000))
    writer.finish()
    graph = GraphDir(tmp_path / "g16")
    store = FeatureStore(graph)
    ids = torch.randint(0, n, (3000,), generator=torch.Generator().manual_seed(1))
    for direct in (True, False):
        if direct and not direct_works(graph.path / "part_00000.pt"):
            continue
        with FeatureReader(graph, direct=direct, in_flight=4) as reader:
            assert reader.dtype == torch.float16 and reader.row_bytes == dim * 2
            got = reader.read_rows(ids)
            assert got.dtype == torch.float16 and torch.equal(got, store.gather(ids))


def test_layout_is_checked_against_meta(graph, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(graph.path, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["feat_dtype"] = "float64"
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphDirError, match="feat is float32"):
        FeatureReader(GraphDir(copy))
    meta["feat_dtype"], meta["feat_dim"] = "float32", DIM - 1
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphDirError, match="shape"):
        FeatureReader(GraphDir(copy))
    meta["feat_dim"] = DIM
    (copy / "meta.json").write_text(json.dumps(meta))
    shard = copy / "part_00001.pt"
    shard.write_bytes(shard.read_bytes()[:-200])  # truncated: the zip directory is gone
    with pytest.raises(GraphDirError, match="part_00001"):
        FeatureReader(GraphDir(copy))


def test_extent_matches_the_loaded_tensor(graph):
    """The offset found without loading is where torch's own mmap load puts the tensor."""
    info = graph.meta["shards"][1]
    path = graph.path / info["file"]
    ext = feat_extent(path, info["node_end"] - info["node_start"], DIM, "float32")
    raw = np.fromfile(path, dtype=np.uint8, count=ext.rows * DIM * 4, offset=ext.offset)
    assert torch.equal(torch.from_numpy(raw.view(np.float32).reshape(ext.rows, DIM)), graph.shard(1)["feat"])


def test_close_releases_files(graph):
    reader = FeatureReader(graph, direct=False)
    reader.read_rows(torch.tensor([1, 2]))
    fds = list(reader._fds)
    with reader:
        pass
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    reader.close()  # twice is fine


def test_a_shard_cut_short_under_the_reader_is_an_error_and_the_reader_goes_on(graph, store, tmp_path):
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 1000)
    with FeatureReader(graph, direct=False, in_flight=4) as reader:
        real = reader._fds[1]
        reader._fds[1] = os.open(short, os.O_RDONLY)  # as if shard 1 had been truncated after opening
        try:
            with pytest.raises(GraphDirError, match="ended early"):
                reader.read_rows(torch.arange(0, NODES, 3))
        finally:
            os.close(reader._fds[1])
            reader._fds[1] = real
        ids = torch.arange(0, NODES, 3)
        assert torch.equal(reader.read_rows(ids), store.gather(ids))


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("max_rows", [1, 333, 1000, 5000])
def test_spans_are_whole_rows_of_the_in_memory_features(graph, store, direct, max_rows):
    """Spans cut at shard boundaries, none longer than asked; each read whole equals the in-memory rows,
    first and last spans included, with several in flight into their own buffers."""
    need_direct(direct, first_shard(graph))
    with FeatureReader(graph, direct=direct, max_request_bytes=64 << 10) as reader:
        starts = reader.spans(max_rows)
        assert starts[0] == 0 and starts[-1] == NODES and (np.diff(starts) > 0).all()
        assert np.diff(starts).max() <= max_rows
        assert set(range(0, NODES, PER_SHARD)) <= set(starts.tolist())  # no span crosses a shard
        picks = [0, len(starts) // 2, len(starts) - 2] if len(starts) > 4 else range(len(starts) - 1)
        bufs = {i: reader.span_buffer(int(np.diff(starts).max())) for i in picks}
        reads = {i: reader.read_span(starts[i], starts[i + 1], bufs[i]) for i in picks}  # all in flight
        for i, job in reads.items():
            rows = job.result().view(store.dtype)
            assert torch.equal(rows, store.gather(torch.arange(starts[i], starts[i + 1]))), i
        assert reader.stats["bytes_read"] >= sum(int(starts[i + 1] - starts[i]) for i in picks) * DIM * 4


def test_a_span_must_lie_in_one_shard_and_fit_its_buffer(graph):
    with FeatureReader(graph, direct=False) as reader:
        with pytest.raises(IndexError, match="one shard"):
            reader.read_span(PER_SHARD - 1, PER_SHARD + 1, reader.span_buffer(2))
        with pytest.raises(ValueError, match="does not fit"):
            reader.read_span(0, 100, reader.span_buffer(10))
