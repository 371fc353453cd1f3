"""What `train dist=distdgl` accepts: checked before any process starts, each refusal one line with the fix."""

from __future__ import annotations

from omegaconf import DictConfig

from gnnscale.errors import ConfigError
from gnnscale.training.options import check_train_cfg
from gnnscale.training.phases import uses_phases

SAMPLERS = ("neighbor",)  # DistNodeDataLoader + dgl.dataloading.NeighborSampler
ARCHS = ("sage", "mlp")  # GCN's layer-wise inference needs graph-wide degrees the DistTensor pass lacks
BACKENDS = ("auto", "gloo")  # trainers run on CPU: DistNodeDataLoader samples on the CPU only


def check_distdgl_cfg(cfg: DictConfig) -> None:
    check_train_cfg(cfg)
    d, t = cfg.dist, cfg.train
    kind = cfg.sampler.kind
    if kind not in SAMPLERS:
        raise ConfigError(
            f"dist=distdgl trains with sampler=neighbor, not sampler={kind}",
            f"pass sampler=neighbor (supported: {', '.join(SAMPLERS)}), or train {kind} with dist=none / dist=ddp",
        )
    if cfg.model.arch not in ARCHS:
        raise ConfigError(
            f"dist=distdgl does not train model={cfg.model.arch}",
            f"pass model=sage (supported: {', '.join(ARCHS)}), or use dist=none / dist=ddp",
        )
    if cfg.model.get("degree_feature", False):
        raise ConfigError(
            "dist=distdgl does not train with model.degree_feature", "drop it, or use dist=none / dist=ddp"
        )
    if uses_phases(cfg):
        raise ConfigError("dist=distdgl does not run train.phases", "drop train.phases, or use dist=none")
    if cfg.get("resume") or t.resume:
        raise ConfigError(
            "dist=distdgl does not resume a run", "start a new run (another run_dir, or overwrite=true)"
        )
    if t.device == "cuda":
        raise ConfigError(
            "dist=distdgl trains on the CPU (DistNodeDataLoader samples there)", "pass train.device=cpu"
        )
    if t.num_workers > 0:
        raise ConfigError(
            "train.num_workers has no effect with dist=distdgl",
            "set dist.num_samplers=N for DistDGL's sampler processes instead",
        )
    if d.backend not in BACKENDS:
        raise ConfigError(
            f"dist.backend={d.backend!r} is not available with dist=distdgl", "pass dist.backend=gloo"
        )
    _at_least(d.num_trainers, 1, "dist.num_trainers", 2)
    _at_least(d.num_servers, 1, "dist.num_servers", 1)
    _at_least(d.num_samplers, 0, "dist.num_samplers", 0)
    _at_least(d.num_parts, 1, "dist.num_parts", 1)
    _at_least(d.timeout_s, 1, "dist.timeout_s", 300)
    if not 0 <= d.master_port < 65536:
        raise ConfigError(
            f"dist.master_port={d.master_port} is not a port", "pass 1..65535, or 0 for a free one"
        )
    if d.ip_config is None and d.machine_rank > 0:
        raise ConfigError(
            f"dist.machine_rank={d.machine_rank} without dist.ip_config",
            "pass dist.ip_config=FILE listing the machines",
        )


def _at_least(value: int, low: int, key: str, example: int) -> None:
    if int(value) < low:
        raise ConfigError(f"{key}={value} must be at least {low}", f"use e.g. {key}={example}")
