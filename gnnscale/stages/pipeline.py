"""`gnnscale pipeline`: every stage in order, skipping a stage whose output is already up to date."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import GraphDirError
from gnnscale.stages import build_csr, shard
from gnnscale.stages.common import make_run_dir, write_summary
from gnnscale.storage.meta import META_FILE
from gnnscale.utils.ui import info

STAGES = {"shard": shard.run, "build_csr": build_csr.run}


def _graph_state(cfg: DictConfig) -> dict | None:
    path = Path(cfg.graph_dir) / META_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _up_to_date(stage: str, cfg: DictConfig) -> bool:
    """A finished graph_dir built from the same data config is reused instead of rebuilt."""
    meta = _graph_state(cfg)
    if stage == "shard":
        if meta is None:
            return False
        if meta.get("source_fingerprint") == shard.source_fingerprint(cfg):
            return not cfg.overwrite
        if not cfg.overwrite:
            raise GraphDirError(
                f"graph_dir '{cfg.graph_dir}' holds a graph built from a different data config",
                "pass overwrite=true to rebuild it or choose another graph_dir=",
            )
        return False
    if stage == "build_csr":
        csc = (meta or {}).get("csc")
        return bool(csc) and csc.get("shard_sha256") == [s["sha256"] for s in meta["shards"]] and not cfg.overwrite
    return False


def run(cfg: DictConfig) -> dict:
    run_dir = make_run_dir(cfg, "pipeline")
    unknown = [s for s in cfg.stages if s not in STAGES]
    if unknown:
        from gnnscale.errors import ConfigError

        raise ConfigError(f"unknown pipeline stage(s) {unknown}", f"choose from {list(STAGES)}")
    results = {}
    for stage in cfg.stages:
        if _up_to_date(stage, cfg):
            info(f"[bold]{stage}[/bold]: {cfg.graph_dir} is up to date, skipped (overwrite=true rebuilds it)")
            results[stage] = {"skipped": True}
            continue
        info(f"[bold]== {stage} ==[/bold]")
        stage_cfg = OmegaConf.merge(cfg, {"run_dir": str(run_dir / stage)})
        results[stage] = STAGES[stage](stage_cfg)
    summary = {"stage": "pipeline", "graph_dir": str(cfg.graph_dir), "stages": results}
    write_summary(run_dir, summary)
    summary["run_dir"] = str(run_dir)
    return summary
