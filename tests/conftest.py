"""Shared fixtures: tiny graphs built through the real stages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gnnscale.config import compose_config

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
os.environ.setdefault("DGLBACKEND", "pytorch")


def shared_data(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"{path} is absent (real graphs live in ../shared/data)")
    return path


def compose(stage: str, *overrides: str):
    return compose_config(stage, list(overrides))


def build_graph(tmp_path: Path, *overrides: str, csc: bool = True) -> Path:
    """Shard (and build the CSC of) a graph into tmp_path/graph; returns graph_dir."""
    from gnnscale.stages import build_csr, shard

    graph_dir = tmp_path / "graph"
    common = (f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'runs' / 'shard'}")
    shard.run(compose("shard", *common, *overrides))
    if csc:
        build_csr.run(compose("build_csr", f"graph_dir={graph_dir}", f"run_dir={tmp_path / 'runs' / 'csc'}"))
    return graph_dir


TINY_SYNTHETIC = (
    "data.num_nodes=600",
    "data.avg_degree=8",
    "data.feat_dim=8",
    "data.num_classes=3",
    "shard.nodes_per_shard=250",
)


@pytest.fixture
def tiny_graph(tmp_path) -> Path:
    """600 nodes, 3 classes, 3 shards, CSC built."""
    return build_graph(tmp_path, *TINY_SYNTHETIC)
