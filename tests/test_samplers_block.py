"""The block samplers beside neighbor (labor, importance, weighted, random_walk): valid DGL blocks in
gnnscale's layout, draws that repeat across processes, PageRank against a scipy reference, options
checked, and a short train + layer-wise inference through the CLI with each."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dgl
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from omegaconf import OmegaConf
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import ConfigError, GraphDirError
from gnnscale.sampling import SamplingContext, build_sampler
from gnnscale.sampling import importance as importance_mod
from gnnscale.sampling.graph import to_dgl_graph
from gnnscale.sampling.random_walk import top_visited
from gnnscale.storage import node_scores
from gnnscale.storage.csc import open_csc
from gnnscale.storage.graph_dir import GraphDir
from tests.conftest import build_graph, edge_pairs

runner = CliRunner()
GRAPH = (
    "data.num_nodes=1000",
    "data.avg_degree=8",
    "data.feat_dim=8",
    "data.num_classes=3",
    "data.feature_signal=1.0",
    "shard.nodes_per_shard=400",
)
# name -> sampler config (fanouts added per test)
KINDS = {
    "labor": {"kind": "labor"},
    "labor-1": {"kind": "labor", "importance_sampling": 1},
    "importance-degree": {"kind": "importance", "score": "degree"},
    "importance-pagerank": {"kind": "importance", "score": "pagerank"},
    "weighted": {"kind": "weighted", "edge_weight": "w"},
    "random_walk": {"kind": "random_walk", "num_walks": 10, "walk_length": 3, "restart_prob": 0.5},
}


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    path = build_graph(tmp_path_factory.mktemp("blocks"), *GRAPH)
    graph = GraphDir(path)
    _, indices = open_csc(graph)
    # Weights that exclude every odd source: a misaligned weight array would show at once.
    node_scores.write_edge_data(graph, "w", np.where(indices % 2 == 0, 1.0 + indices % 7, 0.0))
    return path


@pytest.fixture(scope="module")
def g(graph_dir):
    return to_dgl_graph(GraphDir(graph_dir))


def make(graph_dir, g, name: str, fanouts, **extra):
    cfg = OmegaConf.create({**KINDS[name], "fanouts": list(fanouts), **extra})
    sampler = build_sampler(cfg, len(fanouts))
    if hasattr(sampler, "prepare"):
        sampler.prepare(SamplingContext(GraphDir(graph_dir), g, torch.arange(10), torch.zeros(10)))
    return sampler


def global_edges(block) -> list[tuple[int, int]]:
    s, d = edge_pairs(block)
    src, dst = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
    return list(zip(src[s].tolist(), dst[d].tolist(), strict=True))


def within_hops(g, hops: int) -> sp.csr_matrix:
    """R[v, u] != 0 when u reaches v's in-neighbourhood within `hops` reversed steps."""
    s, d = edge_pairs(g)
    n = g.num_nodes()
    a = sp.csr_matrix((np.ones(len(s)), (d.numpy(), s.numpy())), shape=(n, n))
    reach, step = a.copy(), a.copy()
    for _ in range(hops - 1):
        step = step @ a
        reach = reach + step
    return reach


@pytest.mark.parametrize("name", list(KINDS))
def test_blocks_are_consistent(graph_dir, g, name):
    fanouts = [4, 3]
    torch.manual_seed(0)
    dgl.seed(0)
    seeds = torch.randperm(g.num_nodes())[:64]  # shuffled, as a DataLoader batch is
    input_nodes, out, blocks = make(graph_dir, g, name, fanouts).sample(g, seeds)
    n = g.num_nodes()
    assert torch.equal(out, seeds) and torch.equal(blocks[-1].dstdata[dgl.NID], seeds)
    assert torch.equal(input_nodes, blocks[0].srcdata[dgl.NID])
    src_all, dst_all = edge_pairs(g)
    graph_edges = set(zip(src_all.tolist(), dst_all.tolist(), strict=True))
    reach = within_hops(g, KINDS[name].get("walk_length", 1))
    for i, (block, fanout) in enumerate(zip(blocks, fanouts, strict=True)):
        src, dst = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
        n_dst = block.num_dst_nodes()
        assert int(src.min()) >= 0 and int(src.max()) < n
        assert torch.equal(src[:n_dst], dst)  # destinations lead the sources, in the same order
        rest = src[n_dst:]
        assert bool((rest[1:] > rest[:-1]).all()) and not set(rest.tolist()) & set(dst.tolist())
        if i + 1 < len(blocks):
            assert block.num_dst_nodes() == blocks[i + 1].num_src_nodes()
            assert torch.equal(blocks[i + 1].srcdata[dgl.NID], dst)
        edges = global_edges(block)
        assert len(set(edges)) == len(edges) == block.num_edges() > 0  # none twice
        deg = block.in_degrees()
        if name == "random_walk":
            assert int(deg.max()) <= fanout
            assert all(s != d and reach[d, s] != 0 for s, d in edges)  # reached within walk_length hops
        else:
            assert set(edges) <= graph_edges
            eids = block.edata[dgl.EID]
            assert torch.equal(src_all[eids], src[edge_pairs(block)[0]])  # edge ids are the graph's
        if name.startswith("importance") or name == "weighted":
            assert int(deg.max()) <= fanout
        if name == "weighted":
            assert all(s % 2 == 0 for s, _ in edges)  # zero-weight edges are never drawn
        if name == "labor-1":
            w = block.edata["edge_weight"]
            assert len(w) == block.num_edges() and bool((w > 0).all())
            sums = torch.zeros(n_dst).index_add_(0, edge_pairs(block)[1], w)
            torch.testing.assert_close(sums, deg.float())  # DGL normalises them per destination
        else:
            assert "edge_weight" not in block.edata


SAMPLE_ALL = textwrap.dedent(
    """
    import hashlib, json, sys, torch, dgl
    from omegaconf import OmegaConf
    from gnnscale.sampling import SamplingContext, build_sampler, set_sampling_threads
    from gnnscale.sampling.graph import to_dgl_graph
    from gnnscale.storage.graph_dir import GraphDir
    graph = GraphDir(sys.argv[1])
    g = to_dgl_graph(graph)
    set_sampling_threads(3)  # more threads than CI's cores: their order must not matter
    out = {}
    for name, cfg in json.loads(sys.argv[3]).items():
        sampler = build_sampler(OmegaConf.create(cfg), 2)
        if hasattr(sampler, "prepare"):
            sampler.prepare(SamplingContext(graph, g, torch.arange(10), torch.zeros(10)))
        dgl.seed(int(sys.argv[2]))
        torch.manual_seed(int(sys.argv[2]))
        h = hashlib.sha256()
        for k in range(4):
            inp, _, blocks = sampler.sample(g, torch.arange(k * 100, k * 100 + 100))
            h.update(inp.numpy().tobytes())
            for b in blocks:
                for t in b.adj_tensors("csc")[:2]:
                    h.update(t.numpy().tobytes())
                if "edge_weight" in b.edata:
                    h.update(b.edata["edge_weight"].numpy().tobytes())
        out[name] = h.hexdigest()
    print(json.dumps(out))
    """
)


def test_seeded_sampling_repeats_in_another_process(graph_dir):
    """The same seed draws the same blocks in a fresh process (with several sampling threads), another
    seed other blocks: for every sampler."""
    cfgs = {name: {**cfg, "fanouts": [5, 5]} for name, cfg in KINDS.items()}

    def digests(seed: int) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", SAMPLE_ALL, str(graph_dir), str(seed), json.dumps(cfgs)],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, again, other = digests(7), digests(7), digests(8)
    assert set(first) == set(KINDS)
    for name in KINDS:
        assert first[name] == again[name], name
        assert first[name] != other[name], name


def mean_input_nodes(sampler, g, batches: list[torch.Tensor]) -> float:
    dgl.seed(1)
    torch.manual_seed(1)
    return float(np.mean([len(sampler.sample(g, seeds)[0]) for seeds in batches]))


def test_labor_needs_fewer_input_nodes_than_neighbor(graph_dir, g):
    from gnnscale.sampling.neighbor import NeighborBlockSampler

    perm = torch.randperm(g.num_nodes(), generator=torch.Generator().manual_seed(0))
    batches = [perm[k : k + 32] for k in range(0, 320, 32)]
    fanouts = [5, 5]
    neighbor = mean_input_nodes(NeighborBlockSampler(fanouts), g, batches)
    labor = mean_input_nodes(make(graph_dir, g, "labor", fanouts), g, batches)
    labor_1 = mean_input_nodes(make(graph_dir, g, "labor-1", fanouts), g, batches)
    assert labor < neighbor and labor_1 < labor, (neighbor, labor, labor_1)


def pagerank_by_solve(indptr, indices, n: int, damping: float) -> np.ndarray:
    """The fixed point itself: (I - d (P + dangling mass / N)) x = (1 - d) / N, solved densely."""
    dst = np.repeat(np.arange(n), np.diff(indptr))
    a = sp.csr_matrix((np.ones(len(indices)), (dst, indices)), shape=(n, n)).toarray()
    out_deg = a.sum(axis=0)
    dangling = out_deg == 0
    p = a / np.where(dangling, 1.0, out_deg)
    p[:, dangling] = 1.0 / n
    return np.linalg.solve(np.eye(n) - damping * p, np.full(n, (1 - damping) / n))


def test_pagerank_matches_a_linear_solve_with_dangling_nodes():
    # 0 -> 1 -> 2 -> 0, 3 -> 2, 2 -> 4, 4 -> 5 (5 has no out-edge), 6 isolated; CSC = in-edges per node
    edges = [(0, 1), (1, 2), (2, 0), (3, 2), (2, 4), (4, 5)]
    n = 7
    ins = [sorted(s for s, d in edges if d == v) for v in range(n)]
    indptr = np.cumsum([0] + [len(x) for x in ins])
    indices = np.array([s for x in ins for s in x], dtype=np.int64)
    for chunk in (2, 1 << 22):  # chunked passes over the CSC equal a single one
        x = node_scores.pagerank(indptr, indices, n, damping=0.85, iters=200, chunk_edges=chunk)
        np.testing.assert_allclose(x, pagerank_by_solve(indptr, indices, n, 0.85), rtol=0, atol=1e-12)
        assert abs(x.sum() - 1.0) < 1e-12


def test_pagerank_is_cached_in_the_graph_dir_and_matches_scipy(graph_dir, g, monkeypatch):
    graph = GraphDir(graph_dir)
    indptr, indices = open_csc(graph)
    n = graph.num_nodes
    importance_mod._shared.clear()
    sampler = make(graph_dir, g, "importance-pagerank", [5, 5], pagerank_iters=120)
    path = graph_dir / "scores" / "pagerank-0.85-120.npy"
    assert sampler.scores_file == path and path.is_file()
    x = np.load(path)
    np.testing.assert_allclose(x, pagerank_by_solve(indptr, indices, n, 0.85), rtol=0, atol=1e-6)
    # the per-edge probabilities are the source's score, edge by edge in CSC order
    np.testing.assert_allclose(sampler.prob.numpy(), x[indices].astype(np.float32))
    # a second run reads the file instead of iterating again
    monkeypatch.setattr(node_scores, "pagerank", lambda *a, **k: pytest.fail("PageRank recomputed"))
    importance_mod._shared.clear()
    again = make(graph_dir, g, "importance-pagerank", [5, 5], pagerank_iters=120)
    assert torch.equal(again.prob, sampler.prob)


def test_top_visited_ranks_by_visits_then_id():
    dst = np.array([5, 2])
    visits = np.array(
        [
            [7, 5, 3],  # walks of 5: 5 itself never counts
            [3, -1, -1],
            [9, 9, 7],  # walks of 2
            [1, 9, -1],
        ]
    )
    src, edge_dst = top_visited(dst, visits, walks_per_dst=2, num_nodes=10, k=2)
    assert list(zip(src.tolist(), edge_dst.tolist(), strict=True)) == [(3, 5), (7, 5), (9, 2), (1, 2)]
    src, _ = top_visited(dst, visits, walks_per_dst=2, num_nodes=10, k=-1)
    assert src.tolist() == [3, 7, 9, 1, 7]


@pytest.mark.parametrize(
    "cfg, needle",
    [
        ({"kind": "labor", "importance_sampling": -2}, "sampler.importance_sampling=-2 is not valid"),
        ({"kind": "labor", "fanouts": [5]}, "sampler.fanouts has 1 entries"),
        ({"kind": "importance", "score": "katz"}, "sampler.score='katz' is not known"),
        ({"kind": "importance", "pagerank_damping": 1.0}, "sampler.pagerank_damping=1.0 is outside"),
        ({"kind": "importance", "pagerank_iters": 0}, "sampler.pagerank_iters=0 must be at least 1"),
        ({"kind": "weighted", "edge_weight": "../w"}, "sampler.edge_weight='../w' is not a valid key"),
        ({"kind": "random_walk", "num_walks": 0}, "sampler.num_walks=0 must be at least 1"),
        ({"kind": "random_walk", "walk_length": 0}, "sampler.walk_length=0 must be at least 1"),
        ({"kind": "random_walk", "restart_prob": 1.0}, "sampler.restart_prob=1.0 is outside"),
    ],
)
def test_bad_options_are_config_errors(cfg, needle):
    cfg = OmegaConf.create({"fanouts": [5, 5], **cfg})
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace(".", r"\.")) as info:
        build_sampler(cfg, 2)
    assert info.value.hint


def test_weighted_without_its_file_exits_2_naming_the_file(tmp_path, graph_dir):
    result = runner.invoke(
        app,
        ["train", f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'r'}", "sampler=weighted",
         "sampler.edge_weight=strength", "train.epochs=1"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "edata_strength.npy is absent" in lines[0] and "non-negative floats" in lines[0]
    with pytest.raises(GraphDirError, match="has shape"):
        node_scores.write_edge_data(GraphDir(graph_dir), "short", np.ones(3, dtype=np.float32))
        node_scores.open_edge_data(GraphDir(graph_dir), "short")


CLI_OPTIONS = {
    "labor": ["sampler=labor", "sampler.importance_sampling=1"],
    "importance-pagerank": ["sampler=importance", "sampler.score=pagerank"],
    "weighted": ["sampler=weighted", "sampler.edge_weight=w"],
    "random_walk": ["sampler=random_walk", "sampler.num_walks=5"],
}


@pytest.mark.parametrize("name", list(CLI_OPTIONS))
def test_train_one_epoch_then_infer_layerwise(tmp_path, graph_dir, name):
    run = tmp_path / "train"
    result = runner.invoke(
        app,
        ["train", f"graph_dir={graph_dir}", f"run_dir={run}", *CLI_OPTIONS[name], "sampler.fanouts=[5,5]",
         "train.epochs=1", "train.batch_size=128", "model.hidden=16"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs_run"] == 1 and 0.0 <= summary["test_acc"] <= 1.0
    out = tmp_path / "infer"
    result = runner.invoke(app, ["infer", "--layerwise", f"ckpt={run}", f"run_dir={out}"])
    assert result.exit_code == 0, result.output
    assert "test accuracy" in result.stdout and (out / "embeddings.npy").is_file()
