"""Subgraph formations (sampler=cluster_gcn, saint, full): each batch is exactly the induced subgraph of its
nodes, its seeds are the training nodes inside, epochs have the length they say, seeded sampling repeats
in another process, GraphSAINT's normalisation matches its closed form, and each trains, infers and
resumes through the real stages."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import dgl
import dgl.nn as dglnn
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.models import EDGE_WEIGHT
from gnnscale.sampling import SamplingContext, build_loader, build_sampler
from gnnscale.sampling.cluster_gcn import ClusterGcnSampler
from gnnscale.sampling.graph import csc_to_dgl, to_dgl_graph
from gnnscale.sampling.saint import CACHE_FILE, SaintSampler
from gnnscale.stages import train
from gnnscale.storage.graph_dir import GraphDir
from tests.conftest import TINY_SYNTHETIC, build_graph, compose

GRAPH = (*(o for o in TINY_SYNTHETIC if not o.startswith("data.num_nodes=")), "data.num_nodes=1000")
runner = CliRunner()


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("subgraph"), *GRAPH)


@pytest.fixture(scope="module")
def gd(graph_dir):
    return GraphDir(graph_dir)


@pytest.fixture(scope="module")
def g(gd):
    return to_dgl_graph(gd)


@pytest.fixture(scope="module")
def train_ids(gd):
    return gd.split_ids("train")


@pytest.fixture(scope="module")
def ctx(gd, g, train_ids):
    return SamplingContext(gd, g, train_ids, gd.labels(), None, seed=0)


def edge_set(graph, node_ids: torch.Tensor) -> set[tuple[int, int]]:
    """Every edge of a DGL graph (read from its CSC) as (global src, global dst)."""
    indptr, indices, _ = graph.adj_tensors("csc")
    dst = torch.repeat_interleave(torch.arange(len(indptr) - 1), torch.diff(indptr))
    return set(zip(node_ids[indices].tolist(), node_ids[dst].tolist(), strict=True))


def induced_reference(g, nodes: torch.Tensor) -> set[tuple[int, int]]:
    """DGL's own induced subgraph of `nodes`, in global ids."""
    sub = g.formats(["csc", "csr", "coo"]).subgraph(nodes.to(g.idtype))  # DGL wants its idtype
    src, dst = sub.edges()
    ids = sub.ndata[dgl.NID]
    return set(zip(ids[src].tolist(), ids[dst].tolist(), strict=True))


def check_batch(g, b, train_ids: torch.Tensor, ascending: bool = True) -> None:
    """A subgraph batch: nodes distinct (ascending: a front-to-back gather) and in range, the induced edges
    exactly, seeds = the training nodes among them, output_rows pointing at them."""
    nodes = b.input_nodes
    assert nodes.dtype == torch.int64 and len(nodes) > 0
    assert int(nodes.min()) >= 0 and int(nodes.max()) < g.num_nodes()
    assert len(torch.unique(nodes)) == len(nodes)
    if ascending:
        assert bool((nodes[1:] > nodes[:-1]).all())
    sub = b.subgraph
    assert sub.num_nodes() == len(nodes) and not sub.is_block
    got = edge_set(sub, nodes)
    assert len(got) == sub.num_edges()  # no edge twice
    assert got == induced_reference(g, nodes)
    want_seeds = np.intersect1d(nodes.numpy(), train_ids.numpy())
    assert np.array_equal(np.sort(b.seeds.numpy()), want_seeds) and len(want_seeds) > 0
    assert torch.equal(nodes[b.output_rows], b.seeds)


# ---------------------------------------------------------------- cluster_gcn
def partition(gd, num_parts: int) -> np.ndarray:
    from gnnscale.partition import ensure_partition

    return np.asarray(ensure_partition(gd, "metis", num_parts, 0))


def test_cluster_gcn_batches_are_induced_and_cover_every_cluster_once(g, gd, ctx, train_ids):
    cfg = compose("train", "sampler=cluster_gcn", "sampler.num_parts=10", "sampler.clusters_per_batch=3")
    sampler = build_sampler(cfg.sampler, 2)
    assert sampler.needs_partition(g.num_nodes()) == ("metis", 10)
    assignment = partition(gd, 10)
    sampler.prepare(ctx)
    assert np.array_equal(sampler.assignment, assignment)
    loader = build_loader(g, train_ids, sampler, 1024, shuffle=True)
    assert len(loader) == math.ceil(10 / 3) == 4
    orders = []
    for epoch in range(2):
        np.random.seed(epoch)
        batches = list(loader)
        assert len(batches) == len(loader)
        seen = np.concatenate([b.input_nodes.numpy() for b in batches])
        assert np.array_equal(np.sort(seen), np.arange(g.num_nodes()))  # every node once: every cluster once
        clusters = [np.unique(assignment[b.input_nodes.numpy()]) for b in batches]
        assert sorted(len(c) for c in clusters) == [1, 3, 3, 3]
        for b, c in zip(batches, clusters, strict=True):
            nodes = b.input_nodes.numpy()
            whole = np.flatnonzero(np.isin(assignment, c))  # the batch is its clusters' nodes, all of them
            assert np.array_equal(whole, np.sort(nodes))
            part = assignment[nodes]  # cluster after cluster, ascending ids within each
            assert (np.diff(part) != 0).sum() == len(c) - 1
            assert all((np.diff(nodes[part == k]) > 0).all() for k in c)
            check_batch(g, b, train_ids, ascending=False)
        orders.append([c.tolist() for c in clusters])
    assert orders[0] != orders[1]  # reshuffled per epoch


def test_cluster_gcn_batches_each_hold_a_training_node(g, train_ids):
    """Few labelled clusters: one batch per such cluster, the others spread over them, none left out."""
    n = g.num_nodes()
    assignment = np.arange(n) % 12
    labelled = np.isin(assignment[train_ids.numpy()], [2, 7])
    seeds = train_ids[torch.from_numpy(labelled)]
    sampler = ClusterGcnSampler(12, "random", 2)
    sampler.use_assignment(assignment, 12)
    loader = sampler.loader(g, seeds, shuffle=True)
    assert len(loader) == 2
    np.random.seed(3)
    batches = list(loader)
    assert len(batches) == 2
    assert sorted(len(np.unique(assignment[b.input_nodes.numpy()])) for b in batches) == [6, 6]
    assert np.array_equal(np.sort(np.concatenate([b.input_nodes.numpy() for b in batches])), np.arange(n))
    for b in batches:
        check_batch(g, b, seeds, ascending=False)


def test_cluster_gcn_without_partition_says_how_to_make_it(tmp_path, g, train_ids):
    from gnnscale.errors import DataError

    gd = GraphDir(build_graph(tmp_path, *GRAPH))
    sampler = ClusterGcnSampler(7, "metis", 2)
    with pytest.raises(DataError, match="no current metis partition into 7 parts") as err:
        sampler.prepare(SamplingContext(gd, g, train_ids, gd.labels()))
    assert "gnnscale partition" in err.value.hint


# ---------------------------------------------------------------- saint
@pytest.mark.parametrize(
    "mode, budget",
    [("node", 150), ("edge", 120), ("walk", 60)],
)
def test_saint_batches_are_induced_with_normalisation(g, ctx, train_ids, mode, budget):
    sampler = SaintSampler(mode, budget, walk_length=2, num_presample=20)
    sampler.prepare(ctx)
    loader = build_loader(g, train_ids, sampler, 1024, shuffle=True)
    expected = math.ceil(len(train_ids) / sampler.expected_seeds)
    assert len(loader) == expected and 1 < expected < len(train_ids)
    np.random.seed(0)
    batches = list(loader)
    assert len(batches) == len(loader)
    deg = g.in_degrees()
    counts = torch.from_numpy(sampler.node_counts.astype(np.float64)).clamp(min=1)
    edge_counts = torch.from_numpy(sampler.edge_counts.astype(np.float64)).clamp(min=1)
    for b in batches:
        check_batch(g, b, train_ids)
        # loss weights: p̄ / p_v, p_v = C_v / P
        p = counts / sampler.presampled
        want = p[train_ids].mean() / p[b.seeds]
        torch.testing.assert_close(b.loss_weight.double(), want, rtol=1e-5, atol=0)
        # edge weights: d_sub(v) / (deg_full(v) α_uv), α_uv = C_uv / C_v, looked up by (src, dst)
        sub = b.subgraph
        s, d = sub.edges(order="eid")
        gs, gdst = b.input_nodes[s], b.input_nodes[d]
        full = g.formats(["csc", "csr", "coo"])
        eid = full.edge_ids(gs.to(g.idtype), gdst.to(g.idtype)).long()  # the CSC position of each edge
        alpha = edge_counts[eid] / counts[gdst]
        want_w = sub.in_degrees()[d].double() / (deg[gdst].double() * alpha)
        torch.testing.assert_close(sub.edata[EDGE_WEIGHT].double(), want_w, rtol=1e-5, atol=0)


def test_saint_edge_weights_make_sage_mean_the_full_neighbour_mean_estimate(g, ctx, train_ids):
    """With every node in the subgraph (α = 1), the weighted mean over the subgraph is the full mean."""
    sampler = SaintSampler("walk", 100_000, walk_length=0, num_presample=3)  # 100 uniform roots per node
    sampler.prepare(ctx)
    assert (sampler.node_counts == 3).all()
    np.random.seed(0)
    b = next(iter(sampler.loader(g, train_ids)))
    assert torch.equal(b.input_nodes, torch.arange(g.num_nodes()))
    torch.testing.assert_close(b.loss_weight, torch.ones(len(b.seeds)))
    x = torch.randn(g.num_nodes(), 5)
    conv = dglnn.SAGEConv(5, 4, "mean")
    full = conv(g.formats(["csc", "csr", "coo"]), x)
    torch.testing.assert_close(conv(b.subgraph, x, edge_weight=b.subgraph.edata[EDGE_WEIGHT]), full)


def circulant(n: int, offsets=(1, 2)):
    """Each node linked both ways to the nodes `offsets` away: every in- and out-degree is 2 * len(offsets)."""
    nodes = np.arange(n)
    src = np.concatenate([(nodes + o) % n for o in offsets] + [(nodes - o) % n for o in offsets])
    dst = np.tile(nodes, 2 * len(offsets))
    order = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return csc_to_dgl(indptr, src[order].astype(np.int64), n)


@pytest.mark.parametrize("node_prob", ["colnorm", "degree", "uniform"])
def test_saint_node_normalisation_matches_its_closed_form(node_prob):
    """On a regular graph every node_prob draws uniformly: B draws with replacement from N nodes give
    p_v = 1 - (1 - 1/N)^B and α_uv = P(u, v both drawn) / p_v = (1 - 2 q1 + q2) / (1 - q1), with
    q1 = (1 - 1/N)^B and q2 = (1 - 2/N)^B; the loss weights are 1."""
    n, budget, presample = 40, 8, 4000
    g = circulant(n)
    ids = torch.arange(n)
    sampler = SaintSampler("node", budget, num_presample=presample, node_prob=node_prob)
    sampler.prepare(SamplingContext(None, g, ids, None, None, seed=5))
    q1, q2 = (1 - 1 / n) ** budget, (1 - 2 / n) ** budget
    p = sampler.node_counts / presample
    sd = math.sqrt((1 - q1) * q1 / presample)
    assert abs(p.mean() - (1 - q1)) < sd and np.abs(p - (1 - q1)).max() < 5 * sd
    alpha = sampler.edge_counts / np.repeat(sampler.node_counts, 4)
    assert abs(alpha.mean() - (1 - 2 * q1 + q2) / (1 - q1)) < 0.01
    assert np.abs(sampler.loss_weight - 1).max() < 6 * sd / (1 - q1)
    assert sampler.expected_seeds == pytest.approx(n * (1 - q1), rel=0.02)


def test_saint_presamples_until_every_node_was_drawn_50_times_on_average():
    n, budget = 40, 8
    sampler = SaintSampler("node", budget, num_presample=0)  # 0: GraphSAINT's coverage rule
    sampler.prepare(SamplingContext(None, circulant(n), torch.arange(n), None, None, seed=0))
    held = int(sampler.node_counts.sum())  # nodes held by all the pre-sampled subgraphs together
    assert 50 * n <= held < 50 * n + budget  # it stops with the first subgraph that reaches 50 N
    assert sampler.presampled == pytest.approx(50 / (1 - (1 - 1 / n) ** budget), rel=0.05)


def test_saint_normalisation_is_cached_and_reused(tmp_path, g, gd, train_ids):
    ctx = SamplingContext(gd, g, train_ids, gd.labels(), tmp_path / "sampler", seed=1)
    first = SaintSampler("walk", 50, walk_length=2, num_presample=5)
    first.prepare(ctx)
    assert (tmp_path / "sampler" / CACHE_FILE).is_file()
    again = SaintSampler("walk", 50, walk_length=2, num_presample=5)
    again.presample = None  # a reused cache never pre-samples
    again.prepare(ctx)
    assert np.array_equal(first.node_counts, again.node_counts)
    assert np.array_equal(first.edge_counts, again.edge_counts)
    other = SaintSampler("walk", 50, walk_length=3, num_presample=5)  # another key: pre-samples anew
    other.prepare(ctx)
    assert not np.array_equal(first.node_counts, other.node_counts)


def test_saint_without_normalisation_has_no_weights(g, ctx, train_ids):
    sampler = SaintSampler("node", 150, normalize=False, batches_per_epoch=3)
    sampler.prepare(ctx)
    loader = sampler.loader(g, train_ids)
    assert len(loader) == 3
    np.random.seed(0)
    batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        check_batch(g, b, train_ids)
        assert b.loss_weight is None and EDGE_WEIGHT not in b.subgraph.edata


# ---------------------------------------------------------------- full
def test_full_is_the_whole_graph_and_runs_gcn(g, train_ids):
    loader = build_loader(g, train_ids, build_sampler(compose("train", "sampler=full").sampler, 2), 64, True)
    assert len(loader) == 1
    (b,) = list(loader)
    assert torch.equal(b.input_nodes, torch.arange(g.num_nodes()))
    assert torch.equal(b.seeds, train_ids) and torch.equal(b.output_rows, train_ids)
    assert edge_set(b.subgraph, b.input_nodes) == edge_set(g, torch.arange(g.num_nodes()))
    (again,) = list(loader)
    assert again.subgraph is b.subgraph  # made once: DGL's transposed formats are kept
    x = torch.randn(g.num_nodes(), 8, requires_grad=True)
    conv = dglnn.GraphConv(8, 4, norm="both", allow_zero_in_degree=True)
    conv(b.subgraph, x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("kind", ["cluster_gcn", "saint", "full"])
@pytest.mark.parametrize("arch", ["sage", "gcn"])
def test_every_formation_feeds_the_models(g, gd, ctx, train_ids, kind, arch):
    from gnnscale.models import build_model

    cfg = compose("train", f"sampler={kind}", f"model={arch}", "model.hidden=8")
    sampler = build_sampler(cfg.sampler, 2)
    if kind == "cluster_gcn":
        partition(gd, *sampler.needs_partition(g.num_nodes())[1:])
    if hasattr(sampler, "prepare"):
        sampler.prepare(ctx)
    model = build_model(cfg.model, 8, 3)
    np.random.seed(0)
    b = next(iter(build_loader(g, train_ids, sampler, 64, True)))
    x = torch.randn(len(b.input_nodes), 8)
    out = b.outputs(model(b.layers(2), x))
    assert out.shape == (len(b.seeds), 3) and torch.isfinite(out).all()
    out.sum().backward()


# ---------------------------------------------------------------- determinism
SAMPLE_TWICE = textwrap.dedent(
    """
    import hashlib, sys, numpy as np, torch
    from gnnscale.partition import ensure_partition
    from gnnscale.sampling import SamplingContext, build_loader, build_sampler
    from gnnscale.sampling.graph import to_dgl_graph
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.config import compose_config
    gd = GraphDir(sys.argv[1])
    g = to_dgl_graph(gd)
    ids = gd.split_ids("train")
    h = hashlib.sha256()
    for kind in ("cluster_gcn", "saint"):
        cfg = compose_config("train", [f"sampler={kind}", "sampler.num_parts=10", "sampler.clusters_per_batch=3"]
                             if kind == "cluster_gcn" else ["sampler=saint", "sampler.budget=150"])
        sampler = build_sampler(cfg.sampler, 2)
        if kind == "cluster_gcn":
            ensure_partition(gd, "metis", 10, 0)
        sampler.prepare(SamplingContext(gd, g, ids, gd.labels(), None, seed=int(sys.argv[3])))
        np.random.seed(int(sys.argv[2]))
        for b in build_loader(g, ids, sampler, 64, True):
            for t in (b.input_nodes, b.seeds, *b.subgraph.adj_tensors("csc")[:2]):
                h.update(t.numpy().tobytes())
            if b.loss_weight is not None:
                h.update(b.loss_weight.numpy().tobytes())
                h.update(b.subgraph.edata["edge_weight"].numpy().tobytes())
    print(h.hexdigest())
    """
)


def test_seeded_sampling_repeats_in_another_process(graph_dir, gd):
    """What resuming relies on: the epoch's seed and the run's seed (pre-sampling) fix every batch."""
    from gnnscale.partition import ensure_partition

    ensure_partition(gd, "metis", 10, 0)  # made once, before the processes race to make it

    def digest(epoch_seed: int, run_seed: int) -> str:
        out = subprocess.run(
            [sys.executable, "-c", SAMPLE_TWICE, str(graph_dir), str(epoch_seed), str(run_seed)],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip().splitlines()[-1]

    first = digest(7, 0)
    assert first == digest(7, 0)
    assert first != digest(8, 0)  # another epoch draws other batches
    assert first != digest(7, 1)  # another run seed pre-samples other normalisation counts


# ---------------------------------------------------------------- through the stages
PRESETS = {
    "cluster_gcn": ("sampler=cluster_gcn", "sampler.num_parts=8", "sampler.clusters_per_batch=2"),
    "saint": ("sampler=saint", "sampler.budget=200", "sampler.num_presample=10"),
    "full": ("sampler=full", "model=gcn"),
}
COMMON = ("model.hidden=16", "train.lr=0.01", "train.patience=0", "train.warmup_epochs=0")


@pytest.mark.parametrize(
    "exp, kind",
    [("cluster_gcn", "cluster_gcn"), ("saint", "saint"), ("full_gcn", "full"), ("full_sage", "full")],
)
def test_presets_train_then_infer_through_the_cli(tmp_path, graph_dir, exp, kind):
    """Each formation's +exp= preset as it is (smaller hidden layers), two epochs, then layer-wise inference."""
    run = tmp_path / "train"
    args = ["train", f"+exp={exp}", f"graph_dir={graph_dir}", f"run_dir={run}", "train.epochs=2"]
    result = runner.invoke(app, [*args, "model.hidden=16"])
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs_run"] == 2 and 0 <= summary["test_acc"] <= 1
    assert OmegaConf.load(run / "config.yaml").sampler.kind == kind
    result = runner.invoke(app, ["infer", f"ckpt={run}", f"run_dir={tmp_path / 'infer'}"])
    assert result.exit_code == 0, result.output
    emb = np.load(tmp_path / "infer" / "embeddings.npy")
    assert emb.shape[0] == 1000 and np.isfinite(emb).all()
    if kind == "saint":
        assert (run / "sampler" / CACHE_FILE).is_file()


@pytest.mark.parametrize(
    "override, needle",
    [
        ("sampler.clusters_per_batch=0", "sampler.clusters_per_batch=0 must be at least 1"),
        ("sampler.method=louvain", "sampler.method='louvain' is not known"),
        ("sampler.nodes_per_part=-5", "sampler.nodes_per_part=-5 is negative"),
    ],
)
def test_bad_cluster_gcn_options_are_config_errors(override, needle):
    from gnnscale.errors import ConfigError

    with pytest.raises(ConfigError, match=needle):
        build_sampler(compose("train", "sampler=cluster_gcn", override).sampler, 2)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("sampler.mode=forest", "sampler.mode='forest' is not known"),
        ("sampler.node_prob=pagerank", "sampler.node_prob='pagerank' is not known"),
        ("sampler.budget=0", "sampler.budget=0 is out of range"),
        ("sampler.num_presample=-1", "sampler.num_presample=-1 is out of range"),
    ],
)
def test_bad_saint_options_are_config_errors(override, needle):
    from gnnscale.errors import ConfigError

    with pytest.raises(ConfigError, match=needle):
        build_sampler(compose("train", "sampler=saint", override).sampler, 2)


def test_cluster_count_follows_the_graph_size():
    assert ClusterGcnSampler(0, "metis", 10, nodes_per_part=100).needs_partition(1000) == ("metis", 10)
    assert ClusterGcnSampler(0, "metis", 10, nodes_per_part=300).needs_partition(1000) == ("metis", 4)
    assert ClusterGcnSampler(7, "random", 10, nodes_per_part=300).needs_partition(1000) == ("random", 7)
    assert ClusterGcnSampler(0, "metis", 10).needs_partition(5000) == ("metis", 5)  # ~1,000 nodes each


class Killed(Exception):
    pass


def kill_after_1(epoch):
    if epoch == 1:
        raise Killed


def metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.endswith("_s") and k not in ("seeds_per_s", "peak_rss_mb")}
        for r in rows
    ]


@pytest.mark.parametrize("kind", ["cluster_gcn", "saint"])
def test_killed_then_resumed_equals_uninterrupted(tmp_path, graph_dir, kind):
    common = (f"graph_dir={graph_dir}", "train.epochs=3", "train.eval_every=1", *COMMON, *PRESETS[kind])
    full = train.run(compose("train", f"run_dir={tmp_path / 'full'}", *common))
    with pytest.raises(Killed):
        train.run(compose("train", f"run_dir={tmp_path / 'cut'}", *common), on_epoch_end=kill_after_1)
    resumed = train.run(compose("train", f"resume={tmp_path / 'cut'}", *common))
    assert resumed["resumed_from_epoch"] == 1
    assert metrics(tmp_path / "full") == metrics(tmp_path / "cut")
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)["model"]
    for key, value in a.items():
        torch.testing.assert_close(b[key], value, rtol=1e-5, atol=1e-6, msg=key)
    for key in ("test_acc", "val_acc", "best_epoch"):
        assert resumed[key] == pytest.approx(full[key], rel=1e-6), key
