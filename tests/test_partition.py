"""`gnnscale partition`: METIS / random assignments, their report, reuse, staleness, refusals, the pipeline."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import ConfigError
from gnnscale.partition import ensure_partition, make_partition, resolve_num_parts
from gnnscale.partition.graph import adjacency
from gnnscale.stages import partition as partition_stage
from gnnscale.stages import pipeline
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.partitions import (
    ASSIGNMENT,
    REPORT,
    default_num_parts,
    partition_dir,
    read_assignment,
    read_report,
    write_partition,
)
from tests.conftest import build_graph, compose

runner = CliRunner()
GRAPH = ("data.num_nodes=2000", "data.avg_degree=10", "data.feat_dim=4", "shard.nodes_per_shard=700")
METIS_TOLERANCE = 1.03  # METIS's default imbalance for k-way (ufactor 30), per constraint


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("part"), *GRAPH)


def part(graph_dir, tmp_path, *overrides):
    cfg = compose("partition", f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'run'}", *overrides)
    return partition_stage.run(cfg)


def invoke(graph_dir, tmp_path, *overrides):
    return runner.invoke(
        app, ["partition", f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'r'}", *overrides]
    )


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


# ---------------------------------------------------------------- the assignments
@pytest.mark.parametrize("k", [2, 8, 16])
def test_metis_covers_every_node_once_balanced(graph_dir, tmp_path, k):
    s = part(graph_dir, tmp_path, f"partition.num_parts={k}", "overwrite=true")
    graph = GraphDir(graph_dir)
    a = np.asarray(read_assignment(graph, "metis", k))
    assert a.shape == (2000,) and a.min() >= 0 and a.max() < k  # one part id per node, in range
    nodes = np.bincount(a, minlength=k)
    train = np.bincount(a[graph.mask("train").numpy()], minlength=k)
    assert nodes.sum() == 2000 and (nodes > 0).all() and s["empty_parts"] == 0
    assert nodes.max() / nodes.mean() <= METIS_TOLERANCE + 1e-9
    assert train.max() / train.mean() <= METIS_TOLERANCE + 1e-9  # training nodes balance too
    assert s["node_balance"] == pytest.approx(nodes.max() / nodes.mean(), abs=1e-4)
    assert s["train_balance"] == pytest.approx(train.max() / train.mean(), abs=1e-4)


def test_random_is_seeded_and_balanced_to_one_node(graph_dir, tmp_path):
    s = part(graph_dir, tmp_path, "partition.method=random", "partition.num_parts=7", "overwrite=true")
    graph = GraphDir(graph_dir)
    a = np.array(read_assignment(graph, "random", 7))
    nodes = np.bincount(a, minlength=7)
    train = np.bincount(a[graph.mask("train").numpy()], minlength=7)
    assert nodes.max() - nodes.min() <= 1 and train.max() - train.min() <= 1
    assert s["seed"] == 0 and s["partition_time_s"] >= 0
    again, _ = make_partition(graph, "random", 7, seed=0)
    other, _ = make_partition(graph, "random", 7, seed=1)
    assert np.array_equal(again, a) and not np.array_equal(other, a)


def test_report_fields_and_metis_cuts_fewer_edges_than_random(graph_dir, tmp_path):
    metis = part(graph_dir, tmp_path, "partition.num_parts=8", "overwrite=true")
    rand = part(graph_dir, tmp_path, "partition.method=random", "partition.num_parts=8", "overwrite=true")
    report = read_report(GraphDir(graph_dir), "metis", 8)
    for key in (
        "edge_cut",
        "edge_cut_ratio",
        "undirected_edges",
        "nodes_per_part",
        "edges_per_part",
        "train_nodes_per_part",
        "node_balance",
        "train_balance",
        "partition_time_s",
        "peak_rss_mb",
        "peak_anon_mb",
        "estimate_mb",
        "graph",
    ):
        assert key in report, key
    graph = GraphDir(graph_dir)
    assert report["undirected_edges"] * 2 == graph.meta["csc"]["num_edges"]
    # per-part internal edges + cut edges = every undirected edge
    assert sum(report["edges_per_part"]) + report["edge_cut"] == report["undirected_edges"]
    assert metis["edge_cut"] < 0.6 * rand["edge_cut"]
    assert rand["edge_cut_ratio"] == pytest.approx(7 / 8, abs=0.03)  # random: 1 - 1/k of the edges cut
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stage"] == "partition" and summary["method"] == "random"


def test_edge_cut_matches_a_direct_count(graph_dir):
    graph = GraphDir(graph_dir)
    a, report = make_partition(graph, "metis", 4)
    adj = adjacency(graph)
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(adj.indptr))
    src = np.asarray(adj.indices)
    upper = src < dst
    assert report["edge_cut"] == int((a[src[upper]] != a[dst[upper]]).sum())


def test_a_directed_graph_is_symmetrised_first(tmp_path):
    gd = build_graph(tmp_path, *GRAPH, "data.make_undirected=false", "data.self_loops=keep")
    graph = GraphDir(gd)
    adj = adjacency(graph)
    assert adj.rebuilt
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(adj.indptr))
    src = np.asarray(adj.indices)
    assert (src != dst).all()  # no self-loops
    fwd = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert len(fwd) == len(src) and fwd == {(d, s) for s, d in fwd}  # no duplicates, symmetric
    a = ensure_partition(graph, "metis", 4)
    assert a.shape == (2000,) and set(np.unique(a)) == {0, 1, 2, 3}


# ---------------------------------------------------------------- reuse and staleness
def test_up_to_date_partition_is_reused_unless_overwrite(graph_dir, tmp_path):
    first = part(graph_dir, tmp_path, "partition.num_parts=5", "overwrite=true")
    path = partition_dir(graph_dir, "metis", 5) / ASSIGNMENT
    stamp = os.stat(path).st_mtime_ns
    second = part(graph_dir, tmp_path, "partition.num_parts=5")
    assert second["reused"] and not first["reused"] and os.stat(path).st_mtime_ns == stamp
    assert second["edge_cut"] == first["edge_cut"]
    # another balance_train makes another partition; ensure_partition takes whichever is up to date
    third = part(graph_dir, tmp_path, "partition.num_parts=5", "partition.balance_train=false")
    assert not third["reused"] and not read_report(GraphDir(graph_dir), "metis", 5)["balance_train"]
    ensure_partition(GraphDir(graph_dir), "metis", 5)
    assert os.stat(path).st_mtime_ns != stamp
    again = part(graph_dir, tmp_path, "partition.num_parts=5", "overwrite=true")
    assert not again["reused"]


def test_stale_partition_is_detected_and_remade(tmp_path, capsys):
    gd = build_graph(tmp_path, *GRAPH)
    graph = GraphDir(gd)
    a = ensure_partition(graph, "metis", 4)
    assert np.array_equal(read_assignment(graph, "metis", 4), a)
    capsys.readouterr()
    assert np.array_equal(ensure_partition(graph, "metis", 4), a)  # up to date: no line
    assert "making" not in capsys.readouterr().out
    build_graph(tmp_path, *GRAPH, "data.seed=1", "overwrite=true")  # another graph, same graph_dir
    graph = GraphDir(gd)
    assert read_assignment(graph, "metis", 4) is None
    ensure_partition(graph, "metis", 4)
    assert "making a metis partition" in capsys.readouterr().out
    assert read_assignment(graph, "metis", 4) is not None


def test_storage_api_round_trip(graph_dir):
    graph = GraphDir(graph_dir)
    ids = np.arange(graph.num_nodes) % 3
    folder = write_partition(graph, "random", 3, ids, {"note": "by hand"})
    assert folder == graph_dir / "partitions" / "random-3" and (folder / REPORT).is_file()
    a = read_assignment(graph, "random", 3)
    assert a.dtype == np.int32 and np.array_equal(a, ids)
    assert read_report(graph, "random", 3)["note"] == "by hand"
    (folder / REPORT).unlink()  # an assignment without its report is never read
    assert read_assignment(graph, "random", 3) is None and read_report(graph, "random", 3) is None
    assert default_num_parts(0) == 1 and default_num_parts(2000) == 2 and default_num_parts(2_449_029) == 2449


# ---------------------------------------------------------------- refusals: exit 2, one line
def test_more_parts_than_nodes_is_exit_2(graph_dir, tmp_path):
    line = one_error_line(invoke(graph_dir, tmp_path, "partition.num_parts=2001"))
    assert "more parts than the graph's 2,000 nodes" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("k", ["0", "-1"])
def test_zero_or_negative_parts_is_exit_2(graph_dir, tmp_path, k):
    line = one_error_line(invoke(graph_dir, tmp_path, f"partition.num_parts={k}"))
    assert f"partition.num_parts={k} is not a count of parts" in line
    assert "leave partition.num_parts out for about one per 1,000 nodes (2 here)" in line
    assert not (tmp_path / "r").exists()


def test_num_parts_left_out_is_one_per_1000_nodes(graph_dir, tmp_path):
    result = invoke(graph_dir, tmp_path)
    assert result.exit_code == 0, result.output
    assert read_assignment(GraphDir(graph_dir), "metis", default_num_parts(2000)) is not None
    assert resolve_num_parts(None, 10) == 1
    with pytest.raises(ConfigError):
        resolve_num_parts(0, 10)


def test_unknown_method_is_exit_2(graph_dir, tmp_path):
    assert "partition.method='spectral'" in one_error_line(
        invoke(graph_dir, tmp_path, "partition.method=spectral")
    )


def test_graph_without_csc_is_exit_2(tmp_path):
    gd = build_graph(tmp_path, *GRAPH, csc=False)
    line = one_error_line(invoke(gd, tmp_path))
    assert "has no CSC" in line and "gnnscale build-csr" in line


def test_metis_over_the_memory_budget_is_refused_before_it_starts(graph_dir, tmp_path):
    line = one_error_line(
        invoke(graph_dir, tmp_path, "partition.num_parts=3", "partition.memory_budget=50MB")
    )
    assert "METIS on 2,000 nodes" in line and "memory budget of 0.05 GB" in line
    assert "partition.method=random" in line and "more memory" in line
    assert read_report(GraphDir(graph_dir), "metis", 3) is None
    # random has no such estimate
    result = invoke(
        graph_dir,
        tmp_path,
        "partition.method=random",
        "partition.num_parts=3",
        "partition.memory_budget=50MB",
    )
    assert result.exit_code == 0, result.output


def test_help_teaches_with_examples():
    result = runner.invoke(app, ["partition", "--help"])
    assert result.exit_code == 0 and "Examples" in result.stdout and "gnnscale partition" in result.stdout


# ---------------------------------------------------------------- the pipeline
def pipeline_cfg(root, name, sampler: dict | None, *overrides):
    cfg = compose(
        "pipeline",
        f"graph_dir={root / 'graph'}",
        f"run_dir={root / 'runs' / name}",
        *GRAPH,
        "stages=[shard,build_csr,partition]",
        *overrides,
    )
    if sampler is not None:  # a cluster_gcn sampler config, whatever configs/sampler/ holds
        OmegaConf.set_struct(cfg, False)
        cfg.sampler = sampler
    return cfg


def test_pipeline_partitions_only_for_cluster_gcn(tmp_path):
    s = pipeline.run(pipeline_cfg(tmp_path, "neighbor", None))
    assert list(s["stages"]) == ["shard", "build_csr"]  # not needed: left out
    cluster = {"kind": "cluster_gcn", "method": "metis", "num_parts": 0, "clusters_per_batch": 2}
    s = pipeline.run(pipeline_cfg(tmp_path, "first", cluster))
    assert list(s["stages"]) == ["shard", "build_csr", "partition"]
    p = s["stages"]["partition"]
    assert not p["skipped"] and p["num_parts"] == default_num_parts(2000) and p["method"] == "metis"
    assert read_assignment(GraphDir(tmp_path / "graph"), "metis", 2) is not None
    s = pipeline.run(pipeline_cfg(tmp_path, "second", cluster))
    assert s["stages"]["partition"]["skipped"] and s["stages"]["partition"]["reused"]
    s = pipeline.run(pipeline_cfg(tmp_path, "random", {**cluster, "method": "random", "num_parts": 4}))
    assert s["stages"]["partition"]["method"] == "random" and s["stages"]["partition"]["num_parts"] == 4
    s = pipeline.run(pipeline_cfg(tmp_path, "per_part", {**cluster, "nodes_per_part": 300}))
    assert s["stages"]["partition"]["num_parts"] == 7  # ceil(2000 / 300), as the sampler reads it
    with pytest.raises(ConfigError, match="sampler.method='nope'"):
        pipeline.run(pipeline_cfg(tmp_path, "bad", {**cluster, "method": "nope"}))
