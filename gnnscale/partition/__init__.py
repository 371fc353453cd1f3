"""Node partitions of a graph_dir (Cluster-GCN's clusters): METIS or random, stored by storage/partitions.py.

`ensure_partition(graph, method, num_parts, seed)` returns an up-to-date assignment, making and
writing it when it is absent or stale; `make_partition` always makes one and returns its report too.
METIS runs on the CSC as a simple undirected graph (partition/graph.py), refused before it starts when
its estimated memory exceeds the budget (partition/memory.py).
"""

from __future__ import annotations

import time

import numpy as np

from gnnscale.errors import ConfigError
from gnnscale.partition.graph import adjacency, is_simple_symmetric
from gnnscale.partition.memory import check_metis_memory
from gnnscale.partition.metis import metis_assignment
from gnnscale.partition.random import random_assignment
from gnnscale.partition.report import quality
from gnnscale.storage.csc import open_csc, recorded_index_dtype
from gnnscale.storage.partitions import (
    default_num_parts,
    is_current,
    read_assignment,
    read_report,
    write_partition,
)
from gnnscale.utils.memory import MemorySampler
from gnnscale.utils.ui import info

METHODS = ("metis", "random")
# `gnnscale partition` also writes DistDGL's layout (gnnscale/dist/distdgl/partition.py); the node
# assignments this module makes (Cluster-GCN's clusters) are METIS or random only.
STAGE_METHODS = (*METHODS, "distdgl")


def check_method(method: str, key: str = "partition.method", methods: tuple = METHODS) -> str:
    if method not in methods:
        raise ConfigError(
            f"{key}={method!r} is not a partition method", f"choose one of {', '.join(methods)}"
        )
    return method


def resolve_num_parts(num_parts: int | None, num_nodes: int, key: str = "partition.num_parts") -> int:
    """None = default_num_parts(num_nodes); fewer than 1 part or more parts than nodes is a ConfigError."""
    default = default_num_parts(num_nodes)
    if num_parts is None:
        return default
    k = int(num_parts)
    if k < 1:
        raise ConfigError(
            f"{key}={k} is not a count of parts",
            f"give 1 or more, or leave {key} out for about one per 1,000 nodes ({default:,} here)",
        )
    if k > num_nodes:
        raise ConfigError(
            f"{key}={k} is more parts than the graph's {num_nodes:,} nodes",
            f"use at most {num_nodes:,}, or leave {key} out for {default:,}",
        )
    return k


def current_report(graph, method: str, num_parts: int, balance_train: bool | None = None) -> dict | None:
    """The report of an up-to-date partition (same graph; same balance_train unless None), else None."""
    report = read_report(graph, method, num_parts)
    if not is_current(graph, report):
        return None
    if balance_train is not None and method == "metis" and report.get("balance_train") != bool(balance_train):
        return None
    return report if read_assignment(graph, method, num_parts) is not None else None


def make_partition(
    graph, method: str, num_parts: int, seed: int = 0, budget: str = "auto", balance_train: bool = True
) -> tuple[np.ndarray, dict]:
    """Partition `graph` (a GraphDir with a CSC), write it, return (assignment, report)."""
    check_method(method)
    num_parts = resolve_num_parts(num_parts, graph.num_nodes)
    open_csc(graph)  # "run gnnscale build-csr first" before anything else
    num_edges = int(graph.meta["csc"]["num_edges"])
    plan = {}
    if method == "metis":
        simple, directed = is_simple_symmetric(graph.meta), bool(graph.meta.get("directed"))
        itemsize = recorded_index_dtype(graph.meta).itemsize  # int32 is widened for METIS: counted
        plan = check_metis_memory(
            graph.num_nodes, num_edges, budget, simple, directed, index_itemsize=itemsize
        )
    train_mask = graph.mask("train").numpy().astype(bool)
    if method == "metis":
        import dgl  # noqa: F401  (imported before the clock starts: ~1 s and ~60 MB that are not METIS's)
    sampler = MemorySampler(interval_s=0.02)
    t0 = time.perf_counter()
    with sampler:
        start_anon = sampler.peak_anon_mb
        adj = adjacency(graph)
        if method == "metis":
            assignment = metis_assignment(adj, num_parts, train_mask if balance_train else None)
        else:
            assignment = random_assignment(graph.num_nodes, num_parts, seed, train_mask)
        partition_s = time.perf_counter() - t0
    report = {
        "method": method,
        "num_parts": num_parts,
        "seed": int(seed),
        "balance_train": bool(balance_train),
        "partition_time_s": round(partition_s, 3),
        "peak_rss_mb": _mb(sampler.peak_rss_mb),
        "peak_anon_mb": _mb(sampler.peak_anon_mb),
        "anon_growth_mb": _mb(None if start_anon is None else sampler.peak_anon_mb - start_anon),
        "graph_rebuilt": adj.rebuilt,
        **plan,
        **quality(adj, assignment, num_parts, train_mask),
    }
    report["folder"] = str(write_partition(graph, method, num_parts, assignment, report))
    return assignment, report


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def ensure_partition(
    graph,
    method: str,
    num_parts: int,
    seed: int = 0,
    budget: str = "auto",
    balance_train: bool | None = None,
) -> np.ndarray:
    """An up-to-date assignment of `graph` (num_parts None = default), made and written when absent or stale.
    balance_train None: any up-to-date one will do, and a new METIS one balances training nodes."""
    check_method(method)
    num_parts = resolve_num_parts(num_parts, graph.num_nodes)
    if current_report(graph, method, num_parts, balance_train) is not None:
        return read_assignment(graph, method, num_parts)
    info(f"partition: making a {method} partition of {graph.path} into {num_parts:,} parts")
    assignment, _ = make_partition(
        graph, method, num_parts, seed, budget, True if balance_train is None else balance_train
    )
    return assignment
