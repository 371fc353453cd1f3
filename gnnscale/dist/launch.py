"""Start the N processes of `dist=ddp` on this machine with torchrun's machinery (torch.distributed's
elastic launcher: the same agent `torchrun` runs), and turn a lost rank into one line.

The agent watches its workers; when one dies it stops the others and reports, so a killed rank ends
the whole job in seconds instead of leaving the rest blocked in an all-reduce.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from typing import Callable

from gnnscale.errors import ConfigError, RankFailedError

# What a worker that failed on bad input exits with (it printed its own one-line error).
USER_ERROR_EXIT = 2


def check_ddp_cfg(dist_cfg, device_type: str) -> None:
    from gnnscale.dist.comm import check_compression
    from gnnscale.dist.split import check_split

    check_split(dist_cfg.split)
    check_compression(dist_cfg.grad_compression)
    if int(dist_cfg.nproc) < 1:
        raise ConfigError(f"dist.nproc={dist_cfg.nproc} must be at least 1", "e.g. dist.nproc=2")
    if int(dist_cfg.local_steps) < 1:
        raise ConfigError(f"dist.local_steps={dist_cfg.local_steps} must be at least 1", "1 = every step")
    if dist_cfg.grad_compression == "powersgd" and int(dist_cfg.powersgd_start_iter) < 2:
        raise ConfigError(
            "dist.powersgd_start_iter must be at least 2 (PowerSGD's error feedback needs two plain steps)",
            "leave it at 2",
        )
    if dist_cfg.backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(
            f"dist.backend={dist_cfg.backend} is not auto, gloo or nccl", "use dist.backend=auto"
        )
    if device_type == "cuda":
        import torch

        if int(dist_cfg.nproc) > torch.cuda.device_count():
            raise ConfigError(
                f"dist.nproc={dist_cfg.nproc} but this machine has {torch.cuda.device_count()} GPUs",
                "use one process per GPU, or train.device=cpu",
            )


def launch(entry: Callable, args: tuple, nproc: int, port: int = 0, threads_per_rank: int = 1):
    """Run entry(*args) in `nproc` ranks; rank 0's return value. A failed rank raises RankFailedError."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.root.manager.loggerDict):  # the agent's INFO / WARNING / ERROR chatter
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=int(nproc),
        run_id=f"gnnscale-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{int(port)}",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
    )
    try:
        results = elastic_launch(config, entry)(*args)
    except ChildFailedError as exc:
        raise _lost_rank(exc.failures) from None
    except SignalException:  # Ctrl-C / SIGTERM reached the launcher: the agent has stopped the ranks
        raise KeyboardInterrupt from None
    return results[0]


def _lost_rank(failures: dict) -> RankFailedError:
    """The failure that caused the others: a rank killed by a signal, else the one that failed first."""
    rank, failure = min(failures.items(), key=lambda kv: (kv[1].exitcode >= 0, kv[1].timestamp, kv[0]))
    if failure.exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-failure.exitcode}"
        return RankFailedError(f"rank {rank} (pid {failure.pid}) {how}; the other ranks were stopped")
    if failure.exitcode == USER_ERROR_EXIT:
        return RankFailedError(f"rank {rank} stopped on bad input", exit_code=USER_ERROR_EXIT, reported=True)
    return RankFailedError(f"rank {rank} (pid {failure.pid}) failed with exit code {failure.exitcode}")


def launch_ranks(cfg, run: Callable) -> dict:
    """`gnnscale train dist=ddp`: dist.nproc ranks on this machine, each calling run(cfg), all in one run
    folder named here; rank 0's summary. A lost rank is one line saying how to resume."""
    from omegaconf import OmegaConf

    from gnnscale.storage.run_dir import checkpoint_file
    from gnnscale.training.resume import settle_run_dir
    from gnnscale.utils.ui import info

    cfg, _ = settle_run_dir(cfg, name_it=True)
    nproc = int(cfg.dist.nproc)
    info(f"train: starting {nproc} processes (dist=ddp, split {cfg.dist.split}) -> {cfg.run_dir}")
    payload = OmegaConf.to_container(cfg, resolve=True)
    try:
        threads = max(1, len(os.sched_getaffinity(0)) // nproc)
        return launch(rank_entry, (run, payload), nproc, int(cfg.dist.master_port), threads)
    except RankFailedError as exc:
        if not exc.reported and checkpoint_file(cfg.run_dir).is_file():
            exc.hint = f"re-run with resume={cfg.run_dir} to continue from its last checkpoint"
        raise


def rank_entry(run: Callable, payload: dict):
    """One rank: run(cfg); bad input is one line and USER_ERROR_EXIT (the launcher says no more)."""
    from omegaconf import OmegaConf

    from gnnscale.errors import GnnscaleError
    from gnnscale.utils.ui import err_console

    try:
        return run(OmegaConf.create(payload))
    except GnnscaleError as exc:
        err_console.print(f"error: rank {os.environ.get('RANK')}: {exc.one_line()}", markup=False)
        sys.exit(USER_ERROR_EXIT)
