"""Two-stage recommend (gnnscale/recommend/rerank.py, fof.py, holdout.py): friends of friends by common
neighbours against a dense reference, recall / NDCG by hand, and a link model's re-ranked list equal to its
own decoder's ranking of the candidates, over an edge split's message-passing graph."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnscale.errors import ConfigError
from gnnscale.recommend.fof import FriendsOfFriends
from gnnscale.recommend.holdout import HeldOut, pair_csc
from gnnscale.recommend.neighbours import Neighbours
from gnnscale.stages import infer, recommend
from gnnscale.storage.edge_split import open_edge_split
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.tasks.pair_features import PairStructure
from tests.conftest import build_graph, compose
from tests.test_link import UNLABELLED
from tests.test_link import _train as train_link


def _undirected(n: int, e: int, seed: int):
    """A random undirected graph as a CSC with both directions, and its dense adjacency."""
    rng = np.random.default_rng(seed)
    a = np.zeros((n, n), dtype=bool)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    a[src, dst] = a[dst, src] = True
    np.fill_diagonal(a, False)
    rows, cols = np.nonzero(a)  # row-major: each destination's sources ascending
    indptr = np.concatenate([[0], np.cumsum(a.sum(1))]).astype(np.int64)
    return indptr, cols.astype(np.int64), a


@pytest.mark.parametrize("chunk_paths", [1, 1 << 23])
def test_friends_of_friends_are_the_most_common_neighbours_not_yet_linked(tmp_path, monkeypatch, chunk_paths):
    import gnnscale.recommend.fof as fof_module

    monkeypatch.setattr(fof_module, "PATHS_PER_CHUNK", chunk_paths)  # one query row per product, or all
    n = 60
    indptr, indices, a = _undirected(n, 150, 0)
    val = np.array([[0, 5], [7, 9]])  # two more links to leave out: (0, 7) and (5, 9)
    nbrs = Neighbours(indptr, indices, False, tmp_path / "s", extra=[pair_csc(val, n)])
    fof = FriendsOfFriends(PairStructure(indptr, indices, n), nbrs)
    nodes = np.arange(n)
    got, cn = fof.top(nodes, 5)
    common = a.astype(np.int64) @ a.astype(np.int64)
    banned = a | np.eye(n, dtype=bool)
    banned[0, 7] = banned[7, 0] = banned[5, 9] = banned[9, 5] = True
    for u in nodes:
        cand = [(-common[u, v], v) for v in range(n) if common[u, v] > 0 and not banned[u, v]]
        want = [v for _, v in sorted(cand)[:5]]
        assert got[u, : len(want)].tolist() == want, u
        assert (got[u, len(want) :] == -1).all() and np.isnan(cn[u, len(want) :]).all()
        assert cn[u, : len(want)].tolist() == [common[u, v] for v in want]
    assert (cn[:, 0] >= 2).any()  # ranked by counts, not only found


def test_recall_and_ndcg_by_hand():
    held = HeldOut(np.array([[0, 0, 3], [1, 2, 4]]), num_nodes=10)  # 0: partners 1, 2; 1: 0; 2: 0; 3: 4; 4: 3
    ranked = np.array([[2, 5, 1], [7, 8, 9], [-1, -1, -1]])
    held.add("m", np.array([0, 1, 6]), ranked)  # node 6 has no partner: not averaged
    r = held.result(3)["m"]
    # node 0: both found at ranks 1 and 3 -> recall 1, ndcg (1 + 1/2) / (1 + 1/log2 3); node 1: nothing
    assert r["queries"] == 2
    assert r["recall_at_3"] == pytest.approx(0.5, abs=1e-4)
    assert r["ndcg_at_3"] == pytest.approx((1.5 / (1 + 1 / np.log2(3))) / 2, abs=1e-4)


@pytest.fixture(scope="module", params=[(), ("task.learned_common=true",)], ids=["counts", "learned"])
def link_run(tmp_path_factory, request):
    """A link model with pair counts (and a learned common-neighbour weighting) on a 600-node graph, and its
    embeddings on the split's message-passing graph."""
    tmp = tmp_path_factory.mktemp("rerank")
    graph = build_graph(tmp, *UNLABELLED)
    s = train_link(graph, tmp, "train", "task.pair_features=true", *request.param)
    s["overrides"] = list(request.param)
    out = infer.run(
        compose(
            "infer",
            f"ckpt={s['checkpoint']}",
            f"run_dir={tmp / 'infer'}",
            f"infer.edge_split={s['edge_split']}",
        )
    )
    return graph, s, tmp / "infer", out


def test_reranked_list_is_the_decoders_ranking_of_the_candidates(link_run, tmp_path):
    from gnnscale.config import compose_config
    from gnnscale.models.checkpoint import LINK_DECODER
    from gnnscale.tasks.link import LinkPrediction

    graph_dir, s, infer_dir, _ = link_run
    info = json.loads((infer_dir / "emb_info.json").read_text())
    assert info["edge_split"] == s["edge_split"] and info["decoder"] == "dot+counts"
    n = 600
    out = recommend.run(
        compose(
            "recommend",
            f"infer_dir={infer_dir}",
            f"run_dir={tmp_path / 'rec'}",
            "recommend.k=10",
            f"recommend.candidates={n}",  # every node a candidate: the list is the decoder's top 10 of all
        )
    )
    assert out["rerank"]["decoder"] == "dot+counts"
    ids = np.load(tmp_path / "rec" / "recommendations.npy")
    scores = np.load(tmp_path / "rec" / "scores.npy")
    # The reference: the trained task's own pair score over every pair, on the split's message-passing graph.
    split = open_edge_split(GraphDir(graph_dir), s["edge_split"])
    structure = PairStructure.of_split(split)
    task_cfg = compose_config("train", ["task=link", "task.pair_features=true", *s["overrides"]]).task
    task = LinkPrediction(task_cfg, structure)
    task.build_model(compose_config("train", ["model.hidden=16"]).model, 3)
    state = torch.load(s["checkpoint"], weights_only=True)["model"]
    task.count_head.load_state_dict(
        {k[len(LINK_DECODER) :]: v for k, v in state.items() if k.startswith(LINK_DECODER)}
    )
    h = torch.from_numpy(np.load(infer_dir / "embeddings.npy"))
    banned = np.eye(n, dtype=bool)
    dst = np.repeat(np.arange(n), np.diff(split.indptr))
    banned[dst, split.indices] = banned[split.indices, dst] = True
    banned[split.val[0], split.val[1]] = banned[split.val[1], split.val[0]] = True
    for u in range(0, n, 37):
        v = torch.arange(n)
        ref = task.pair_scores(h, torch.stack([torch.full((n,), u), v]), torch.arange(n)).detach().numpy()
        ref[banned[u]] = -np.inf
        np.testing.assert_allclose(scores[u], np.sort(ref)[::-1][:10], rtol=0, atol=1e-5)
        np.testing.assert_allclose(ref[ids[u]], scores[u], rtol=0, atol=1e-5)  # the ids carry those scores
    held = out["held_out"]
    assert set(held) == {"model", "friends_of_friends_cn"}
    # recall@10 of the model's lists by hand from the written file and the split's test edges
    partners: dict[int, set] = {}
    for a, b in split.test.T.tolist():
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    recall = np.mean([len(partners[u] & set(ids[u].tolist())) / len(partners[u]) for u in sorted(partners)])
    assert held["model"]["queries"] == len(partners)
    assert held["model"]["recall_at_10"] == pytest.approx(recall, abs=1e-4)


def test_rerank_is_asked_for_where_it_cannot_run(link_run, tmp_path):
    graph_dir, s, infer_dir, _ = link_run
    off = recommend.run(
        compose("recommend", f"infer_dir={infer_dir}", f"run_dir={tmp_path / 'off'}", "recommend.rerank=off")
    )
    assert off["rerank"] is None and off["held_out"]["model"]["queries"] > 0
    ivf = recommend.run(
        compose("recommend", f"infer_dir={infer_dir}", f"run_dir={tmp_path / 'ivf'}", "recommend.index=ivf",
                "recommend.nlist=8", "recommend.candidates=50")
    )  # fmt: skip
    assert (
        ivf["rerank"]["index_candidates"] == 50 and ivf["recall"]["k"] == 50
    )  # the index checked at its own k
    plain = train_link(graph_dir, tmp_path, "plain")  # decoder=dot, no counts: nothing to re-rank by
    emb_dir = tmp_path / "plain_infer"
    infer.run(compose("infer", f"ckpt={plain['checkpoint']}", f"run_dir={emb_dir}"))
    with pytest.raises(ConfigError, match="has no pair decoder"):
        recommend.run(
            compose("recommend", f"infer_dir={emb_dir}", f"run_dir={tmp_path / 'on'}", "recommend.rerank=on")
        )
    auto = recommend.run(compose("recommend", f"infer_dir={emb_dir}", f"run_dir={tmp_path / 'auto'}"))
    assert auto["rerank"] is None and auto["held_out"] is None  # the full graph: nothing held out


def test_infer_edge_split_needs_a_link_checkpoint(tmp_path):
    from tests.conftest import TINY_SYNTHETIC

    graph = build_graph(tmp_path, *TINY_SYNTHETIC)
    from gnnscale.stages import train

    s = train.run(compose("train", f"graph_dir={graph}", f"run_dir={tmp_path / 't'}", "train.epochs=1"))
    with pytest.raises(ConfigError, match="needs a task=link checkpoint"):
        infer.run(
            compose("infer", f"ckpt={s['checkpoint']}", f"run_dir={tmp_path / 'i'}", "infer.edge_split=x")
        )
