"""Node partitions of a graph_dir, owned here alone (no DGL): who writes them, who reads them, when stale.

graph_dir/partitions/<method>-<num_parts>/
  assignment.npy   the part id of every node (int32; int64 is read too), mmap-able
  report.json      how it was made and how good it is (edge cut, balance, time, memory) and `graph`:
                   the fingerprint of the CSC it was made from. Written last, removed first: an
                   assignment without a report is never read.

An assignment is stale when the graph it was made from changed: the fingerprint records num_nodes, the
CSC's edge count and a digest of the shard checksums the CSC was built from (meta.json).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from gnnscale.utils.atomic import atomic_path, write_json

PARTITIONS_DIR = "partitions"
ASSIGNMENT, REPORT = "assignment.npy", "report.json"
NODES_PER_PART = 1000  # Cluster-GCN's clusters: about this many nodes each


def default_num_parts(num_nodes: int) -> int:
    """About one part per NODES_PER_PART nodes, at least 1."""
    return max(1, round(int(num_nodes) / NODES_PER_PART))


def partition_dir(graph_dir, method: str, num_parts: int) -> Path:
    """graph_dir (a path or a GraphDir) / partitions / <method>-<num_parts>."""
    root = Path(getattr(graph_dir, "path", graph_dir))
    return root / PARTITIONS_DIR / f"{method}-{int(num_parts)}"


def fingerprint(graph) -> dict | None:
    """What a partition was made from: the graph's size and the shards its CSC was built from.
    None when the graph_dir has no CSC."""
    csc = graph.meta.get("csc")
    if not csc:
        return None
    digest = hashlib.sha256("".join(csc.get("shard_sha256", [])).encode()).hexdigest()[:16]
    return {"num_nodes": graph.num_nodes, "num_edges": int(csc["num_edges"]), "csc_shards_sha256": digest}


def read_report(graph, method: str, num_parts: int) -> dict | None:
    path = partition_dir(graph, method, num_parts) / REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def is_current(graph, report: dict | None) -> bool:
    """Was this report's partition made from the graph as it is now?"""
    current = fingerprint(graph)
    return report is not None and current is not None and report.get("graph") == current


def read_assignment(graph, method: str, num_parts: int) -> np.ndarray | None:
    """The part id of every node (read-only mmap), or None when absent, incomplete or stale."""
    if not is_current(graph, read_report(graph, method, num_parts)):
        return None
    try:
        assignment = np.load(partition_dir(graph, method, num_parts) / ASSIGNMENT, mmap_mode="r")
    except (OSError, ValueError):
        return None
    if assignment.shape != (graph.num_nodes,) or assignment.dtype.kind not in "iu":
        return None
    return assignment


def write_partition(graph, method: str, num_parts: int, assignment: np.ndarray, report: dict) -> Path:
    """Publish an assignment and its report (the report gains `graph`, the fingerprint); returns the folder."""
    assignment = np.asarray(assignment)
    if assignment.shape != (graph.num_nodes,):
        raise ValueError(f"assignment has shape {assignment.shape}, the graph has {graph.num_nodes} nodes")
    folder = partition_dir(graph, method, num_parts)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REPORT).unlink(missing_ok=True)  # from here until the new report, nothing reads the folder
    dtype = np.int32 if num_parts <= np.iinfo(np.int32).max else np.int64
    with atomic_path(folder / ASSIGNMENT) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, assignment.astype(dtype, copy=False))
    write_json(folder / REPORT, {**report, "graph": fingerprint(graph)})
    return folder
