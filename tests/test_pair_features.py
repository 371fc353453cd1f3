"""Pairwise structural counts for link prediction (gnnscale/tasks/pair_features.py): exact CN / AA / RA / PA
against a reference by hand, no held-out edge reaching them, heuristics in the link report, and the decoder
reading them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnscale.config import compose_config
from gnnscale.storage.edge_split import ensure_edge_split
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.tasks.pair_features import PAIR_FEATURES, PairStructure
from tests.conftest import build_graph
from tests.test_link import UNLABELLED
from tests.test_link import _train as train_link


def _reference(adj: dict[int, set], u: int, v: int) -> list[float]:
    """CN, AA, RA, PA of (u, v) by the definitions, from neighbour sets."""
    shared = adj.get(u, set()) & adj.get(v, set())
    deg = {w: len(adj.get(w, ())) for w in shared}
    aa = sum(1.0 / math.log(deg[w]) for w in shared if deg[w] > 1)
    ra = sum(1.0 / deg[w] for w in shared if deg[w] > 0)
    return [float(len(shared)), aa, ra, float(len(adj.get(u, ())) * len(adj.get(v, ())))]


def _random_csc(n: int, e: int, seed: int, shuffle_rows: bool = False):
    """A random directed graph as CSC (indptr, indices), with repeated edges, and its neighbour sets."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src, dst = np.concatenate([src, src[:20]]), np.concatenate([dst, dst[:20]])  # 20 repeated edges
    order = np.lexsort((src, dst)) if not shuffle_rows else np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    adj: dict[int, set] = {}
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        adj.setdefault(d, set()).add(s)  # a row of the CSC: d's in-neighbours
    return indptr, src.astype(np.int64), adj


@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_counts_equal_the_definitions(shuffle_rows):
    n = 80
    indptr, indices, adj = _random_csc(n, 900, 0, shuffle_rows)
    s = PairStructure(indptr, indices, n)
    rng = np.random.default_rng(1)
    u, v = torch.from_numpy(rng.integers(0, n, 200)), torch.from_numpy(rng.integers(0, n, 200))
    got = s.pairs(u, v).numpy()
    want = np.array([_reference(adj, a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[:, 0].max() >= 2  # pairs with several common neighbours were checked
    cand = torch.from_numpy(rng.integers(0, n, 30))
    grid = s.grid(u[:40], cand).numpy()
    for i, a in enumerate(u[:40].tolist()):
        for j, c in enumerate(cand.tolist()):
            np.testing.assert_allclose(grid[i, j], _reference(adj, a, c), rtol=1e-5, atol=1e-6)


def test_counts_equal_a_scipy_reference():
    n = 300
    indptr, indices, _ = _random_csc(n, 6000, 2)
    a = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n))
    a.sum_duplicates()
    a.data[:] = 1.0
    deg = np.asarray(a.sum(1)).ravel()
    cn = (a @ a.T).toarray()
    aa = (a @ sp.diags(np.where(deg > 1, 1 / np.log(np.maximum(deg, 2)), 0)) @ a.T).toarray()
    ra = (a @ sp.diags(np.where(deg > 0, 1 / np.maximum(deg, 1), 0)) @ a.T).toarray()
    pa = np.outer(deg, deg)
    s = PairStructure(indptr, indices.astype(np.int32), n)
    nodes = torch.arange(n)
    grid = s.grid(nodes, nodes).numpy()
    for k, ref in enumerate((cn, aa, ra, pa)):
        np.testing.assert_allclose(grid[:, :, k], ref, rtol=1e-5, atol=1e-5)
    assert PAIR_FEATURES == ("cn", "aa", "ra", "pa")


def test_learned_common_weighting_sums_its_curve_and_trains_and_ranks_alike():
    """task.learned_common: the extra count is Σ curve(deg w) over the common neighbours, the same on the
    training path (pairs, differentiable) and the ranking path (grid), and its curve receives gradients."""
    from gnnscale.tasks.link import CountHead

    n = 80
    indptr, indices, adj = _random_csc(n, 900, 3)
    s = PairStructure(indptr, indices, n)
    torch.manual_seed(0)
    head = CountHead(len(PAIR_FEATURES), learned=True)
    curve = head.curve.per_node(s.degree)
    rng = np.random.default_rng(4)
    u, v = torch.from_numpy(rng.integers(0, n, 100)), torch.from_numpy(rng.integers(0, n, 100))
    got = head.pair_counts(s, u, v)
    pairs = zip(u.tolist(), v.tolist(), strict=True)
    want = [sum(curve[w] for w in adj.get(a, set()) & adj.get(b, set())) for a, b in pairs]
    np.testing.assert_allclose(got[:, -1].detach().numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, :-1].detach().numpy(), s.pairs(u, v).numpy())
    assert max(want) > 0
    got[:, -1].sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in head.curve.parameters())
    grid = head.grid_counts(s, u[:20], v, s.grid(u[:20], v))
    for i in range(20):
        for j in range(0, 100, 7):
            ref = sum(curve[w] for w in adj.get(int(u[i]), set()) & adj.get(int(v[j]), set()))
            assert float(grid[i, j, -1]) == pytest.approx(ref, rel=1e-5, abs=1e-6)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("pairs"), *UNLABELLED)


def test_no_held_out_edge_reaches_the_counts(graph):
    """For a held-out edge (u, v) and a training neighbour x of v, v would be a common neighbour of u and x
    if the full graph were used: the task's counts must equal those of the training edges alone."""
    from gnnscale.storage.csc import open_csc
    from gnnscale.tasks import build_task

    split = ensure_edge_split(GraphDir(graph), 0, 0.1, 0.1)
    task_cfg = compose_config("train", [f"graph_dir={graph}", "task=link"]).task

    class Data:
        edges = split

    task = build_task("link", None, Data, torch.device("cpu"), task_cfg)
    held = np.concatenate([split.val, split.test], axis=1)
    mp_dst = split.edge_dst()
    rows = {d: set() for d in range(split.num_nodes)}
    for s_, d in zip(np.asarray(split.indices).tolist(), mp_dst.tolist(), strict=True):
        rows[d].add(s_)
    u, x = [], []
    for a, b in held.T.tolist():
        for nb in sorted(rows[b])[:3]:
            if nb != a:
                u.append(a), x.append(nb)
    u, x = torch.tensor(u), torch.tensor(x)
    got = task.structure.pairs(u, x)
    want = torch.tensor([_reference(rows, a, b) for a, b in zip(u.tolist(), x.tolist(), strict=True)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    indptr, indices = open_csc(GraphDir(graph))
    leaky = PairStructure(np.asarray(indptr), np.asarray(indices), split.num_nodes).pairs(u, x)
    assert (leaky[:, 0] > got[:, 0]).sum() >= len(u) // 2  # the full graph would have leaked: the check bites


def _train(graph, tmp_path, name: str, *extra):
    return train_link(graph, tmp_path, name, "sampler.fanouts=[5,5]", *extra)


def test_link_report_ranks_the_heuristics_on_the_same_negatives(graph, tmp_path):
    """summary.json's test_heuristics equal CN / AA / RA ranked by hand on the trainer's test negatives."""
    from gnnscale.sampling.graph import csc_to_dgl
    from gnnscale.sampling.link import LinkEvalLoader
    from gnnscale.tasks.link_metrics import ranking_scores, ranks

    s = _train(graph, tmp_path, "h")
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert summary["test_heuristics"] == s["test_heuristics"]
    split = ensure_edge_split(GraphDir(graph), 0, 0.05, 0.10)
    structure = PairStructure.of_split(split)
    g = csc_to_dgl(split.indptr, split.indices, split.num_nodes)
    eval_bs = 128  # train.eval_batch_size=0: the training batch size
    loader = LinkEvalLoader(g, np.asarray(split.test), None, eval_bs, 50, 0, 2)
    got_ranks = []
    for i, lo in enumerate(range(0, split.test.shape[1], eval_bs)):
        u, v = (torch.from_numpy(np.asarray(x[lo : lo + eval_bs])) for x in split.test)
        cand = loader.negatives(i)
        grid = structure.grid(u, cand)
        grid[cand[None, :] == v[:, None]] = float("nan")
        own = structure.pairs(u, v)
        got_ranks.append(torch.stack([ranks(own[:, k], grid[:, :, k]) for k in range(len(PAIR_FEATURES))], 1))
    r = torch.cat(got_ranks)
    for k, name in enumerate(PAIR_FEATURES):
        want = ranking_scores(r[:, k])
        for m, value in want.items():
            assert s["test_heuristics"][name][m] == pytest.approx(value, abs=1e-6), (
                name,
                m,
            )  # summary: 6 decimals


def test_pair_features_reach_either_decoder(graph, tmp_path):
    from gnnscale.errors import ConfigError
    from gnnscale.models.checkpoint import load_model
    from gnnscale.tasks.link import LinkPrediction

    with pytest.raises(ConfigError, match="in-batch negatives"):
        _train(graph, tmp_path, "ib", "task.pair_features=true", "task.in_batch_negatives=true")
    dot = _train(graph, tmp_path, "dot", "task.pair_features=true")
    state = torch.load(dot["checkpoint"], weights_only=True)["model"]
    assert state["link_decoder.net.0.weight"].shape == (32, len(PAIR_FEATURES))  # the count head
    assert load_model(dot["checkpoint"]).decoder == "dot+counts"
    mlp = _train(graph, tmp_path, "mlp", "task.decoder=mlp", "task.pair_features=true")
    state = torch.load(mlp["checkpoint"], weights_only=True)["model"]
    assert state["link_decoder.net.0.weight"].shape == (16, 16 + len(PAIR_FEATURES))
    assert load_model(mlp["checkpoint"]).decoder == "mlp"
    assert 0.5 < dot["test_auc"] <= 1.0 and 0.5 < mlp["test_auc"] <= 1.0
    # The counts change the score: the same embeddings with other counts score otherwise.
    for decoder in ("dot", "mlp"):
        task = LinkPrediction(
            compose_config("train", ["task=link", f"task.decoder={decoder}", "task.pair_features=true"]).task,
            PairStructure(np.array([0, 1, 2, 2]), np.array([2, 2]), 3),
        )
        task.build_model(compose_config("train", ["model.hidden=4"]).model, 3)
        h = torch.ones(3, 4)
        shared = task.pair_scores(h, torch.tensor([[0], [1]]), torch.arange(3))  # 0 and 1 share node 2
        alone = task.pair_scores(h, torch.tensor([[0], [2]]), torch.arange(3))
        assert not torch.equal(shared, alone), decoder


def test_no_heuristics_when_turned_off(graph, tmp_path):
    s = _train(graph, tmp_path, "off", "task.heuristics=false")
    assert "test_heuristics" not in s
