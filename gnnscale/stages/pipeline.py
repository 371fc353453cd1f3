"""`gnnscale pipeline`: shard -> build-csr -> partition -> train -> infer (layer-wise) [-> recommend],
one command.

Each stage gets only its own keys (the config its own command would compose) and its own folder,
<run_dir>/<stage>/. A stage whose output is up to date is skipped:

- shard: graph_dir holds a graph built from the same data config (meta.json's source_fingerprint).
- build_csr: graph_dir/csc was built from the current shards (their sha256s).
- partition: runs only for a sampler that trains on one (sampler=cluster_gcn: sampler.method and
  sampler.num_parts); a partition made from the current CSC is reused. Otherwise it is left out.
- recommend: only for task=link, where it is a default stage (stages left unset): every node's top-K
  partners from infer's embeddings (recommend.*); task=node with recommend in stages is exit 2.
- train, infer, recommend: a pipeline run folder next to this one (runs/pipeline/* by default, including this
  run_dir if it is reused) holds a finished run of the stage with the same key, which is reused.
  The key is written to <stage run_dir>/pipeline_key.json before the stage starts: the hash of the
  stage's config (train: data, graph_dir, seed, model, sampler, precision, train.*; infer: infer.*
  and the train run it reads; recommend: recommend.* and the infer run it reads) and the sha256s of the
  graph's shards. So re-running costs nothing,
  and a model trained with another config or on another graph is never reused. A train run with the
  same key that was interrupted (checkpoints/last.pt but no summary.json) is resumed where it stopped.
- overwrite=true reuses nothing: it rebuilds graph_dir and trains and infers afresh.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError
from gnnscale.pipeline.plan import (
    check_stages,
    graph_up_to_date,
    partition_cfg,
    partition_needed,
    stage_cfg,
    stage_key,
)
from gnnscale.pipeline.report import headline, summary_rows
from gnnscale.stages import build_csr, infer, recommend, shard, train
from gnnscale.stages import partition as partition_stage
from gnnscale.storage.run_dir import (
    SUMMARY,
    claim_run,
    infer_finished,
    make_run_dir,
    previous_run,
    read_summary,
    recommend_finished,
    train_finished,
    train_interrupted,
    write_summary,
)
from gnnscale.utils.ui import info, summary_table


def _run_graph_stage(stage: str, cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    if graph_up_to_date(stage, cfg):
        info(f"[bold]{stage}[/bold]: {cfg.graph_dir} is up to date, skipped (overwrite=true rebuilds it)")
        return {"skipped": True, "graph_dir": str(cfg.graph_dir)}
    info(f"[bold]== {stage} ==[/bold]")
    fn = shard.run if stage == "shard" else build_csr.run
    return fn(stage_cfg(cfg, stage, run_dir=str(run_dir / stage)))


def _run_partition(cfg: DictConfig, run_dir: Path, results: dict) -> dict | None:
    """None (left out of the results) when the sampler needs no partition; reuses an up-to-date one."""
    if not partition_needed(cfg):
        info(f"[bold]partition[/bold]: not needed by sampler.kind={cfg.sampler.kind}, skipped")
        return None
    info("[bold]== partition ==[/bold]")
    summary = partition_stage.run(partition_cfg(cfg, str(run_dir / "partition")))
    return {**summary, "skipped": summary["reused"]}


# ---------------------------------------------------------------- train / infer: keys, reuse, resume
def _reused(stage: str, d: Path) -> dict:
    info(f"[bold]{stage}[/bold]: reusing {d} (same config and graph; overwrite=true reruns it)")
    return {**read_summary(d), "skipped": True, "run_dir": str(d)}


def _run_train(cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    if cfg.resume:  # an explicit run to continue: it stays where it is and is not keyed
        info(f"[bold]== train ==[/bold] (resuming {cfg.resume})")
        return train.run(stage_cfg(cfg, "train", run_dir=str(cfg.resume)))
    tcfg = stage_cfg(cfg, "train")
    key = stage_key("train", tcfg, cfg.graph_dir)
    if not cfg.overwrite:
        done = previous_run(run_dir.parent, "train", key, train_finished)
        if done is not None:
            return _reused("train", done)
        half = previous_run(run_dir.parent, "train", key, train_interrupted)
        if half is not None:
            info(f"[bold]== train ==[/bold] (resuming the interrupted run {half})")
            return train.run(OmegaConf.merge(tcfg, {"run_dir": str(half), "resume": str(half)}))
    own = run_dir / "train"
    claim_run(own, "train", key, cfg.overwrite)
    info("[bold]== train ==[/bold]")
    return train.run(OmegaConf.merge(tcfg, {"run_dir": str(own)}))


def _upstream(cfg: DictConfig, run_dir: Path, results: dict, stage: str, scfg, finished, then: str) -> str:
    """The run dir of `stage` that the next stage reads: this pipeline's, or (stage not among the stages)
    the finished one with the same key."""
    done = results.get(stage, {}).get("run_dir")
    if done is None:
        done = previous_run(run_dir.parent, stage, stage_key(stage, scfg, cfg.graph_dir), finished)
        if done is None:
            raise ConfigError(
                f"no finished {stage} run with this config and graph next to {run_dir}",
                f"add {stage} to stages, e.g. stages=[{stage},{then}]",
            )
    return str(Path(done).resolve())  # absolute: the key names the same run wherever it is seen from


def _keyed(stage: str, scfg: DictConfig, cfg: DictConfig, run_dir: Path, finished, fn, title: str) -> dict:
    """Reuse a finished run of `stage` with the same key, else run it in <run_dir>/<stage>."""
    key = stage_key(stage, scfg, cfg.graph_dir)
    if not cfg.overwrite:
        done = previous_run(run_dir.parent, stage, key, finished)
        if done is not None:
            return _reused(stage, done)
    own = run_dir / stage
    claim_run(own, stage, key, cfg.overwrite)
    info(f"[bold]== {title} ==[/bold]")
    return fn(OmegaConf.merge(scfg, {"run_dir": str(own)}))


def _infer_cfg(cfg: DictConfig, run_dir: Path, results: dict) -> DictConfig:
    tcfg = stage_cfg(cfg, "train")
    return stage_cfg(
        cfg, "infer", ckpt=_upstream(cfg, run_dir, results, "train", tcfg, train_finished, "infer")
    )


def _run_infer(cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    icfg = _infer_cfg(cfg, run_dir, results)
    return _keyed("infer", icfg, cfg, run_dir, infer_finished, infer.run, f"infer ({icfg.infer.mode})")


def _run_recommend(cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    icfg = None if "infer" in results else _infer_cfg(cfg, run_dir, results)  # infer's key, to find its run
    infer_dir = _upstream(cfg, run_dir, results, "infer", icfg, infer_finished, "recommend")
    rcfg = stage_cfg(cfg, "recommend", infer_dir=infer_dir)
    title = f"recommend (top-{rcfg.recommend.k})"
    return _keyed("recommend", rcfg, cfg, run_dir, recommend_finished, recommend.run, title)


# Each takes (cfg, pipeline run_dir, the results so far) and returns the stage's summary.
RUNNERS = {
    "shard": partial(_run_graph_stage, "shard"),
    "build_csr": partial(_run_graph_stage, "build_csr"),
    "partition": _run_partition,
    "train": _run_train,
    "infer": _run_infer,
    "recommend": _run_recommend,
}


# ---------------------------------------------------------------- entry point
def run(cfg: DictConfig) -> dict:
    stages = check_stages(cfg)  # before make_run_dir: a typo leaves no empty run folder behind
    run_dir = make_run_dir(cfg, "pipeline")
    results: dict[str, dict] = {}
    wall: dict[str, float] = {}
    t_start = time.perf_counter()
    for stage in stages:
        t0 = time.perf_counter()
        result = RUNNERS[stage](cfg, run_dir, results)
        if result is not None:  # None: a stage this config does not need (partition without cluster_gcn)
            results[stage] = result
            wall[stage] = round(time.perf_counter() - t0, 3)
    wall["total"] = round(time.perf_counter() - t_start, 3)
    summary = {
        "stage": "pipeline",
        "graph_dir": str(cfg.graph_dir),
        "stages": results,
        "wall_time_s": wall,
        "headline": headline(cfg, results),
    }
    write_summary(run_dir, summary)
    summary_table(f"pipeline: {' -> '.join(results)}", summary_rows(summary))
    info(f"summary: {run_dir / SUMMARY}")
    return {**summary, "run_dir": str(run_dir)}
