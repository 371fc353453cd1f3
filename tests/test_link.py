"""task=link: labels optional, the edge split, leakage-free batches, negatives, metrics, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.config import compose_config
from gnnscale.errors import GnnscaleError
from gnnscale.sampling.link import LinkEvalLoader, LinkLoader, NegativeSampler, avoid
from gnnscale.sampling.neighbor import NeighborBlockSampler
from gnnscale.storage.edge_split import ensure_edge_split
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.tasks.link_metrics import link_scores, ranks, roc_auc
from tests.conftest import TINY_SYNTHETIC, build_graph

runner = CliRunner()
# 20 communities, 95% of edges inside one: edges are predictable from the neighbourhood, not by chance.
UNLABELLED = (
    *(o for o in TINY_SYNTHETIC if not o.startswith("data.num_classes=")),
    "data.num_classes=20",
    "data.homophily=0.95",
    "data.labels=false",
)


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """600 nodes, no labels, CSC built."""
    return build_graph(tmp_path_factory.mktemp("link"), *UNLABELLED)


def _edges(csr_indptr, indices) -> set:
    dst = np.repeat(np.arange(len(csr_indptr) - 1), np.diff(csr_indptr))
    return set(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))


def _edgelist_graph(tmp_path, lines: str):
    path = tmp_path / "edges.csv"
    path.write_text(lines)
    return build_graph(tmp_path, "data=edgelist", f"data.path={path}", "data.features=none")


# ---------------------------------------------------------------- labels optional
def test_unlabelled_edgelist_shards_with_structural_features(tmp_path):
    g = GraphDir(_edgelist_graph(tmp_path, "0,1\n1,2\n2,3\n0,2\n"))
    assert g.meta["num_classes"] == 0 and g.meta["feat_dim"] == 2
    feat = g.shard(0)["feat"]
    assert torch.equal(feat[:, 0], torch.ones(4))
    assert torch.allclose(feat[:, 1], torch.log1p(torch.tensor([2.0, 2.0, 3.0, 1.0])))
    assert (g.labels() == -1).all()


def test_node_task_on_unlabelled_graph_exits_2_naming_link(graph, tmp_path):
    result = runner.invoke(
        app, ["train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", "train.epochs=1"]
    )
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line and "needs labels" in line and "task=link" in line


# ---------------------------------------------------------------- the split
def test_split_is_deterministic_disjoint_and_leaves_held_out_edges_out_of_message_passing(graph, tmp_path):
    g = GraphDir(graph)
    a = ensure_edge_split(g, 3, 0.1, 0.2)
    val, test = a.val.copy(), a.test.copy()
    train_eids, mp_indices = a.train_eids.copy(), a.indices.copy()
    import shutil

    shutil.rmtree(a.path)  # made again from scratch: the same arrays
    b = ensure_edge_split(GraphDir(graph), 3, 0.1, 0.2)
    assert np.array_equal(val, b.val) and np.array_equal(test, b.test)
    assert np.array_equal(train_eids, b.train_eids) and np.array_equal(mp_indices, b.indices)
    other = ensure_edge_split(GraphDir(graph), 4, 0.1, 0.2)
    assert not np.array_equal(val, other.val)
    assert GraphDir(graph).meta["edge_splits"][b.name]["counts"]["val"] == b.val.shape[1]

    mp = _edges(b.indptr, b.indices)
    train = {
        (int(b.indices[e]), int(d)) for e, d in zip(b.train_eids, b.edge_dst()[b.train_eids], strict=True)
    }
    und = lambda pairs: {(min(u, v), max(u, v)) for u, v in pairs}  # noqa: E731
    v_set, t_set = und(zip(*b.val.tolist(), strict=True)), und(zip(*b.test.tolist(), strict=True))
    assert len(v_set) == b.val.shape[1] and len(t_set) == b.test.shape[1]
    assert not (v_set & t_set) and not (und(train) & (v_set | t_set))
    total = len(und(_edges(*_full_csc(g))))
    assert len(und(train)) + len(v_set) + len(t_set) == total
    assert abs(len(t_set) - 0.2 * total) <= 1 and abs(len(v_set) - 0.1 * total) <= 1
    for u, v in v_set | t_set:  # neither direction is in the message-passing graph
        assert (u, v) not in mp and (v, u) not in mp
    assert und(mp) == und(train)


def _full_csc(g: GraphDir):
    from gnnscale.storage.csc import open_csc

    return open_csc(g)


def test_no_held_out_edge_is_reachable_by_message_passing(graph):
    split = ensure_edge_split(GraphDir(graph), 0, 0.1, 0.1)
    from gnnscale.sampling.graph import csc_to_dgl

    g = csc_to_dgl(split.indptr, split.indices, split.num_nodes)
    loader = LinkEvalLoader(g, np.asarray(split.test), NeighborBlockSampler([-1, -1]), 64, 50, 0, 2)
    held = {(int(u), int(v)) for u, v in zip(*split.test.tolist(), strict=True)} | {
        (int(u), int(v)) for u, v in zip(*split.val.tolist(), strict=True)
    }
    held |= {(v, u) for u, v in held}
    for batch in loader:
        for block in batch.blocks:
            s, d = block.edges()
            src_ids, dst_ids = block.srcdata["_ID"], block.dstdata["_ID"]
            for u, v in zip(src_ids[s].tolist(), dst_ids[d].tolist(), strict=True):
                assert (u, v) not in held


def test_a_batch_never_sees_its_own_target_edge(tmp_path):
    # Two triangles joined by the one edge 2-3: through message passing 2 reaches 3 only over that edge.
    graph = _edgelist_graph(tmp_path, "0,1\n1,2\n0,2\n3,4\n4,5\n3,5\n2,3\n")
    split = ensure_edge_split(GraphDir(graph), 0, 0.0, 0.0)
    from gnnscale.sampling.graph import csc_to_dgl

    g = csc_to_dgl(split.indptr, split.indices, split.num_nodes)
    dst = split.edge_dst()
    target = [e for e in split.train_eids if {int(split.indices[e]), int(dst[e])} == {2, 3}]
    assert len(target) == 1
    loader = LinkLoader(g, split, NeighborBlockSampler([-1, -1]), 1, NegativeSampler("uniform", 6), k=1)
    torch.manual_seed(0)
    batch = loader.batch(torch.tensor(target))
    u, v = batch.seeds[batch.pos_pairs[:, 0]].tolist()
    assert {u, v} == {2, 3}
    for block in batch.blocks:
        s, d = block.edges()
        pairs = set(zip(block.srcdata["_ID"][s].tolist(), block.dstdata["_ID"][d].tolist(), strict=True))
        assert (2, 3) not in pairs and (3, 2) not in pairs
        assert (1, 2) in pairs or (0, 2) in pairs  # the rest of the neighbourhood is still there
    # Without the exclusion the same sampler would have used the edge: the test can fail.
    _, _, blocks = NeighborBlockSampler([-1, -1]).sample_blocks(g, batch.seeds)
    s, d = blocks[-1].edges()
    assert (2, 3) in set(
        zip(blocks[-1].srcdata["_ID"][s].tolist(), blocks[-1].dstdata["_ID"][d].tolist(), strict=True)
    )


# ---------------------------------------------------------------- negatives
@pytest.mark.parametrize("kind", ["uniform", "degree"])
def test_negative_samplers_never_return_the_positive(kind):
    torch.manual_seed(0)
    degree = np.array([1, 50, 2])  # degree sampling piles onto node 1, the positive below
    sampler = NegativeSampler(kind, 3, degree)
    dst = torch.tensor([1, 1, 0, 2] * 500)
    neg = sampler.sample(dst, 5)
    assert len(neg) == len(dst) * 5
    assert not bool((neg == dst.repeat_interleave(5)).any())
    two = avoid(
        torch.zeros(100, dtype=torch.int64),
        torch.zeros(100, dtype=torch.int64),
        2,
        lambda c: torch.zeros(c, dtype=torch.int64),
    )
    assert bool((two == 1).all())  # a draw that can only hit the positive is moved off it


def _random_undirected(n: int, density: float, seed: int):
    import scipy.sparse as sp

    a = sp.random(n, n, density=density, random_state=seed, format="csr")
    a = ((a + a.T) > 0).astype(np.float32)
    a.setdiag(0)
    a.eliminate_zeros()
    a.sort_indices()  # as build-csr writes each row
    return a


def test_two_hop_negatives_are_friends_of_friends_and_never_partners():
    from gnnscale.sampling.two_hop import TwoHopNegatives

    a = _random_undirected(300, 0.02, 1)
    dense = a.toarray() > 0
    two = (a @ a).toarray() > 0
    hops = TwoHopNegatives(a.indptr, a.indices.astype(np.int32))
    torch.manual_seed(0)
    u = torch.randint(0, 300, (5000,))
    x = hops.draw(u)
    found = x >= 0
    uu, xx = u[found].numpy(), x[found].numpy()
    assert found.float().mean() > 0.5  # most nodes have a friend of a friend who is not a friend
    assert two[uu, xx].all() and not dense[uu, xx].any() and not (uu == xx).any()
    v = torch.randint(0, 300, (5000,))
    assert (hops.linked(u, v).numpy() == dense[u.numpy(), v.numpy()]).all()
    # a star: from a leaf every other leaf is two hops away; from the centre, no one is
    star = np.array([0, 3, 4, 5, 6]), np.array([1, 2, 3, 0, 0, 0])
    hops = TwoHopNegatives(*star)
    leaves = hops.draw(torch.tensor([1, 2, 3] * 50))  # -1: the walk came back to its own leaf
    assert set(leaves.tolist()) == {-1, 1, 2, 3} and not bool((leaves == torch.tensor([1, 2, 3] * 50)).any())
    assert set(hops.draw(torch.zeros(20, dtype=torch.int64)).tolist()) == {-1}


def test_hard_negatives_share_and_no_change_when_off():
    from gnnscale.sampling.two_hop import TwoHopNegatives

    a = _random_undirected(300, 0.01, 2)
    two = ((a @ a).toarray() > 0) & ~(a.toarray() > 0)
    hops = TwoHopNegatives(a.indptr, a.indices)
    src, dst = torch.randint(0, 300, (4000,)), torch.randint(0, 300, (4000,))
    torch.manual_seed(3)
    plain = NegativeSampler("uniform", 300).sample(dst, 2, src)
    torch.manual_seed(3)
    off = NegativeSampler("uniform", 300, hard=0.0, two_hop=hops).sample(dst, 2, src)
    assert torch.equal(plain, off)  # hard=0: the same draws as before the option
    torch.manual_seed(3)
    neg = NegativeSampler("uniform", 300, hard=1.0, two_hop=hops).sample(dst, 2, src)
    far = two[src.repeat_interleave(2).numpy(), neg.numpy()]
    assert far.mean() > 0.8 and two[src.numpy()].mean() < 0.2  # uniform draws would rarely be two hops away
    assert not bool((neg == dst.repeat_interleave(2)).any())


# ---------------------------------------------------------------- metrics
def test_roc_auc_equals_the_pairwise_definition():
    assert roc_auc(np.array([0.9, 0.4, 0.4]), np.array([0.4, 0.1])) == pytest.approx(5 / 6)
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 40).astype(float), rng.integers(0, 5, 70).astype(float)
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert roc_auc(pos, neg) == pytest.approx(pairwise)
    try:
        from sklearn.metrics import roc_auc_score
    except ImportError:
        return
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    assert roc_auc(pos, neg) == pytest.approx(roc_auc_score(y, np.r_[pos, neg]))


def test_mrr_and_hits_by_hand():
    pos = torch.tensor([3.0, 1.0, 5.0])
    neg = torch.tensor([[4.0, 2.0, 1.0], [2.0, 0.0, float("nan")], [1.0, 5.0, 0.0]])
    assert ranks(pos, neg).tolist() == [2.0, 2.0, 1.5]  # a tie counts half
    out = link_scores(pos, neg)
    assert out["mrr"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 1.5) / 3)
    assert out["hits@10"] == 1.0
    assert out["auc"] == pytest.approx(roc_auc(pos.numpy(), np.array([4, 2, 1, 2, 0, 1, 5, 0.0])))


def test_all_nodes_ranking_is_filtered_by_hand():
    """6 nodes, 1-d embeddings: score(0, x) = h[x]. Train edges 0-1, 0-2, 3-4; val (0, 3); test (0, 5)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from gnnscale.config.schema import LinkTaskConfig
    from gnnscale.sampling.batch import Batch
    from gnnscale.sampling.link import KnownEdges
    from gnnscale.tasks.link import LinkPrediction

    split = SimpleNamespace(
        num_nodes=6,
        directed=False,
        indices=np.array([1, 0, 2, 0, 4, 3]),  # the message-passing CSC holds both directions
        edge_dst=lambda: np.array([0, 1, 0, 2, 3, 4]),
        val=np.array([[0], [3]]),
        test=np.array([[0], [5]]),
    )
    h = torch.tensor([[1.0], [5.0], [4.0], [3.0], [2.0], [3.5]])
    task = LinkPrediction(OmegaConf.structured(LinkTaskConfig))

    def rank(target: int, known) -> float:
        b = Batch(
            torch.arange(6),
            torch.arange(6),
            pos_pairs=torch.tensor([[0], [target]]),
            neg_dst=torch.arange(6),
            neg_known=None if known is None else known.of(torch.tensor([0])),
        )
        return 1 / task.score([task.collect(h, b)])["mrr"]

    # val (0, 3), score 3: raw, 1, 2 and 5 score higher (rank 4); filtered, 1 and 2 are train edges of 0 and
    # no negatives, 5 still is (the test edge (0, 5) is unknown while validating): rank 2. 0 itself (1.0)
    # is below either way.
    assert rank(3, None) == 4.0
    assert rank(3, KnownEdges.of_split(split, ("val",))) == 2.0
    # test (0, 5), score 3.5: raw rank 3 (1, 2 above); filtered by train + val + test edges: rank 1
    assert rank(5, None) == 3.0
    assert rank(5, KnownEdges.of_split(split, ("val", "test"))) == 1.0
    # the filter is per source: node 3's known partners are 4 (train), 0 (val, reversed) and itself
    rows, cols = KnownEdges.of_split(split, ("val",)).of(torch.tensor([3]))
    assert rows.tolist() == [0, 0, 0] and sorted(cols.tolist()) == [0, 3, 4]


# ---------------------------------------------------------------- training
def _train(graph, tmp_path, name: str, *extra):
    from gnnscale.stages import train

    cfg = compose_config(
        "train",
        [
            f"graph_dir={graph}",
            f"run_dir={tmp_path / name}",
            "task=link",
            "model.hidden=16",
            "model.norm=none",
            "train.epochs=3",
            "train.lr=0.01",
            "train.batch_size=128",
            "task.eval_negatives=50",
            *extra,
        ],
    )
    return train.run(cfg)


@pytest.mark.parametrize(
    "formation, repeat",
    [
        (["sampler=neighbor", "sampler.fanouts=[5,5]"], True),
        (["sampler=labor", "sampler.fanouts=[5,5]"], False),
        (["sampler=cluster_gcn", "sampler.num_parts=6", "sampler.clusters_per_batch=2"], False),
    ],
)
def test_link_training_learns_on_each_formation_and_repeats(graph, tmp_path, formation, repeat):
    a = _train(graph, tmp_path, "a", *formation)
    assert 0.55 < a["test_auc"] <= 1.0  # above chance (0.5) after three short epochs
    lines = [json.loads(x) for x in open(f"{a['run_dir']}/metrics.jsonl")]
    assert len(lines) == 3 and all(math.isfinite(x["loss"]) for x in lines)
    if repeat:  # the same seed: the same run
        b = _train(graph, tmp_path, "b", *formation)
        assert a["test_auc"] == b["test_auc"] and a["test_mrr"] == b["test_mrr"]


def test_all_nodes_evaluation_is_filtered_end_to_end(graph, tmp_path, monkeypatch):
    """eval_negatives=0: every node is a candidate; the same model scores higher filtered than raw (the
    sources' other true partners no longer count against their targets)."""
    from gnnscale.sampling.link import KnownEdges

    run = ("sampler=neighbor", "sampler.fanouts=[5,5]", "train.epochs=1", "task.eval_negatives=0")
    filtered = _train(graph, tmp_path, "filtered", *run)
    monkeypatch.setattr(KnownEdges, "of_split", classmethod(lambda cls, split, parts: None))
    raw = _train(graph, tmp_path, "raw", *run)
    assert filtered["eval_negatives"] == 0
    assert filtered["test_mrr"] > raw["test_mrr"] and filtered["test_hits@10"] >= raw["test_hits@10"]


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "override, words",
    [
        ("task.val_fraction=1.0", "task.val_fraction=1.0 is outside [0, 1)"),
        ("task.val_fraction=0.5 task.test_fraction=0.6", "leaves no training edges"),
        ("task.num_negatives=0", "task.num_negatives=0 must be at least 1"),
        ("sampler=saint", "task=link does not support sampler=saint"),
        ("task.hard_negatives=1.5", "task.hard_negatives=1.5 is outside [0, 1]"),
        ("sampler=cluster_gcn task.hard_negatives=0.5", "does not apply to sampler=cluster_gcn"),
    ],
)
def test_bad_link_settings_exit_2_with_one_line(graph, tmp_path, override, words):
    args = ["train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", "task=link", *override.split()]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert _one_line(result.stderr) and words in " ".join(result.stderr.split())


def _one_line(stderr: str) -> bool:
    """One error line (the console may wrap it at its width: no other output, one `error:`)."""
    return stderr.strip().startswith("error: ") and stderr.count("error:") == 1 and "Traceback" not in stderr


def test_no_training_edges_left_exits_2(tmp_path):
    graph = _edgelist_graph(tmp_path, "0,1\n")
    with pytest.raises(GnnscaleError, match="no edges for training"):
        ensure_edge_split(GraphDir(graph), 0, 0.0, 0.9)
    result = runner.invoke(
        app, ["train", f"graph_dir={graph}", f"run_dir={tmp_path / 'r'}", "+exp=sage_link", "task.test_fraction=0.9",
              "task.val_fraction=0.0"]
    )  # fmt: skip
    assert result.exit_code == 2 and _one_line(result.stderr)
    assert "no edges for training" in " ".join(result.stderr.split())


def test_unsupervised_sage_trains_on_random_walk_pairs(graph, tmp_path):
    from gnnscale.sampling.graph import csc_to_dgl
    from gnnscale.sampling.link import WalkLinkLoader

    split = ensure_edge_split(GraphDir(graph), 0, 0.05, 0.1)
    g = csc_to_dgl(split.indptr, split.indices, split.num_nodes)
    loader = WalkLinkLoader(
        g,
        split,
        NeighborBlockSampler([5, 5]),
        128,
        NegativeSampler("degree", 600, np.diff(split.indptr)),
        k=2,
        walk_length=3,
    )
    torch.manual_seed(0)
    b = next(iter(loader))
    u, v = b.seeds[b.pos_pairs[0]], b.seeds[b.pos_pairs[1]]
    assert len(u) > 100 and not bool((u == v).any())
    assert b.neg_pairs.shape[1] == 2 * len(u)
    s = _train(graph, tmp_path, "u", "+exp=sage_unsup", "sampler.fanouts=[5,5]")
    assert 0.5 < s["test_auc"] <= 1.0 and s["epochs_run"] == 3


class _Killed(Exception):
    pass


def _kill_after_1(epoch: int) -> None:
    if epoch == 1:
        raise _Killed


def test_killed_then_resumed_link_run_equals_uninterrupted(graph, tmp_path):
    from gnnscale.stages import train

    extra = ["sampler=neighbor", "sampler.fanouts=[5,5]", "task.decoder=mlp", "task.num_negatives=2"]
    full = _train(graph, tmp_path, "full", *extra)
    with pytest.raises(_Killed):
        cfg = compose_config("train", [f"graph_dir={graph}", f"run_dir={tmp_path / 'cut'}", "task=link",
                                       "model.hidden=16", "model.norm=none", "train.epochs=3", "train.lr=0.01",
                                       "train.batch_size=128", "task.eval_negatives=50", *extra])  # fmt: skip
        train.run(cfg, on_epoch_end=_kill_after_1)
    resumed = train.run(compose_config("train", [*(f"{k}={v}" for k, v in [("resume", tmp_path / "cut")]),
                                                 f"graph_dir={graph}", "task=link", "model.hidden=16",
                                                 "model.norm=none", "train.epochs=3", "train.lr=0.01",
                                                 "train.batch_size=128", "task.eval_negatives=50", *extra]))  # fmt: skip
    assert resumed["resumed_from_epoch"] == 1
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    assert any(k.startswith("link_decoder.") for k in a["model"])  # the mlp decoder is saved with the GNN
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for key in ("test_auc", "test_mrr", "test_hits@50", "best_epoch"):
        assert resumed[key] == pytest.approx(full[key], rel=1e-6), key


def test_same_seed_in_a_new_process_repeats(graph, tmp_path):
    import subprocess
    import sys

    args = [f"graph_dir={graph}", "task=link", "model.hidden=16", "model.norm=none", "train.epochs=2",
            "train.batch_size=256", "task.eval_negatives=50", "sampler.fanouts=[5,5]"]  # fmt: skip
    from gnnscale.stages import train

    here = train.run(compose_config("train", [*args, f"run_dir={tmp_path / 'a'}"]))
    subprocess.run(
        [sys.executable, "-m", "gnnscale", "train", *args, f"run_dir={tmp_path / 'b'}"],
        check=True,
        capture_output=True,
    )
    there = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert here["test_auc"] == there["test_auc"] and here["test_mrr"] == there["test_mrr"]


def test_a_link_checkpoint_infers_embeddings_and_recommends(graph, tmp_path):
    """train task=link -> infer --layerwise -> recommend: the embedding head is not a class count."""
    from gnnscale.stages import infer, recommend

    a = _train(graph, tmp_path, "a", "sampler=neighbor", "sampler.fanouts=[5,5]", "train.epochs=1")
    out = infer.run(
        compose_config("infer", [f"ckpt={a['run_dir']}", f"graph_dir={graph}", f"run_dir={tmp_path / 'i'}"])
    )
    emb = np.load(tmp_path / "i" / "embeddings.npy")
    num_nodes = GraphDir(graph).num_nodes
    assert emb.shape[0] == num_nodes and np.isfinite(emb).all(), out
    recommend.run(
        compose_config(
            "recommend", [f"infer_dir={tmp_path / 'i'}", f"run_dir={tmp_path / 'r'}", "recommend.k=5"]
        )
    )
    recs = np.load(tmp_path / "r" / "recommendations.npy")
    assert recs.shape == (num_nodes, 5) and (recs != np.arange(num_nodes)[:, None]).all()
