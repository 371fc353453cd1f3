"""The run_dir layout, owned here alone: file names, creation, newest-run lookup, summaries, metrics.

runs/<stage>/<YYYYmmdd-HHMMSS>/      (or run_dir=PATH)
  config.yaml      the resolved config          summary.json   the stage's result
  metrics.jsonl    one JSON object per epoch    checkpoints/   last.pt, best.pt (train)
  emb_info.json    what embeddings.npy holds (infer; written last: marks a finished run)
  layers/          every layer's output (infer, for --update)
  sampler/         what a training sampler pre-computed (e.g. GraphSAINT's normalisation), reused on resume
  pipeline_key.json  what a pipeline stage folder was run with (its reuse key)
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError
from gnnscale.utils.atomic import append_jsonl, write_json, write_text
from gnnscale.utils.ui import is_rank_zero

RUNS_ROOT = Path("runs")
CONFIG, SUMMARY, METRICS = "config.yaml", "summary.json", "metrics.jsonl"
CHECKPOINTS, LAST, BEST = "checkpoints", "last.pt", "best.pt"
EMB_INFO, EMBEDDINGS, PREDICTIONS, LAYERS = "emb_info.json", "embeddings.npy", "predictions.npy", "layers"
KEY_FILE = "pipeline_key.json"
SAMPLER_CACHE = "sampler"


def config_hash(node) -> str:
    """A stable short hash of a config subtree (what produced an artifact)."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def new_run_path(stage: str) -> Path:
    """runs/<stage>/<timestamp>, suffixed -1, -2 ... when taken (not created)."""
    base = RUNS_ROOT / stage / datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir, k = base, 1
    while run_dir.exists():
        run_dir, k = Path(f"{base}-{k}"), k + 1
    return run_dir


def make_run_dir(cfg: DictConfig, stage: str) -> Path:
    """cfg.run_dir if set, else runs/<stage>/<timestamp>; created with the resolved config inside."""
    run_dir = Path(cfg.run_dir) if cfg.get("run_dir") else new_run_path(stage)
    if is_rank_zero():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / CONFIG, OmegaConf.to_yaml(cfg, resolve=True))
    return run_dir


# ---------------------------------------------------------------- what a run folder holds
def checkpoint_file(run_dir: str | Path, name: str = LAST) -> Path:
    return Path(run_dir) / CHECKPOINTS / name


def has_checkpoint(run_dir: Path) -> bool:
    return any(checkpoint_file(run_dir, n).is_file() for n in (BEST, LAST))


def train_finished(run_dir: Path) -> bool:
    """A train run whose summary exists and whose model is still there for infer to read."""
    ckpt = (read_summary(run_dir) or {}).get("checkpoint")
    return bool(ckpt) and Path(ckpt).is_file()


def train_interrupted(run_dir: Path) -> bool:
    """Killed after at least one epoch: resumable from last.pt."""
    return not (run_dir / SUMMARY).is_file() and checkpoint_file(run_dir).is_file()


def infer_finished(run_dir: Path) -> bool:
    """summary.json, emb_info.json, the embeddings and (not for a link model: no classes) predictions."""
    if not all((run_dir / f).is_file() for f in (SUMMARY, EMB_INFO, EMBEDDINGS)):
        return False
    return (run_dir / PREDICTIONS).is_file() or (read_json(run_dir / EMB_INFO) or {}).get("task") == "link"


def recommend_finished(run_dir: Path) -> bool:
    """summary.json (written last) and every output file it lists."""
    summary = read_summary(run_dir)
    return bool(summary) and all((run_dir / f).is_file() for f in summary.get("files", []))


def keeps_layers(emb_info: dict) -> bool:
    """emb_info.json of a layer-wise infer run that kept its layers (what --update starts from)."""
    return emb_info.get("mode") == "layerwise" and bool(emb_info.get("cache"))


def cached_layerwise(run_dir: Path) -> bool:
    return keeps_layers(read_json(run_dir / EMB_INFO) or {})


def newest_run(stage: str, usable: Callable[[Path], bool], root: Path | None = None) -> Path | None:
    """The newest run folder of `stage` (timestamp names sort by start time) for which usable(folder)."""
    base = (root or RUNS_ROOT) / stage
    runs = [p for p in sorted(base.glob("*")) if p.is_dir() and usable(p)]
    return runs[-1] if runs else None


def newest_or_fail(stage: str, usable: Callable[[Path], bool], what: str, hint: str) -> Path:
    """newest_run(stage, usable) for a stage that reads it by default; ConfigError (exit 2) when none."""
    newest = newest_run(stage, usable)
    if newest is None:
        raise ConfigError(f"no {stage} run with {what} under {RUNS_ROOT / stage}/", hint)
    return newest


def find_checkpoint(spec: str | Path | None) -> Path:
    """ckpt= may name a checkpoint file, a train run_dir, or its checkpoints/ folder; None = newest run."""
    if not spec:
        spec = newest_or_fail(
            "train",
            has_checkpoint,
            "a checkpoint",
            "pass ckpt=PATH (a .pt file or a train run_dir) or run `gnnscale train` first",
        )
    path = Path(spec)
    if path.is_dir():
        for folder in (path / CHECKPOINTS, path):
            for name in (BEST, LAST):  # best on validation first: that is the model a user means
                if (folder / name).is_file():
                    return folder / name
        raise ConfigError(
            f"'{path}' holds no checkpoints/best.pt or checkpoints/last.pt",
            "pass ckpt= a train run_dir or a .pt file",
        )
    if not path.is_file():
        raise ConfigError(
            f"checkpoint '{path}' does not exist",
            "pass ckpt= a .pt file or a train run_dir (default: the newest under runs/train)",
        )
    return path


def has_embeddings(run_dir: Path) -> bool:
    """An infer run that finished writing every node's embeddings (emb_info.json is written last)."""
    return (run_dir / EMBEDDINGS).is_file() and (run_dir / EMB_INFO).is_file()


def find_embeddings(spec: str | Path | None) -> tuple[Path, dict | None]:
    """emb= / infer_dir= may name an embeddings .npy or an infer run_dir; None = the newest infer run.
    Returns the .npy and the emb_info.json describing it (None when the file has none beside it)."""
    if not spec:
        spec = newest_or_fail(
            "infer",
            has_embeddings,
            "embeddings",
            "pass infer_dir= an infer run_dir (or emb= an embeddings .npy), or run `gnnscale infer` first",
        )
    path = Path(spec)
    if path.is_dir():
        if not (path / EMBEDDINGS).is_file():
            raise ConfigError(
                f"'{path}' holds no {EMBEDDINGS}",
                "pass infer_dir= a finished `gnnscale infer` run_dir, or emb= an embeddings .npy file",
            )
        return path / EMBEDDINGS, read_json(path / EMB_INFO)
    if not path.is_file():
        raise ConfigError(
            f"embeddings '{path}' do not exist",
            "pass emb= an embeddings .npy or an infer run_dir (default: the newest under runs/infer)",
        )
    info = read_json(path.parent / EMB_INFO)
    return path, info if info and info.get("file") == path.name else None


# ---------------------------------------------------------------- summaries and metrics
def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_summary(run_dir: str | Path) -> dict | None:
    return read_json(Path(run_dir) / SUMMARY)


def write_summary(run_dir: str | Path, summary: dict) -> None:
    if is_rank_zero():
        write_json(Path(run_dir) / SUMMARY, summary)


def append_metrics(run_dir: Path, record: dict) -> None:
    append_jsonl(run_dir / METRICS, record)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(run_dir: Path, last_epoch: int) -> None:
    """Drop metric lines past the checkpoint (an epoch that ran but whose last.pt was never written)."""
    if (run_dir / METRICS).is_file():
        keep = [r for r in read_metrics(run_dir) if r.get("epoch", 0) <= last_epoch]
        write_text(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in keep))


# ---------------------------------------------------------------- pipeline stage folders
def previous_run(parent: Path, stage: str, key: dict, usable: Callable[[Path], bool]) -> Path | None:
    """The most recently finished `stage` folder of a pipeline run under parent with this key."""
    hits = []
    for f in parent.glob(f"*/{stage}/{KEY_FILE}"):
        if read_json(f) == key and usable(f.parent):
            marker = f.parent / SUMMARY if (f.parent / SUMMARY).is_file() else checkpoint_file(f.parent)
            hits.append((marker.stat().st_mtime, f.parent))
    return max(hits)[1] if hits else None


def claim_run(folder: Path, stage: str, key: dict, overwrite: bool) -> None:
    """Mark folder as this key's run, refusing to mix two configs' results in one folder."""
    key_file = folder / KEY_FILE
    if key_file.is_file() and not overwrite and read_json(key_file) != key:
        raise ConfigError(
            f"run_dir '{folder.parent}' already holds a pipeline run whose {stage} stage had another config or graph",
            "leave run_dir unset (a fresh runs/pipeline/<time>), choose another run_dir=, or pass overwrite=true",
        )
    folder.mkdir(parents=True, exist_ok=True)
    # A stale summary from an earlier attempt must not make this run look finished if it is killed.
    (folder / SUMMARY).unlink(missing_ok=True)
    write_json(key_file, key)
