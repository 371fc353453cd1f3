"""What a pipeline run will do: which stages, each stage's own config, and what is up to date."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gnnscale.config.compose import overridden_keys
from gnnscale.config.schema import (
    BuildCscStageConfig,
    InferStageConfig,
    PartitionStageConfig,
    RecommendStageConfig,
    ShardStageConfig,
    TrainStageConfig,
)
from gnnscale.datasets import source_fingerprint
from gnnscale.errors import ConfigError, GraphDirError
from gnnscale.inference.job import check_options
from gnnscale.partition import check_method
from gnnscale.recommend.inputs import check_options as check_recommend_options
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.meta import META_FILE
from gnnscale.storage.run_dir import config_hash
from gnnscale.training.build import hashable_cfg
from gnnscale.training.options import check_train_cfg
from gnnscale.training.task_setup import task_name

ORDER = ("shard", "build_csr", "partition", "train", "infer", "recommend")
SCHEMAS = {
    "shard": ShardStageConfig,
    "build_csr": BuildCscStageConfig,
    "partition": PartitionStageConfig,
    "train": TrainStageConfig,
    "infer": InferStageConfig,
    "recommend": RecommendStageConfig,
}


def resolve_stages(cfg: DictConfig) -> list[str]:
    """cfg.stages, plus recommend after infer for task=link when the user left `stages` unset."""
    stages = list(cfg.stages)
    if task_name(cfg) == "link" and "stages" not in overridden_keys(cfg) and "recommend" not in stages:
        stages.append("recommend")
    return stages


def check_stages(cfg: DictConfig) -> list[str]:
    stages = resolve_stages(cfg)
    unknown = [s for s in stages if s not in ORDER]
    if unknown:
        raise ConfigError(f"unknown pipeline stage(s) {unknown}", f"choose from {list(ORDER)}")
    if stages != sorted(set(stages), key=ORDER.index):
        # infer reads train's checkpoint and train reads the graph: an out-of-order list cannot work.
        raise ConfigError(
            f"stages={stages} must name each stage once, in pipeline order",
            f"e.g. stages=[{','.join(ORDER[:-1])}] (task=link: then recommend)",
        )
    if "train" in stages and cfg.train.resume:
        raise ConfigError(
            "the pipeline resumes an interrupted train stage by itself; train.resume=true has no meaning here",
            "drop train.resume (or pass resume=RUN_DIR to continue a particular train run)",
        )
    if "recommend" in stages and task_name(cfg) != "link":
        raise ConfigError(
            f"stages={stages} has recommend, which needs a link-prediction model, but task={task_name(cfg)}",
            "add task=link (or +exp=sage_link), or drop recommend from stages",
        )
    if "infer" in stages and cfg.infer.changes:
        raise ConfigError(
            "the pipeline runs a full inference; infer.changes is for `gnnscale infer --update`",
            "drop infer.changes",
        )
    # A bad train or infer value fails now, not after the graph was built and the model trained.
    if "partition" in stages and partition_needed(cfg):
        check_method(cfg.sampler.method, "sampler.method")
        if int(cfg.sampler.num_parts) < 0:
            raise ConfigError(
                f"sampler.num_parts={cfg.sampler.num_parts} is negative", "use 0 (the default) or a count"
            )
    if "train" in stages:
        check_train_cfg(cfg)
    if "infer" in stages:
        check_options(cfg.infer)
    if "recommend" in stages:
        check_recommend_options(cfg.recommend)
    return stages


def partition_needed(cfg: DictConfig) -> bool:
    """Does the chosen sampler train on a partition (Cluster-GCN's clusters)?"""
    return cfg.sampler.kind == "cluster_gcn"


def partition_cfg(cfg: DictConfig, run_dir: str) -> DictConfig:
    """The partition stage's config in a pipeline: the partition the sampler will read (its method and
    num_parts, or nodes_per_part, resolved as the sampler does), partition.* the rest."""
    from gnnscale.sampling.cluster_gcn import ClusterGcnSampler

    s = cfg.sampler
    sampler = ClusterGcnSampler(s.num_parts, s.method, nodes_per_part=s.get("nodes_per_part", 0))
    method, num_parts = sampler.needs_partition(GraphDir(cfg.graph_dir).num_nodes)
    parts = {"method": method, "num_parts": num_parts}
    return stage_cfg(cfg, "partition", run_dir=run_dir, partition=parts)


def stage_cfg(cfg: DictConfig, stage: str, **values) -> DictConfig:
    """The config `gnnscale <stage>` would compose: only that stage's keys, so its config.yaml and hash match."""
    schema = SCHEMAS[stage]
    keys = [f.name for f in dataclasses.fields(schema) if f.name in cfg]
    return OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.masked_copy(cfg, keys), values)


def graph_up_to_date(stage: str, cfg: DictConfig) -> bool:
    """A finished graph_dir built from the same data config is reused instead of rebuilt."""
    path = Path(cfg.graph_dir) / META_FILE
    meta = json.loads(path.read_text()) if path.is_file() else None
    if stage == "shard":
        if meta is None:
            return False
        if meta.get("source_fingerprint") == source_fingerprint(cfg):
            return not cfg.overwrite
        if not cfg.overwrite:
            raise GraphDirError(
                f"graph_dir '{cfg.graph_dir}' holds a graph built from a different data config",
                "pass overwrite=true to rebuild it or choose another graph_dir=",
            )
        return False
    csc = (meta or {}).get("csc")
    return (
        bool(csc) and csc.get("shard_sha256") == [s["sha256"] for s in meta["shards"]] and not cfg.overwrite
    )


def stage_key(stage: str, scfg: DictConfig, graph_dir: str) -> dict:
    # train's own notion of "same run" (everything but where/whether it continues), plus the graph's content.
    shards = [s["sha256"] for s in GraphDir(graph_dir).meta["shards"]]
    return {"stage": stage, "config_hash": config_hash(hashable_cfg(scfg)), "graph_sha256": shards}
