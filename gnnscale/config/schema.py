"""Typed schemas for every config group option and stage; registered in Hydra's ConfigStore.

Each YAML option lists its schema first in `defaults`, so an unknown key or a wrongly typed value
fails while Hydra composes, before any stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


# ---------------------------------------------------------------- data sources (group `data`)
@dataclass
class DataConfig:
    source: str = MISSING
    name: str = MISSING
    path: Optional[str] = None
    # Store every edge in both directions (GNN message passing wants symmetric neighbourhoods).
    make_undirected: bool = True
    self_loops: str = "remove"  # keep | remove | add
    duplicate_edges: str = "remove"  # keep | remove
    # Use the split the source ships (Planetoid public split, tolokers masks) when it has one.
    use_source_split: bool = True
    split_index: int = 0  # which of several shipped splits (e.g. tolokers has 10)
    split_fractions: List[float] = field(default_factory=lambda: [0.6, 0.2, 0.2])
    chunk_edges: int = 4_000_000  # edges read per streaming step


@dataclass
class SyntheticDataConfig(DataConfig):
    source: str = "synthetic"
    name: str = "synthetic"
    num_nodes: int = 20_000
    avg_degree: float = 20.0
    feat_dim: int = 64
    num_classes: int = 8
    homophily: float = 0.75  # probability an edge stays inside its community (= class)
    power_law_exponent: float = 2.5  # degree propensity ~ Pareto; smaller = heavier tail
    feature_signal: float = 0.4  # class-mean scale relative to unit Gaussian noise
    seed: int = 0
    use_source_split: bool = False


@dataclass
class PlanetoidDataConfig(DataConfig):
    source: str = "planetoid"
    name: str = "auto"  # cora | citeseer | pubmed | auto (from the ind.<name>.* files)


@dataclass
class NpzDataConfig(DataConfig):
    source: str = "npz"
    name: str = "auto"  # from the file name


@dataclass
class EdgelistDataConfig(DataConfig):
    source: str = "edgelist"
    name: str = "auto"
    features: Optional[str] = None  # .npy [N, F]
    labels: Optional[str] = None  # .npy [N], -1 = unlabelled
    split: Optional[str] = None  # .npy [N] of 0 train / 1 val / 2 test / -1 none
    num_nodes: int = 0  # 0 = infer (max endpoint + 1, or the feature rows)
    delimiter: str = "auto"  # auto | , | tab | space
    feat_dim: int = 16  # used only when no feature file is given (random features)


@dataclass
class DglDataConfig(DataConfig):
    source: str = "dgl"
    name: str = "auto"
    feat_key: str = "feat"
    label_key: str = "label"
    graph_index: int = 0


@dataclass
class OgbDataConfig(DataConfig):
    source: str = "ogb"
    name: str = "auto"
    split_name: str = "auto"  # folder under split/ (e.g. sales_ranking, time)


# ---------------------------------------------------------------- models (group `model`)
@dataclass
class ModelConfig:
    arch: str = "sage"  # sage | gcn | mlp (features only; the baseline structure must beat)
    hidden: int = 256
    num_layers: int = 2
    aggregator: str = "mean"  # SAGE: mean | pool | lstm | gcn
    dropout: float = 0.5
    norm: str = "none"  # none | batch | layer


MODEL_SCHEMAS = {"sage": ModelConfig, "gcn": ModelConfig, "mlp": ModelConfig}


# ---------------------------------------------------------------- stages
@dataclass
class ShardOptions:
    nodes_per_shard: int = 100_000


@dataclass
class CscOptions:
    validate: bool = True
    chunk_edges: int = 16_000_000


@dataclass
class StageBase:
    seed: int = 0
    graph_dir: str = "graphs/${data.name}"
    run_dir: Optional[str] = None  # default: runs/<stage>/<timestamp>
    overwrite: bool = False
    data: Any = MISSING


@dataclass
class ShardStageConfig(StageBase):
    shard: ShardOptions = field(default_factory=ShardOptions)


@dataclass
class BuildCscStageConfig(StageBase):
    csc: CscOptions = field(default_factory=CscOptions)


@dataclass
class PipelineStageConfig(StageBase):
    shard: ShardOptions = field(default_factory=ShardOptions)
    csc: CscOptions = field(default_factory=CscOptions)
    stages: List[str] = field(default_factory=lambda: ["shard", "build_csr"])


DATA_SCHEMAS = {
    "synthetic": SyntheticDataConfig,
    "planetoid": PlanetoidDataConfig,
    "npz": NpzDataConfig,
    "edgelist": EdgelistDataConfig,
    "dgl": DglDataConfig,
    "ogb": OgbDataConfig,
}

STAGE_SCHEMAS = {
    "shard": ShardStageConfig,
    "build_csr": BuildCscStageConfig,
    "pipeline": PipelineStageConfig,
}

# group -> option -> schema; each configs/<group>/<option>.yaml lists `<option>_schema` first.
GROUP_SCHEMAS = {"data": DATA_SCHEMAS, "model": MODEL_SCHEMAS}

_registered = False


def register() -> None:
    """Store every schema once: `<stage>_schema` for primaries, `data/<option>_schema` for options."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    for name, node in STAGE_SCHEMAS.items():
        cs.store(name=f"{name}_schema", node=node)
    for group, options in GROUP_SCHEMAS.items():
        for name, node in options.items():
            cs.store(group=group, name=f"{name}_schema", node=node)
    _registered = True
