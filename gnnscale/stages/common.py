"""What every stage does around its work: its options, timing and peak memory (the run_dir itself:
storage/run_dir.py)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from gnnscale.utils.memory import MemorySampler, peak_rss_mb


def stage_options(cfg: DictConfig, key: str, schema: type, check: Callable[[DictConfig], None]) -> DictConfig:
    """cfg.<key> merged onto its schema (a config without that node, e.g. a pipeline's, runs with the
    defaults), then checked: a bad value exits 2 before anything is read."""
    opts = OmegaConf.merge(OmegaConf.structured(schema), cfg.get(key) or {})
    check(opts)
    return opts


class StageMeter:
    """Wall time and peak memory (RSS and anonymous) of a stage."""

    def __init__(self):
        self.sampler = MemorySampler()
        self.t0 = 0.0
        self.wall_s = 0.0

    def stats(self) -> dict:
        """Memory values that could not be read are None (JSON null), so no target passes on a 0."""

        def mb(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "wall_time_s": round(self.wall_s, 3),
            "peak_rss_mb": mb(self.sampler.peak_rss_mb),
            "peak_anon_mb": mb(self.sampler.peak_anon_mb),
            "max_rss_mb": mb(peak_rss_mb()),
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


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
