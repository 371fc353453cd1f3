"""What every stage does around its work: run_dir, resolved config, timing, peak memory, summary."""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gnnscale.utils.atomic import write_json, write_text
from gnnscale.utils.memory import MemorySampler, peak_rss_mb
from gnnscale.utils.ui import is_rank_zero


def config_hash(node) -> str:
    """A stable short hash of a config subtree (what produced an artifact)."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_run_dir(cfg: DictConfig, stage: str) -> Path:
    """cfg.run_dir if set, else runs/<stage>/<timestamp>; created with the resolved config inside."""
    if cfg.get("run_dir"):
        run_dir = Path(cfg.run_dir)
    else:
        base = Path("runs") / stage / datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir, k = base, 1
        while run_dir.exists():
            run_dir, k = Path(f"{base}-{k}"), k + 1
    if is_rank_zero():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return run_dir


class StageMeter:
    """Wall time and peak memory (RSS and anonymous) of a stage."""

    def __init__(self):
        self.sampler = MemorySampler()
        self.t0 = 0.0
        self.wall_s = 0.0

    def stats(self) -> dict:
        return {
            "wall_time_s": round(self.wall_s, 3),
            "peak_rss_mb": round(max(self.sampler.peak_rss_mb, 0.0), 1),
            "peak_anon_mb": round(self.sampler.peak_anon_mb, 1),
            "max_rss_mb": round(peak_rss_mb(), 1),
        }


@contextmanager
def metered():
    meter = StageMeter()
    meter.t0 = time.time()
    with meter.sampler:
        try:
            yield meter
        finally:
            meter.wall_s = time.time() - meter.t0


def write_summary(run_dir: Path, summary: dict) -> None:
    if is_rank_zero():
        write_json(Path(run_dir) / "summary.json", summary)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
