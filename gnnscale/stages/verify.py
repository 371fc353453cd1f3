"""`gnnscale verify`: every file a graph_dir's meta.json records (shards, CSC) checked, in a table.

verify=full (default here) re-hashes each file; verify=stamp re-hashes only those whose verification
stamp no longer matches. A missing or changed file: the table, then exit 2 naming it and the fix.
"""

from __future__ import annotations

import time

from omegaconf import DictConfig

from gnnscale.errors import ConfigError
from gnnscale.storage.lock import check_not_written
from gnnscale.storage.meta import read_meta
from gnnscale.storage.verify import check_files, check_mode, problem
from gnnscale.utils.ui import grid_table, info


def run(cfg: DictConfig) -> dict:
    mode = check_mode(cfg.verify)
    if mode == "off":
        raise ConfigError("verify=off checks nothing", "use verify=full (default) or verify=stamp")
    meta = read_meta(cfg.graph_dir)
    check_not_written(cfg.graph_dir)
    t0 = time.perf_counter()
    results = check_files(cfg.graph_dir, mode, meta=meta)
    wall = time.perf_counter() - t0
    grid_table(
        f"verify ({mode}): {cfg.graph_dir}",
        ["file", "written by", "bytes", "sha256 (meta.json)", "status", "s"],
        [
            [c.file, c.writer, f"{c.size:,}" if c.size is not None else "-", (c.recorded or "-")[:12],
             c.status, f"{c.seconds:.3f}"]
            for c in results
        ],
    )  # fmt: skip
    bad = [c for c in results if not c.ok]
    summary = {
        "stage": "verify",
        "graph_dir": str(cfg.graph_dir),
        "mode": mode,
        "files": [
            {"file": c.file, "status": c.status, "bytes": c.size, **({"dtype": c.dtype} if c.dtype else {})}
            for c in results
        ],
        "bytes": sum(c.size or 0 for c in results),
        "wall_time_s": round(wall, 4),
        "ok": not bad,
    }
    if bad:
        raise problem(bad[0], cfg.graph_dir)
    hashed = sum(c.status == "ok (hashed)" for c in results)
    info(f"verify: {len(results)} files match meta.json ({hashed} re-hashed) in {wall * 1000:.1f} ms")
    return summary
