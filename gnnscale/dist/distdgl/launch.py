"""`gnnscale train dist=distdgl`: start this machine's DistDGL servers and trainers, watch them, report.

One machine (no dist.ip_config): a one-part partition of graph_dir (made on first use), servers and
`dist.num_trainers` trainers on 127.0.0.1 with free ports — no ssh, no launch script. Several machines
(dist.ip_config=FILE, one line per machine, one partition each): every machine runs the same command with
its own dist.machine_rank (printed here, exactly); a machine finds its rank from its own addresses when
it is not given, and a machine that is not listed only prints the commands. Machine 0 holds trainer
rank 0 and so the run_dir. The processes get their settings as DGL's launch tool gives them: DGL_*
environment variables for DistDGL, RANK / WORLD_SIZE / MASTER_* for the trainers' gloo group.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import gnnscale
from gnnscale.dist.distdgl.config import check_distdgl_cfg
from gnnscale.dist.distdgl.hosts import (
    TORCH_DEFAULT_PORT,
    Machine,
    find_machine_rank,
    free_port,
    interface_of,
    machine_commands,
    read_ip_config,
    write_ip_config,
)
from gnnscale.dist.distdgl.partition import current_distdgl_report, ensure_distdgl_partition, part_config_path
from gnnscale.dist.distdgl.procs import MachineLock, ProcessGroup, python_argv
from gnnscale.dist.distdgl.report import compose_summary, few_labels_line
from gnnscale.dist.distdgl.trainer import RESULT
from gnnscale.errors import ConfigError, DataError
from gnnscale.models import model_signature, signature_hash
from gnnscale.storage.csc import open_csc
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import config_hash, make_run_dir
from gnnscale.tasks.metrics import class_weights
from gnnscale.training.build import hashable_cfg
from gnnscale.training.options import apply_few_labels
from gnnscale.training.resume import clear_previous_run, settle_run_dir
from gnnscale.utils.ui import console, info, is_rank_zero

JOB_DIR = "distdgl_job"


def run_train(cfg: DictConfig) -> dict:
    t0 = time.perf_counter()
    check_distdgl_cfg(cfg)
    d = cfg.dist
    graph = GraphDir(cfg.graph_dir)
    open_csc(graph)  # no CSC: "run gnnscale build-csr first", before anything starts
    labels, train_ids = _labelled_train(graph)
    cfg, applied, kept = apply_few_labels(cfg, len(train_ids))
    machines = read_ip_config(d.ip_config) if d.ip_config else None
    part_config, name = resolve_partition(cfg, graph, machines)
    if machines is None:
        machines, rank = [Machine("127.0.0.1", free_port(int(d.num_servers)))], 0
        master_port = int(d.master_port) or free_port()
    else:
        master_port = int(d.master_port) or TORCH_DEFAULT_PORT
        commands = machine_commands(
            user_overrides(cfg), Path(d.ip_config).resolve(), part_config, master_port, len(machines)
        )
        say_commands(commands, machines)
        rank = find_machine_rank(machines, int(d.machine_rank))
        if rank is None:
            info("distdgl: no address of this machine is in dist.ip_config: nothing started here")
            return {"stage": "train", "dist": "distdgl", "started": False, "commands": commands}
    if rank == 0:
        cfg, _ = settle_run_dir(cfg)  # refuses a run_dir that holds a run unless overwrite=true
    if applied:
        info(few_labels_line(cfg, len(train_ids), applied, kept))
    with MachineLock(name):
        # Machine 0 runs trainer rank 0, the one that writes: the run_dir is there. The others keep the
        # trainers' config and logs in a folder of their own.
        work = make_run_dir(cfg, "train") if rank == 0 else Path(tempfile.mkdtemp(prefix="gnnscale-distdgl-"))
        if rank == 0:
            clear_previous_run(work)
            (work / RESULT).unlink(missing_ok=True)  # overwrite=true: never report the previous run's result
        job = _write_job(cfg, graph, work, rank, machines, part_config, name, labels, train_ids)
        info(
            f"distdgl: machine {rank} of {len(machines)}: {d.num_servers} server(s), {d.num_trainers} trainer(s)"
            f" on partition {part_config} · logs {work / 'logs'}"
        )
        _run_machine(cfg, work, job, rank, machines, part_config, master_port)
    if rank != 0:  # done well: nothing in its folder is needed any more
        shutil.rmtree(work, ignore_errors=True)
        info(f"distdgl: machine {rank} done (the results are on machine 0)")
        return {"stage": "train", "dist": "distdgl", "started": True, "machine_rank": rank}
    return compose_summary(cfg, graph, work, machines, part_config, applied, time.perf_counter() - t0)


def user_overrides(cfg: DictConfig) -> list[str]:
    """The overrides this run was given: the command line's as typed under `gnnscale train` (presets such
    as +exp=NAME included), else (called from Python) the key=value ones the config recorded."""
    if sys.argv[1:2] == ["train"]:
        return [a for a in sys.argv[2:] if "=" in a]
    return list(cfg.get("cli_overrides") or [])


def say_commands(commands: list[str], machines: list) -> None:
    if is_rank_zero():  # whole lines: a wrapped command is no longer one to copy
        console.print(f"distdgl: {len(machines)} machines; on each one run its command:", markup=False)
        for i, cmd in enumerate(commands):
            console.print(
                f"  machine {i} ({machines[i].ip}): {cmd}", markup=False, highlight=False, soft_wrap=True
            )


def resolve_partition(cfg: DictConfig, graph: GraphDir, machines: list | None) -> tuple[Path, str]:
    """(part config, graph name): dist.part_config, or graph_dir's distdgl-<P> (made here on one machine)."""
    d = cfg.dist
    n = len(machines) if machines else 1
    if d.part_config:
        path = Path(d.part_config)
        if not path.is_file():
            raise ConfigError(
                f"dist.part_config '{path}' does not exist", "pass the .json DistDGL's partitioning wrote"
            )
        try:
            meta = json.loads(path.read_text())
            int(meta["num_parts"]), int(meta["num_nodes"]), str(meta["graph_name"])
        except (ValueError, KeyError, TypeError):
            raise DataError(
                f"dist.part_config '{path}' is not a DistDGL partition config",
                "pass the .json `gnnscale partition partition.method=distdgl` wrote",
            ) from None
        _check_parts(int(meta["num_parts"]), n, f"dist.part_config '{path}'")
        if int(meta["num_nodes"]) != graph.num_nodes:
            raise DataError(
                f"dist.part_config '{path}' has {int(meta['num_nodes']):,} nodes, graph_dir '{graph.path}' {graph.num_nodes:,}",
                "pass the partition of this graph_dir, or re-make it with `gnnscale partition partition.method=distdgl`",
            )
        return path.resolve(), str(meta["graph_name"])
    parts = n if machines else int(d.num_parts)
    if machines and int(d.num_parts) not in (1, n):
        raise ConfigError(
            f"dist.num_parts={d.num_parts} but dist.ip_config lists {n} machines",
            "DistDGL runs one partition per machine: drop dist.num_parts",
        )
    _check_parts(parts, n, f"dist.num_parts={parts}")
    if machines is None:
        path = ensure_distdgl_partition(graph, 1, int(cfg.seed))
    else:  # every machine must read the same partition: made once, beforehand, not by each machine
        report = current_distdgl_report(graph, "distdgl", parts)
        if report is None:
            raise ConfigError(
                f"graph_dir '{graph.path}' has no up-to-date DistDGL partition into {parts} parts",
                f"make it once with `gnnscale partition partition.method=distdgl partition.num_parts={parts} "
                f"graph_dir={graph.path}` on storage every machine reads (or copy it to each), or pass dist.part_config=",
            )
        path = part_config_path(graph, parts, report)
    return path.resolve(), json.loads(path.read_text())["graph_name"]


def _check_parts(parts: int, machines: int, what: str) -> None:
    if parts != machines:
        fix = (
            f"pass dist.ip_config=FILE listing {parts} machines"
            if machines == 1
            else f"partition into {machines} parts (one per machine)"
        )
        raise ConfigError(
            f"{what} has {parts} partition(s) for {machines} machine(s); DistDGL serves one partition per machine "
            "(two on one machine would share its shared memory)",
            fix,
        )


def _labelled_train(graph: GraphDir):
    labels = graph.labels().long()
    ids = graph.split_ids("train")
    ids = ids[labels[ids] >= 0]
    if len(ids) == 0:
        raise DataError(
            f"'{graph.path}' has no labelled training nodes", "shard it with a split (data.split_fractions)"
        )
    return labels, ids


def _write_job(
    cfg, graph, work: Path, rank: int, machines, part_config: Path, name: str, labels, train_ids
) -> Path:
    """What every trainer reads: the resolved config, the files, the checkpoint identity."""
    folder = work / JOB_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    feat_dim, num_classes = int(graph.meta["feat_dim"]), int(graph.meta["num_classes"])
    signature = model_signature(cfg.model, feat_dim, num_classes)
    identity = {  # as training/build.py build_trainer records it
        "signature": signature,
        "signature_hash": signature_hash(signature),
        "model_cfg": OmegaConf.to_container(cfg.model, resolve=True),
        "graph": {
            "name": str(graph.meta["name"]),
            "num_nodes": graph.num_nodes,
            "feat_dim": feat_dim,
            "num_classes": num_classes,
            "graph_dir": str(graph.path),
        },
        "config_hash": config_hash(hashable_cfg(cfg)),
    }
    weight = class_weights(labels[train_ids], num_classes).tolist() if cfg.train.class_weights else None
    trainers = int(cfg.dist.num_trainers)
    threads = int(cfg.train.num_threads) or max(1, len(os.sched_getaffinity(0)) // trainers)
    job = {
        "config": str(folder / "config.yaml"),
        "ip_config": str(write_ip_config(folder / "ip_config.txt", machines)),
        "part_config": str(part_config),
        "graph_name": name,
        "run_dir": str(work) if rank == 0 else None,
        "identity": identity,
        "feat_dim": feat_dim,
        "num_classes": num_classes,
        "class_weight": weight,
        "threads": threads,
        "timeout_s": int(cfg.dist.timeout_s),
    }
    path = folder / "job.json"
    path.write_text(json.dumps(job, indent=1))
    return path


def _run_machine(
    cfg, work: Path, job: Path, rank: int, machines: list, part_config: Path, master_port: int
) -> None:
    """Start this machine's servers, then its trainers; wait for all of them (or end all on a failure)."""
    d = cfg.dist
    spec = json.loads(job.read_text())
    servers, trainers, samplers = int(d.num_servers), int(d.num_trainers), int(d.num_samplers)
    root = str(Path(gnnscale.__file__).resolve().parents[1])
    common = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "DGLBACKEND": "pytorch",
        "DGL_DIST_MODE": "distributed",
        "DGL_IP_CONFIG": spec["ip_config"],
        "DGL_CONF_PATH": str(part_config),
        "DGL_NUM_SERVER": str(servers),
        "DGL_NUM_CLIENT": str(trainers * (1 + samplers) * len(machines)),
        "DGL_NUM_SAMPLER": str(samplers),
        "DGL_GRAPH_FORMAT": "csc",
        # DGL retries a connection every 3 s (clients) or 1 s (servers): give up after about dist.timeout_s
        "DGL_DIST_MAX_TRY_TIMES": str(max(10, math.ceil(int(d.timeout_s) / 3))),
    }
    group = ProcessGroup(work / "logs", int(d.timeout_s))
    previous = _exit_on_sigterm()
    try:
        for s in range(servers):
            env = {
                **common,
                "DGL_ROLE": "server",
                "DGL_SERVER_ID": str(rank * servers + s),
                "OMP_NUM_THREADS": "1",
            }
            group.start(
                f"server {rank * servers + s}", "server", python_argv("gnnscale.dist.distdgl.server"), env
            )
        iface = interface_of(machines[rank].ip)
        for local in range(trainers):
            global_rank = rank * trainers + local
            env = {
                **common,
                "DGL_ROLE": "client",
                "DGL_GROUP_ID": "0",
                "OMP_NUM_THREADS": str(spec["threads"]),
                "RANK": str(global_rank),
                "LOCAL_RANK": str(local),
                "WORLD_SIZE": str(trainers * len(machines)),
                "MASTER_ADDR": machines[0].ip,
                "MASTER_PORT": str(master_port),
                **({"GLOO_SOCKET_IFNAME": iface} if iface else {}),
            }
            argv = python_argv("gnnscale.dist.distdgl.trainer", str(job))
            group.start(f"trainer {global_rank}", "trainer", argv, env, console=global_rank == 0)
        group.wait()
    finally:
        group.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm():
    """A launcher ended with SIGTERM (a scheduler cancelling the job) ends its children first: they run in
    process groups of their own, which the signal does not reach. Returns the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)
