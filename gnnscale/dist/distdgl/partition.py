"""graph_dir -> DistDGL partitions (`dgl.distributed.partition_graph`): graph_dir/partitions/distdgl-<P>/.

DGL writes <graph_name>.json (the partition config servers and trainers read) and part<i>/ (graph.dgl,
node_feat.dgl, edge_feat.dgl); storage/partitions.py writes assignment.npy and, last, report.json, whose
graph fingerprint decides whether the folder is up to date (as for the METIS / random partitions).
Node data: feat, label, train_mask / val_mask / test_mask (labelled nodes only) and orig_id, the
graph_dir id of each node: partition_graph renumbers nodes so that each part's are contiguous, and
inference writes its rows back in graph_dir order through orig_id.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.partition import current_report
from gnnscale.partition.graph import adjacency, is_simple_symmetric
from gnnscale.partition.memory import check_metis_memory
from gnnscale.partition.report import quality
from gnnscale.storage.csc import open_csc
from gnnscale.storage.partitions import REPORT, partition_dir, write_partition
from gnnscale.utils.memory import MemorySampler
from gnnscale.utils.ui import info

METHOD = "distdgl"
SPLITS = ("train", "val", "test")
NODE_DATA = ("feat", "label", "train_mask", "val_mask", "test_mask", "orig_id")


def graph_name(graph) -> str:
    """DistDGL names its shared-memory segments after the graph: letters, digits and _ only."""
    return "gs_" + (re.sub(r"\W", "_", str(graph.meta.get("name", "graph"))) or "graph")[:40]


def check_num_parts(num_parts: int | None, num_nodes: int, key: str = "partition.num_parts") -> int:
    k = 0 if num_parts is None else int(num_parts)
    if k < 1:
        raise ConfigError(
            f"{key}={num_parts}: a DistDGL partition needs a count of parts (one per machine)",
            f"pass {key}=1 for one machine, or the number of lines of your ip_config",
        )
    if k > num_nodes:
        raise ConfigError(
            f"{key}={k} is more parts than the graph's {num_nodes:,} nodes", f"use at most {num_nodes:,}"
        )
    return k


def part_config_path(graph, num_parts: int, report: dict | None = None) -> Path:
    name = (report or {}).get("part_config") or f"{graph_name(graph)}.json"
    return partition_dir(graph, METHOD, num_parts) / name


def current_distdgl_report(
    graph, method: str, num_parts: int, balance_train: bool | None = None
) -> dict | None:
    """The report of an up-to-date DistDGL partition (same graph and, unless None, balance_train), else None.
    Same signature as gnnscale.partition.current_report, so the partition stage calls either."""
    report = current_report(graph, METHOD, num_parts)
    if report is None or not part_config_path(graph, num_parts, report).is_file():
        return None
    if balance_train is not None and report.get("balance_train") != bool(balance_train):
        return None
    return report


def ensure_distdgl_partition(graph, num_parts: int, seed: int = 0) -> Path:
    """The part config of an up-to-date DistDGL partition of `graph`, made first when absent or stale."""
    num_parts = check_num_parts(num_parts, graph.num_nodes, "dist.num_parts")
    report = current_distdgl_report(graph, METHOD, num_parts)
    if report is None:
        info(f"partition: making a DistDGL partition of {graph.path} into {num_parts} part(s)")
        _, report = make_distdgl_partition(graph, METHOD, num_parts, seed)
    return part_config_path(graph, num_parts, report)


def make_distdgl_partition(
    graph,
    method: str = METHOD,
    num_parts: int = 1,
    seed: int = 0,
    budget: str = "auto",
    balance_train: bool = True,
) -> tuple[np.ndarray, dict]:
    """Partition `graph` (a GraphDir with a CSC) with DistDGL's METIS layout; returns (assignment, report).
    Same signature as gnnscale.partition.make_partition."""
    import dgl

    num_parts = check_num_parts(num_parts, graph.num_nodes)
    indptr, indices = open_csc(graph)
    num_edges = int(graph.meta["csc"]["num_edges"])
    plan = check_metis_memory(
        graph.num_nodes, num_edges, budget, is_simple_symmetric(graph.meta), bool(graph.meta.get("directed"))
    )
    g, train_mask = _dgl_graph(graph, indptr, indices)
    folder = partition_dir(graph, METHOD, num_parts)
    _clear(folder)
    name = graph_name(graph)
    sampler = MemorySampler(interval_s=0.02)
    t0 = time.perf_counter()
    with sampler, contextlib.redirect_stdout(io.StringIO()):  # DGL narrates every step on stdout
        orig_nids, _ = dgl.distributed.partition_graph(
            g,
            name,
            num_parts,
            str(folder),
            part_method="metis",
            balance_ntypes=g.ndata["train_mask"].to(torch.int64) if balance_train else None,
            balance_edges=True,
            return_mapping=True,
        )
    partition_s = time.perf_counter() - t0
    assignment = _assignment(folder / f"{name}.json", orig_nids.numpy(), graph.num_nodes)
    report = {
        "method": METHOD,
        "num_parts": num_parts,
        "seed": int(seed),
        "balance_train": bool(balance_train),
        "balance_edges": True,
        "part_config": f"{name}.json",
        "graph_name": name,
        "partition_time_s": round(partition_s, 3),
        "peak_rss_mb": _mb(sampler.peak_rss_mb),
        "peak_anon_mb": _mb(sampler.peak_anon_mb),
        "graph_rebuilt": False,
        **plan,
        **quality(adjacency(graph), assignment, num_parts, train_mask),
    }
    report["folder"] = str(write_partition(graph, METHOD, num_parts, assignment, report))
    return assignment, report


def _dgl_graph(graph, indptr, indices):
    """The whole graph with its node data in memory: partition_graph needs it all at once."""
    import dgl

    n = graph.num_nodes
    ip = torch.from_numpy(np.array(indptr, dtype=np.int64))  # a copy: DGL owns it
    ix = torch.from_numpy(np.array(indices, dtype=np.int64))
    g = dgl.graph(("csc", (ip, ix, torch.empty(0, dtype=torch.int64))), num_nodes=n)
    feat = torch.cat([graph.shard(i)["feat"] for i in range(graph.num_shards)]).to(torch.float32)
    if not bool(torch.isfinite(feat).all()):
        raise DataError(
            f"features in '{graph.path}' hold NaN or inf",
            "clean the source features and re-run `gnnscale shard`",
        )
    label = graph.labels().to(torch.int64)
    g.ndata["feat"] = feat
    g.ndata["label"] = label
    for split in SPLITS:  # unlabelled nodes are never trained on or scored, as in one process
        g.ndata[f"{split}_mask"] = graph.mask(split).to(torch.bool) & (label >= 0)
    g.ndata["orig_id"] = torch.arange(n, dtype=torch.int64)
    return g, g.ndata["train_mask"].numpy()


def _assignment(part_config: Path, orig_nids: np.ndarray, num_nodes: int) -> np.ndarray:
    """The part of every graph_dir node: part p holds the renumbered ids node_map[p] = [start, end)."""
    import json

    ranges = json.loads(part_config.read_text())["node_map"]["_N"]
    assignment = np.empty(num_nodes, dtype=np.int32)
    for p, (start, end) in enumerate(ranges):
        assignment[orig_nids[start:end]] = p
    return assignment


def _clear(folder: Path) -> None:
    """Invalidate first (report.json), then remove the previous layout: a half-made folder is never read."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REPORT).unlink(missing_ok=True)
    for p in folder.glob("part*"):
        if p.is_dir() and re.fullmatch(r"part\d+", p.name):
            shutil.rmtree(p)
    for p in folder.glob("*.json"):
        p.unlink()


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
