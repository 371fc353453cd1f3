"""sampler=neighbor: DGL's draws, gnnscale's relabelling. Blocks must be valid DGL blocks with DGL's
conventions, equal DGL's own sampler where no randomness is involved, and repeat across processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dgl
import numpy as np
import pytest
import torch

from gnnscale.sampling import blocks as blocks_mod
from gnnscale.sampling.graph import to_dgl_graph
from gnnscale.sampling.neighbor import NeighborBlockSampler
from gnnscale.storage.graph_dir import GraphDir
from tests.conftest import TINY_SYNTHETIC, build_graph, edge_pairs


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("tiny"), *TINY_SYNTHETIC)


@pytest.fixture(scope="module")
def g(graph_dir):
    return to_dgl_graph(GraphDir(graph_dir))


def global_edges(block) -> set[tuple[int, int]]:
    s, d = edge_pairs(block)
    src, dst = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
    return set(zip(src[s].tolist(), dst[d].tolist(), strict=True))


def test_blocks_follow_dgl_conventions(g):
    torch.manual_seed(0)
    seeds = torch.randperm(g.num_nodes())[:50]  # shuffled, as a DataLoader batch is
    fanouts = [3, 2]
    input_nodes, out, blocks = NeighborBlockSampler(fanouts).sample(g, seeds)
    assert torch.equal(out, seeds) and torch.equal(blocks[-1].dstdata[dgl.NID], seeds)
    assert torch.equal(input_nodes, blocks[0].srcdata[dgl.NID])
    src_all, dst_all = edge_pairs(g)
    graph_edges = set(zip(src_all.tolist(), dst_all.tolist(), strict=True))
    in_deg = g.in_degrees()
    for i, (block, fanout) in enumerate(zip(blocks, fanouts, strict=True)):
        src, dst = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
        n_dst = block.num_dst_nodes()
        assert torch.equal(src[:n_dst], dst)  # destinations first among the sources (SAGEConv relies on it)
        rest = src[n_dst:]
        assert bool((rest[1:] > rest[:-1]).all())  # the other sources once each, ascending
        assert not set(rest.tolist()) & set(dst.tolist())
        edges = global_edges(block)
        assert edges <= graph_edges and len(edges) == block.num_edges()  # real edges, none twice
        want = torch.clamp(in_deg[dst], max=fanout)
        assert torch.equal(block.in_degrees(), want)
        if i + 1 < len(blocks):
            assert torch.equal(blocks[i + 1].srcdata[dgl.NID], dst)


def test_full_neighbourhoods_equal_dgls_sampler(g):
    seeds = torch.arange(0, g.num_nodes(), 7)
    _, _, ours = NeighborBlockSampler([-1, -1]).sample(g, seeds)
    _, _, theirs = dgl.dataloading.NeighborSampler([-1, -1]).sample(
        g, seeds.to(g.idtype)
    )  # DGL's: its idtype
    for a, b in zip(ours, theirs, strict=True):
        assert global_edges(a) == global_edges(b)
        assert set(a.srcdata[dgl.NID].tolist()) == set(b.srcdata[dgl.NID].tolist())


def test_sort_and_scan_relabelling_agree(g, monkeypatch):
    seeds = torch.randperm(g.num_nodes(), generator=torch.Generator().manual_seed(1))[:64]
    out = []
    for threshold in (0.0, float("inf")):  # scan an N-sized mark array / sort the batch's sources
        monkeypatch.setattr(blocks_mod, "_SORT_BELOW_EDGES_PER_NODE", threshold)
        dgl.seed(3)
        out.append(NeighborBlockSampler([4, 3]).sample(g, seeds))
    for a, b in zip(out[0][2], out[1][2], strict=True):
        assert torch.equal(a.srcdata[dgl.NID], b.srcdata[dgl.NID])
        assert all(torch.equal(x, y) for x, y in zip(a.adj_tensors("csc"), b.adj_tensors("csc"), strict=True))


SAMPLE_TWICE = textwrap.dedent(
    """
    import hashlib, sys, torch, dgl
    from gnnscale.sampling import set_sampling_threads
    from gnnscale.sampling.neighbor import NeighborBlockSampler
    from gnnscale.sampling.graph import to_dgl_graph
    from gnnscale.storage.graph_dir import GraphDir
    g = to_dgl_graph(GraphDir(sys.argv[1]))
    set_sampling_threads(3)  # more threads than CI's cores: their order must not matter
    dgl.seed(int(sys.argv[2]))
    h = hashlib.sha256()
    sampler = NeighborBlockSampler([5, 5])
    for k in range(4):
        inp, _, blocks = sampler.sample(g, torch.arange(k * 100, k * 100 + 100))
        h.update(inp.numpy().tobytes())
        for b in blocks:
            for t in b.adj_tensors("csc")[:2]:
                h.update(t.numpy().tobytes())
    print(h.hexdigest())
    """
)


def test_seeded_sampling_repeats_in_another_process(graph_dir):
    """What resuming a killed run relies on: the same seed draws the same blocks in a new process,
    with several sampling threads (each draws from its own seeded stream)."""

    def digest(seed: int) -> str:
        out = subprocess.run(
            [sys.executable, "-c", SAMPLE_TWICE, str(graph_dir), str(seed)],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip().splitlines()[-1]

    first, again, other = digest(7), digest(7), digest(8)
    assert first == again
    assert first != other


def test_block_builder_maps_rows_for_any_destination_order():
    """from_edges with shuffled destinations and edges not grouped by destination."""
    builder = blocks_mod.BlockBuilder(10)
    dst = np.array([7, 2, 5])
    src = np.array([1, 9, 2, 3, 1])
    edge_dst = np.array([5, 7, 5, 2, 7])
    block, src_ids = builder.from_edges(dst, src, edge_dst)
    assert src_ids.tolist() == [7, 2, 5, 1, 3, 9]
    assert global_edges(block) == {(1, 5), (9, 7), (2, 5), (3, 2), (1, 7)}
    assert block.in_degrees().tolist() == [2, 1, 2]
