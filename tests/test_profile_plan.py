"""The profile's plan: degree statistics and the skew rule, the design notes' ego-size arithmetic, full-graph
memory terms, the mini-batch plan, and the formation advice on Cora, a 500k-node graph, a skewed graph and
a described billion-node graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gnnscale.errors import ConfigError
from gnnscale.profile.full_graph import full_graph_memory
from gnnscale.profile.minibatch import ego_size, worst_case
from gnnscale.profile.plan import make_plan
from gnnscale.profile.recommend import recommend
from gnnscale.profile.report import summary_rows
from gnnscale.profile.stats import GraphStats, degree_counts, degree_stats, graph_stats
from gnnscale.utils.memlimit import Budget
from tests.conftest import TINY_SYNTHETIC, build_graph, compose, shared_data

BUDGET = Budget(16 * 10**9, "profile.memory_budget=16GB")


def skewed_graph(tmp_path, num_nodes: int, exponent: float):
    return build_graph(
        tmp_path,
        f"data.num_nodes={num_nodes}",
        "data.avg_degree=20",
        "data.feat_dim=4",
        "data.num_classes=4",
        f"data.power_law_exponent={exponent}",
        "shard.nodes_per_shard=100000",
    )


# ---------------------------------------------------------------- arithmetic
def test_ego_size_is_the_design_notes_arithmetic():
    # Note 001: [10,10] -> 111, [25,15] -> 401 (25 at the seeds' hop), [10,10,10] -> 1111. gnnscale lists
    # fanouts input layer first, so the seeds' own hop is the last entry.
    assert ego_size([10, 10]) == 111
    assert ego_size([15, 25]) == 1 + 25 + 25 * 15 == 401
    assert ego_size([10, 10, 10]) == 1111
    hops, shape = worst_case([25, 10], 1024, 10**9, 10**12, all_neighbours=50)
    assert hops["nodes_per_hop"] == [1024, 1024 * 11, 1024 * 261]
    assert hops["input_nodes"] == 1024 * ego_size([25, 10])
    # Block 1 (the seeds' layer): 1024 destinations x 10; block 0: 11 x 1024 destinations x 25.
    assert shape.dst_rows == (1024 * 11, 1024) and shape.edges == (1024 * 11 * 25, 10240)
    capped, _ = worst_case([25, 10], 1024, 5000, 10**6, all_neighbours=50)
    assert capped["nodes_per_hop"] == [1024, 5000, 5000]  # never more than the graph


def test_degree_statistics_match_a_direct_computation():
    rng = np.random.default_rng(0)
    deg = np.minimum(rng.pareto(1.5, 50_000) * 5 + 1, 3000).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(deg)])
    d = degree_stats(degree_counts(indptr))
    x = np.sort(deg).astype(float)
    n = len(x)
    gini = 2 * np.sum(np.arange(1, n + 1) * x) / (n * x.sum()) - (n + 1) / n
    assert d.gini == pytest.approx(gini, abs=1e-9)
    assert (d.median, d.max, d.mean) == (np.median(x), x.max(), pytest.approx(x.mean()))
    assert d.p99 == pytest.approx(np.percentile(x, 99), abs=1)
    assert d.top1pct_edge_share == pytest.approx(x[-n // 100 :].sum() / x.sum())
    assert d.kept_fraction(10) == pytest.approx(np.minimum(x, 10).sum() / x.sum())
    assert sum(d.hist["nodes"]) == n
    even = degree_stats(np.bincount(np.full(1000, 7)))
    assert (even.gini, even.p99_over_median, even.skewed) == (pytest.approx(0.0, abs=1e-12), 1.0, False)


def test_skew_rule_separates_a_skewed_generated_graph_from_the_default(tmp_path):
    default = graph_stats(skewed_graph(tmp_path / "default", 20_000, 2.5)).degrees
    skewed = graph_stats(skewed_graph(tmp_path / "skewed", 20_000, 2.1)).degrees
    assert not default.skewed and skewed.skewed
    # Measured (stats.py): 11.8 / 0.48 against 27.3 / 0.62 at 20k nodes.
    assert default.p99_over_median < 15 and skewed.p99_over_median > 25
    assert default.gini < 0.5 < 0.6 < skewed.gini
    json.dumps(skewed.as_dict())


# ---------------------------------------------------------------- full-graph memory
def test_full_graph_terms_add_up_and_grow_with_the_graph():
    model = compose("profile", "+exp=full_sage").model

    def stats(n):
        return GraphStats("g", n, 20 * n, 128, 4, 16, n // 2, None, "description")

    small, large = full_graph_memory(stats(10_000), model), full_graph_memory(stats(20_000), model)
    assert sum(small["terms_bytes"].values()) == small["total_bytes"]
    for key in ("features in RAM", "layer 0 activations", "layer 1 activations"):
        assert large["terms_bytes"][key] == 2 * small["terms_bytes"][key]
    # SAGE 128 -> 256 -> 16 with batch norm: the aggregated input (128) at layer 0; norm input, ReLU
    # output and dropout mask (3 x 256); layer 1 keeps its input (256).
    assert small["terms_bytes"]["layer 0 activations"] == 10_000 * (128 + 3 * 256) * 4
    assert small["terms_bytes"]["layer 1 activations"] == 10_000 * 256 * 4
    assert small["num_params"] == 2 * 128 * 256 + 256 + 2 * 256 * 16 + 16 + 2 * 256


# ---------------------------------------------------------------- the four recommendations
def test_cora_plans_full_graph_training(tmp_path):
    path = shared_data("planetoid_cora")
    graph_dir = build_graph(tmp_path, "data=planetoid", f"data.path={path}")
    plan = make_plan(compose("profile", f"graph_dir={graph_dir}"), BUDGET)
    json.dumps(plan)
    assert set(plan) >= {"graph", "full_graph", "minibatch", "recommendation", "budget"}
    rec = plan["recommendation"]
    assert rec["formation"] == "full"
    assert any("2,708 nodes" in r for r in rec["reasons"])
    assert plan["graph"]["num_nodes"] == 2708 and not plan["graph"]["degrees"]["skewed"]
    m = plan["minibatch"]["measured"]
    assert m["input_nodes"] <= plan["minibatch"]["worst_case"]["input_nodes"] <= 2708


# The 500k-node synthetic benchmark graph (bench/tmp/syn500k: default exponent 2.5, avg degree 20,
# 9,875,994 edges, 128 features, 16 classes, 299,834 train nodes), as measured: its log-binned in-degree
# histogram, and the largest of 5 sage_2hop batches of 1024 seeds read 116,246 of its nodes (23%).
SYN500K_HIST = {
    "degree": [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
    "nodes": [83, 653, 9038, 99072, 233476, 104868, 34706, 11974, 3960, 1422, 501, 177, 60, 10],
}


def counts_from_hist(hist: dict, max_degree: int) -> np.ndarray:
    """Nodes per degree value, each bin's nodes spread evenly over it."""
    counts = np.zeros(max_degree + 1, dtype=np.int64)
    for lo, c in zip(hist["degree"], hist["nodes"], strict=True):
        hi = min(2 * lo if lo > 1 else lo + 1, max_degree + 1)
        counts[lo:hi] += c // (hi - lo)
        counts[lo] += c % (hi - lo)
    return counts


def test_a_500k_node_graph_with_even_degrees_gets_neighbour_sampling():
    degrees = degree_stats(counts_from_hist(SYN500K_HIST, 4209))
    assert not degrees.skewed and 12 < degrees.p99_over_median < 15  # measured 13.3
    stats = GraphStats("syn500k", 500_000, 9_875_994, 128, 4, 16, 299_834, degrees, "graph_dir")
    model = compose("profile").model
    full = full_graph_memory(stats, model, baseline_bytes=280 << 20)
    minibatch = {
        "fanouts": [25, 10],
        "measured": {"input_nodes": 116_246},
        "leanest_batch_size": 64,
        "leanest_must_fit_bytes": 600 << 20,
        "largest_fitting": {
            "configured_fits": True,
            "batch_size": 65536,
            "fanouts": [100, 40],
            "fanout_scale": 4,
        },
    }
    # Full-graph training would fit 16 GB, but 500k nodes with 60% of them labelled is a job for sampling.
    assert full["total_bytes"] < BUDGET.bytes
    rec = recommend(stats, full, minibatch, BUDGET, None)
    assert rec["formation"] == "neighbor"
    assert rec["numbers"]["p99_over_median"] == pytest.approx(degrees.p99_over_median, abs=0.01)
    assert any("up to 65,536" in r for r in rec["reasons"])


def test_a_skewed_generated_graph_gets_importance_sampling(tmp_path):
    graph_dir = skewed_graph(tmp_path, 150_000, 2.1)
    plan = make_plan(compose("profile", f"graph_dir={graph_dir}", "profile.probe_batches=2"), BUDGET)
    rec = plan["recommendation"]
    assert plan["graph"]["degrees"]["skewed"]
    assert rec["formation"] == "importance", rec["reasons"]
    assert any("skewed" in r for r in rec["reasons"])


def test_a_described_billion_node_graph_is_distributed_without_a_graph_dir(tmp_path):
    cfg = compose(
        "profile",
        f"graph_dir={tmp_path / 'absent'}",
        "profile.num_nodes=1e9",
        "profile.avg_degree=50",
    )
    plan = make_plan(cfg, BUDGET)
    json.dumps(plan)
    assert plan["graph"]["source"] == "description" and plan["graph"]["degrees"] is None
    assert plan["minibatch"]["measured"] is None and "worst case" in plan["minibatch"]["source"]
    rec = plan["recommendation"]
    assert rec["formation"] == "distributed"
    # The CSC alone: (1e9 + 1) x 8 + 5e10 x 8 bytes = 408 GB, far over 16 GB.
    assert plan["graph"]["csc_bytes"] == (10**9 + 1) * 8 + 50 * 10**9 * 8
    assert rec["numbers"]["leanest_minibatch_bytes"] > plan["graph"]["csc_bytes"]
    assert rec["largest_fitting"]["batch_size"] is None
    # A host with 1 TB holds it: then a described graph is sampled (its skew is unknown).
    big = make_plan(cfg, Budget(10**12, "1TB"))
    assert big["recommendation"]["formation"] == "neighbor"
    assert big["minibatch"]["largest_fitting"]["batch_size"] >= 1024


def test_a_described_graph_with_bad_numbers_is_refused():
    with pytest.raises(ConfigError, match="profile.avg_degree"):
        make_plan(compose("profile", "profile.num_nodes=1e6"), BUDGET)


def test_profile_stage_writes_json_and_valid_pngs(tmp_path):
    from gnnscale.stages import profile

    graph = build_graph(tmp_path, *TINY_SYNTHETIC)
    out = profile.run(
        compose("profile", f"graph_dir={graph}", f"run_dir={tmp_path / 'p'}", "+exp=debug_tiny",
                "profile.measure=true", "profile.num_batches=3")
    )  # fmt: skip
    saved = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert saved["recommendation"]["formation"] == out["recommendation"]["formation"] == "full"
    # the table names the preset to pass, as the user would type it
    assert summary_rows(saved)["recommended formation"] == "full (+exp=full_gcn (or +exp=full_sage))"
    assert len(saved["plots"]) == 4
    for png in saved["plots"]:
        assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    split = saved["measured"]["steps"]["split_s"]
    assert (
        abs(sum(split.values()) - saved["measured"]["steps"]["step_s"])
        <= 0.1 * saved["measured"]["steps"]["step_s"]
    )


def test_profile_evaluation_batches_follow_the_batch_size_as_train_does():
    """train.eval_batch_size=0: evaluation batches are the training batch size, so profile's plan at
    another batch size scales them with it (sampled and subgraph formations alike); set, they stay."""
    from gnnscale.profile.minibatch import BatchModel
    from gnnscale.training.memory_plan import BatchShape, Sizes, Workload

    sizes = Sizes(1_000_000, 256, 4, 80_000_000, (256, 128, 8), 70_000, False)
    train = BatchShape(200_000, (20_000, 1024), (200_000, 10_000))
    evals = BatchShape(600_000, (100_000, 1024), (1_000_000, 10_000))  # all neighbours: larger than train's
    w = Workload(sizes, train, evals, 300 << 20, 0)
    budget = Budget(10**12, "test")
    sizes_and_settings = dict(
        num_edges=10**7, all_neighbours=50.0, feature_cache="mmap", prefetch=0, budget=budget
    )
    for fanouts in ([10, 10], None):
        follows = BatchModel(w, fanouts, 1024, eval_follows_batch=True, **sizes_and_settings)
        fixed = BatchModel(w, fanouts, 1024, eval_follows_batch=False, **sizes_and_settings)
        assert follows.workload(2048, fanouts).evals == evals.scaled(2.0, sizes.num_nodes)
        assert follows.workload(2048, fanouts).evals.dst_rows == (200_001, 2049)  # linear, + 1
        assert fixed.workload(2048, fanouts).evals == evals
        assert follows.workload(1024, fanouts).evals == evals
        assert follows.plan(2048, fanouts).must_fit > fixed.plan(2048, fanouts).must_fit
