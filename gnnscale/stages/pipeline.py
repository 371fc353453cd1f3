"""`gnnscale pipeline`: shard -> build-csr -> train -> infer (layer-wise), one command.

Each stage gets only its own keys (the config its own command would compose) and its own folder,
<run_dir>/<stage>/. A stage whose output is up to date is skipped:

- shard: graph_dir holds a graph built from the same data config (meta.json's source_fingerprint).
- build_csr: graph_dir/csc was built from the current shards (their sha256s).
- train, infer: a pipeline run folder next to this one (runs/pipeline/* by default, including this
  run_dir if it is reused) holds a finished run of the stage with the same key, which is reused.
  The key is written to <stage run_dir>/pipeline_key.json before the stage starts: the hash of the
  stage's config (train: data, graph_dir, seed, model, sampler, precision, train.*; infer: infer.*
  and the train run it reads) and the sha256s of the graph's shards. So re-running costs nothing,
  and a model trained with another config or on another graph is never reused. A train run with the
  same key that was interrupted (checkpoints/last.pt but no summary.json) is resumed where it stopped.
- overwrite=true reuses nothing: it rebuilds graph_dir and trains and infers afresh.
"""

from __future__ import annotations

import dataclasses
import json
import time
from functools import partial
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from gnnscale.config.schema import BuildCscStageConfig, InferStageConfig, ShardStageConfig, TrainStageConfig
from gnnscale.errors import ConfigError, GraphDirError
from gnnscale.stages import build_csr, infer, shard, train
from gnnscale.stages.common import config_hash, make_run_dir, write_summary
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.meta import META_FILE
from gnnscale.training.options import check_train_cfg
from gnnscale.utils.atomic import write_json
from gnnscale.utils.ui import info, summary_table

ORDER = ("shard", "build_csr", "train", "infer")
SCHEMAS = {
    "shard": ShardStageConfig,
    "build_csr": BuildCscStageConfig,
    "train": TrainStageConfig,
    "infer": InferStageConfig,
}
KEY_FILE = "pipeline_key.json"
SUMMARY = "summary.json"


# ---------------------------------------------------------------- checks and per-stage configs
def check_stages(cfg: DictConfig) -> list[str]:
    stages = list(cfg.stages)
    unknown = [s for s in stages if s not in ORDER]
    if unknown:
        raise ConfigError(f"unknown pipeline stage(s) {unknown}", f"choose from {list(ORDER)}")
    if stages != sorted(set(stages), key=ORDER.index):
        # infer reads train's checkpoint and train reads the graph: an out-of-order list cannot work.
        raise ConfigError(
            f"stages={stages} must name each stage once, in pipeline order",
            f"e.g. stages=[{','.join(ORDER)}]",
        )
    if "train" in stages and cfg.train.resume:
        raise ConfigError(
            "the pipeline resumes an interrupted train stage by itself; train.resume=true has no meaning here",
            "drop train.resume (or pass resume=RUN_DIR to continue a particular train run)",
        )
    if "infer" in stages and cfg.infer.changes:
        raise ConfigError(
            "the pipeline runs a full inference; infer.changes is for `gnnscale infer --update`",
            "drop infer.changes",
        )
    # A bad train or infer value fails now, not after the graph was built and the model trained.
    if "train" in stages:
        check_train_cfg(cfg)
    if "infer" in stages:
        infer._check_options(cfg.infer)
    return stages


def stage_cfg(cfg: DictConfig, stage: str, **values) -> DictConfig:
    """The config `gnnscale <stage>` would compose: only that stage's keys, so its config.yaml and hash match."""
    schema = SCHEMAS[stage]
    keys = [f.name for f in dataclasses.fields(schema) if f.name in cfg]
    return OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.masked_copy(cfg, keys), values)


# ---------------------------------------------------------------- shard / build_csr
def _graph_up_to_date(stage: str, cfg: DictConfig) -> bool:
    """A finished graph_dir built from the same data config is reused instead of rebuilt."""
    path = Path(cfg.graph_dir) / META_FILE
    meta = json.loads(path.read_text()) if path.is_file() else None
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
    csc = (meta or {}).get("csc")
    return (
        bool(csc) and csc.get("shard_sha256") == [s["sha256"] for s in meta["shards"]] and not cfg.overwrite
    )


def _run_graph_stage(stage: str, cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    if _graph_up_to_date(stage, cfg):
        info(f"[bold]{stage}[/bold]: {cfg.graph_dir} is up to date, skipped (overwrite=true rebuilds it)")
        return {"skipped": True, "graph_dir": str(cfg.graph_dir)}
    info(f"[bold]== {stage} ==[/bold]")
    fn = shard.run if stage == "shard" else build_csr.run
    return fn(stage_cfg(cfg, stage, run_dir=str(run_dir / stage)))


# ---------------------------------------------------------------- train / infer: keys, reuse, resume
def _key(stage: str, scfg: DictConfig, graph_dir: str) -> dict:
    # train's own notion of "same run" (everything but where/whether it continues), plus the graph's content.
    shards = [s["sha256"] for s in GraphDir(graph_dir).meta["shards"]]
    return {"stage": stage, "config_hash": config_hash(train._hashable_cfg(scfg)), "graph_sha256": shards}


def _finished(stage: str, d: Path) -> Path | None:
    """The file whose presence (and mtime) marks a finished run of `stage` in d."""
    summary = d / SUMMARY
    if not summary.is_file():
        return None
    if stage == "train":  # a reused model must still be there for infer to read
        ckpt = (_read_json(summary) or {}).get("checkpoint")
        return summary if ckpt and Path(ckpt).is_file() else None
    done = all((d / f).is_file() for f in (infer.EMB_INFO, "embeddings.npy", "predictions.npy"))
    return summary if done else None


def _resumable(stage: str, d: Path) -> Path | None:
    last = d / "checkpoints" / "last.pt"
    return last if stage == "train" and not (d / SUMMARY).is_file() and last.is_file() else None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _previous(
    run_dir: Path, stage: str, key: dict, marker: Callable[[str, Path], Path | None]
) -> Path | None:
    """The newest stage folder of a pipeline run next to run_dir with this key whose `marker` file exists."""
    hits = []
    for f in run_dir.parent.glob(f"*/{stage}/{KEY_FILE}"):
        if _read_json(f) != key:
            continue
        m = marker(stage, f.parent)
        if m is not None:
            hits.append((m.stat().st_mtime, f.parent))
    return max(hits)[1] if hits else None


def _reused(stage: str, d: Path) -> dict:
    info(f"[bold]{stage}[/bold]: reusing {d} (same config and graph; overwrite=true reruns it)")
    return {**json.loads((d / SUMMARY).read_text()), "skipped": True, "run_dir": str(d)}


def _claim(stage: str, own: Path, key: dict, overwrite: bool) -> None:
    """Mark own as this key's run, refusing to mix two configs' results in one folder."""
    key_file = own / KEY_FILE
    if key_file.is_file() and not overwrite and _read_json(key_file) != key:
        raise ConfigError(
            f"run_dir '{own.parent}' already holds a pipeline run whose {stage} stage had another config or graph",
            "leave run_dir unset (a fresh runs/pipeline/<time>), choose another run_dir=, or pass overwrite=true",
        )
    own.mkdir(parents=True, exist_ok=True)
    # A stale summary from an earlier attempt must not make this run look finished if it is killed.
    (own / SUMMARY).unlink(missing_ok=True)
    write_json(key_file, key)


def _run_train(cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    if cfg.resume:  # an explicit run to continue: it stays where it is and is not keyed
        info(f"[bold]== train ==[/bold] (resuming {cfg.resume})")
        return train.run(stage_cfg(cfg, "train", run_dir=str(cfg.resume)))
    tcfg = stage_cfg(cfg, "train")
    key = _key("train", tcfg, cfg.graph_dir)
    if not cfg.overwrite:
        done = _previous(run_dir, "train", key, _finished)
        if done is not None:
            return _reused("train", done)
        half = _previous(run_dir, "train", key, _resumable)
        if half is not None:
            info(f"[bold]== train ==[/bold] (resuming the interrupted run {half})")
            return train.run(OmegaConf.merge(tcfg, {"run_dir": str(half), "resume": str(half)}))
    own = run_dir / "train"
    _claim("train", own, key, cfg.overwrite)
    info("[bold]== train ==[/bold]")
    return train.run(OmegaConf.merge(tcfg, {"run_dir": str(own)}))


def _run_infer(cfg: DictConfig, run_dir: Path, results: dict) -> dict:
    train_dir = results.get("train", {}).get("run_dir")
    if train_dir is None:  # train not among the stages: the model this config trains, if it ever finished
        tkey = _key("train", stage_cfg(cfg, "train"), cfg.graph_dir)
        train_dir = _previous(run_dir, "train", tkey, _finished)
        if train_dir is None:
            raise ConfigError(
                f"no finished train run with this config and graph next to {run_dir}",
                "add train to stages, e.g. stages=[train,infer]",
            )
    # An absolute ckpt: the key names the same train run wherever it is seen from.
    icfg = stage_cfg(cfg, "infer", ckpt=str(Path(train_dir).resolve()))
    key = _key("infer", icfg, cfg.graph_dir)
    if not cfg.overwrite:
        done = _previous(run_dir, "infer", key, _finished)
        if done is not None:
            return _reused("infer", done)
    own = run_dir / "infer"
    _claim("infer", own, key, cfg.overwrite)
    info(f"[bold]== infer ({icfg.infer.mode}) ==[/bold]")
    return infer.run(OmegaConf.merge(icfg, {"run_dir": str(own)}))


# Each takes (cfg, pipeline run_dir, the results so far) and returns the stage's summary.
RUNNERS = {
    "shard": partial(_run_graph_stage, "shard"),
    "build_csr": partial(_run_graph_stage, "build_csr"),
    "train": _run_train,
    "infer": _run_infer,
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
        results[stage] = RUNNERS[stage](cfg, run_dir, results)
        wall[stage] = round(time.perf_counter() - t0, 3)
    wall["total"] = round(time.perf_counter() - t_start, 3)
    summary = {
        "stage": "pipeline",
        "graph_dir": str(cfg.graph_dir),
        "stages": results,
        "wall_time_s": wall,
        "headline": _headline(cfg, results),
    }
    write_summary(run_dir, summary)
    _report(summary, run_dir)
    summary["run_dir"] = str(run_dir)
    return summary


# ---------------------------------------------------------------- report
def _headline(cfg: DictConfig, results: dict) -> dict:
    """The numbers a user looks for after a pipeline run, from the stages' own summaries."""
    out: dict = {}
    meta_path = Path(cfg.graph_dir) / META_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        out.update(graph=meta["name"], num_nodes=meta["num_nodes"], num_edges=meta["num_edges"])
    tr = results.get("train")
    if tr:
        metric = tr["metric"]
        out.update(
            model=tr["model"],
            fanouts=tr["fanouts"],
            epochs_run=tr["epochs_run"],
            early_stopped=tr["early_stopped"],
            metric=metric,
            train_test=tr.get(f"test_{metric}"),
            train_run_dir=tr["run_dir"],
        )
    inf = results.get("infer")
    if inf:
        out.update(
            infer_mode=inf["mode"],
            infer_test_acc=inf.get("test_acc"),
            embeddings=str(Path(inf["run_dir"]) / "embeddings.npy"),
            embeddings_shape=inf["embeddings"]["shape"],
            infer_run_dir=inf["run_dir"],
        )
    return out


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _report(summary: dict, run_dir: Path) -> None:
    h, results = summary["headline"], summary["stages"]
    rows: dict = {}
    if "graph" in h:
        rows["graph"] = f"{h['graph']} ({summary['graph_dir']})"
        rows["nodes / edges"] = f"{h['num_nodes']:,} / {h['num_edges']:,}"
    if "model" in h:
        m = h["model"]
        rows["model"] = f"{m['arch']} {m['num_layers']}x{m['hidden']}, fanouts {h['fanouts']}"
        rows["epochs run"] = f"{h['epochs_run']}{' (early stop)' if h['early_stopped'] else ''}"
        rows[f"test {h['metric']} (train, sampled)"] = _fmt(h["train_test"])
    if "infer_mode" in h:
        rows[f"test acc (infer, {h['infer_mode']})"] = _fmt(h["infer_test_acc"])
        rows["embeddings"] = f"{h['embeddings']} ({' x '.join(map(str, h['embeddings_shape']))})"
    wall = summary["wall_time_s"]
    times = [f"{s} {'reused' if results[s].get('skipped') else format(wall[s], '.1f')}" for s in results]
    rows["wall time (s)"] = " · ".join([*times, f"total {wall['total']:.1f}"])
    summary_table(f"pipeline: {' -> '.join(results)}", rows)
    info(f"summary: {run_dir / SUMMARY}")
