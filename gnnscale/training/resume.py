"""Which run a `train` continues, and a run_dir that is never silently mixed with another run."""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError, DataError
from gnnscale.storage.run_dir import CHECKPOINTS, METRICS, checkpoint_file, new_run_path, newest_run
from gnnscale.utils.ui import is_rank_zero


def resolve_resume(cfg: DictConfig) -> Path | None:
    """resume=RUN_DIR, or train.resume=true with run_dir= (default: the newest run under runs/train)."""
    if cfg.get("resume"):
        folder = Path(cfg.resume)
        if cfg.get("run_dir") and Path(cfg.run_dir).resolve() != folder.resolve():
            raise ConfigError(
                f"resume={cfg.resume} and run_dir={cfg.run_dir} disagree", "give only resume=RUN_DIR"
            )
    elif cfg.train.resume:
        folder = (
            Path(cfg.run_dir)
            if cfg.get("run_dir")
            else newest_run("train", lambda p: checkpoint_file(p).is_file())
        )
        if folder is None:
            raise DataError(
                "train.resume=true but no run under runs/train has checkpoints/last.pt", "pass resume=RUN_DIR"
            )
    else:
        return None
    if not checkpoint_file(folder).is_file():
        raise DataError(
            f"cannot resume: {checkpoint_file(folder)} does not exist",
            "point resume= at a train run_dir that finished at least one epoch",
        )
    return folder


def settle_run_dir(cfg: DictConfig, name_it: bool = False) -> tuple[DictConfig, Path | None]:
    """(cfg with run_dir set to the run being resumed, that run or None); refuses to start a second
    run in a run_dir that holds one unless overwrite=true. name_it: a new run gets its folder name now
    (the processes of a multi-process run must all use the one rank 0 picked)."""
    resume_dir = resolve_resume(cfg)
    if resume_dir is not None:
        return OmegaConf.merge(cfg, {"run_dir": str(resume_dir)}), resume_dir
    if cfg.get("run_dir") and checkpoint_file(cfg.run_dir).is_file() and not cfg.overwrite:
        raise ConfigError(
            f"run_dir '{cfg.run_dir}' already holds a training run",
            "pass train.resume=true to continue it, overwrite=true to start it again, or choose another run_dir",
        )
    if name_it and not cfg.get("run_dir"):
        cfg = OmegaConf.merge(cfg, {"run_dir": str(new_run_path("train"))})
    return cfg, None


def clear_previous_run(run_dir: Path) -> None:
    """overwrite=true: a fresh run, not a mix of two."""
    if is_rank_zero():
        shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
        (run_dir / METRICS).unlink(missing_ok=True)
