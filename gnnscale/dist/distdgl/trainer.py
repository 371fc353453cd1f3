"""A DistDGL trainer process: `python -m gnnscale.dist.distdgl.trainer JOB.json` (started by launch.py).

It joins DistDGL (the DGL_* environment) and the trainers' gloo group (RANK / WORLD_SIZE / MASTER_*),
trains gnnscale's model on its share of the training seeds with DDP, keeps the best-validation weights,
scores them, and runs layer-wise inference into DistTensors. Rank 0 alone writes: metrics.jsonl,
checkpoints/best.pt and last.pt in the format the single-process trainer writes (so `gnnscale infer`
reads them), the layer files and the result the launcher turns into summary.json.
Exit codes: 0 done, 2 `error: ...` (the input is wrong), 1 anything else (traceback in the log).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import math
import os
import resource
import statistics
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch

from gnnscale.config import eval_batch_size
from gnnscale.errors import DataError, GnnscaleError
from gnnscale.training.loop import TIME_SPLIT

RESULT = "distdgl_result.json"
LAYERS_DIR = "distdgl_layers"
_FINAL_STREAM = 2  # the seed streams of the final val / test passes (as training/trainer.py numbers them)


def quiet():
    """DGL narrates connections and exits on stdout; the rank-0 trainer's stdout is the user's console."""
    return contextlib.redirect_stdout(io.StringIO())


def main(job_path: str) -> None:
    os.environ.setdefault("DGLBACKEND", "pytorch")
    logging.getLogger("dgl-distributed-socket").setLevel(logging.ERROR)
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(int(job["threads"]))
    import dgl

    with quiet():
        dgl.distributed.initialize(job["ip_config"])  # before torch.distributed, as DGL requires
    try:
        torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=int(job["timeout_s"])))
        g = dgl.distributed.DistGraph(job["graph_name"], part_config=job["part_config"])
        check_node_data(g, job)
        run(g, job)
    except GnnscaleError as exc:
        _die(2, f"error: {exc.one_line()}")
    except BaseException:  # noqa: B036 - whatever it was, end now: peers blocked on this rank time out
        _die(1, traceback.format_exc().rstrip())
    with quiet():
        dgl.distributed.exit_client()  # rank 0 shuts the servers down once every trainer got here
    torch.distributed.destroy_process_group()


def _die(code: int, text: str) -> None:
    """Exit without DGL's atexit handler, which would wait at a barrier for trainers that never come."""
    print(text, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def check_node_data(g, job: dict) -> None:
    from gnnscale.dist.distdgl.partition import NODE_DATA

    missing = [k for k in NODE_DATA if k not in g.ndata]
    if missing:
        raise DataError(
            f"the DistDGL partition {job['part_config']} lacks node data {', '.join(missing)}",
            "make it with `gnnscale partition partition.method=distdgl partition.num_parts=P`",
        )
    if g.num_nodes() != int(job["identity"]["graph"]["num_nodes"]) or g.ndata["feat"].shape[1] != int(
        job["feat_dim"]
    ):
        raise DataError(
            f"the DistDGL partition {job['part_config']} holds another graph than graph_dir "
            f"({g.num_nodes():,} nodes x {g.ndata['feat'].shape[1]} features)",
            "re-make it from this graph_dir with `gnnscale partition partition.method=distdgl`",
        )


def run(g, job: dict) -> None:
    from omegaconf import OmegaConf

    from gnnscale.dist.distdgl.infer import layerwise, write_layers
    from gnnscale.training.seeding import epoch_seed, reseed
    from gnnscale.utils.atomic import write_json

    cfg = OmegaConf.load(job["config"])
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    parts = build(cfg, g, job, rank, world)
    history = fit(cfg, g, job, parts, rank)
    parts.model.load_state_dict(parts.best_state)  # every rank kept the same best weights
    final = {}
    for i, split in enumerate(("val", "test")):
        reseed(epoch_seed(int(cfg.seed), 0, _FINAL_STREAM + i, rank))
        final[split] = parts.evaluate(split)
    layers, seconds = layerwise(g, parts.model, parts.eval_batch)
    if rank == 0:
        run_dir = Path(job["run_dir"])
        paths = write_layers(g, layers, run_dir / LAYERS_DIR)
        result = {
            **history,
            "val": final["val"],
            "test": final["test"],
            "num_params": sum(p.numel() for p in parts.model.parameters()),
            "layer_files": [str(p) for p in paths],
            "layer_seconds": [round(s, 3) for s in seconds],
            "world_size": world,
            "seeds_per_trainer": parts.seeds_per_trainer,
            "batch_size_per_trainer": parts.batch_size,
            "steps_per_epoch": parts.steps,
            "peak_rss_mb_rank0": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        write_json(run_dir / RESULT, result)


class Parts:
    """What the epochs share: the model (and its DDP wrapper), optimizer, schedule, loaders."""

    def evaluate(self, split: str) -> dict:
        from gnnscale.dist.distdgl.loop import DistBatches
        from gnnscale.training.loop import evaluate

        return evaluate(self.model, DistBatches(self.g, self.loaders[split]), self.task, self.precision, self.sync)


def build(cfg, g, job: dict, rank: int, world: int) -> Parts:
    import dgl

    from gnnscale.dist.ddp import DDPSync
    from gnnscale.models import build_model
    from gnnscale.tasks.node import NodeClassification
    from gnnscale.training.precision import Precision
    from gnnscale.training.schedule import build_optimizer, build_scheduler
    from gnnscale.training.seeding import reseed

    t = cfg.train
    p = Parts()
    p.g, p.metric, p.num_classes = g, str(t.metric), int(job["num_classes"])
    weight = job.get("class_weight")
    class_weight = torch.tensor(weight, dtype=torch.float32) if weight else None
    p.task = NodeClassification(p.num_classes, p.metric, class_weight)
    reseed(int(cfg.seed))  # the single-process trainer's initial weights for the same seed
    p.model = build_model(cfg.model, int(job["feat_dim"]), p.num_classes)
    p.sync = DDPSync(cfg.dist, torch.device("cpu"))  # the trainers' gloo group, joined by main()
    p.sync.forward_module(p.model)  # DDP's wrapper, made now: every trainer builds it at the same point
    p.precision = Precision(cfg.precision.dtype, torch.device("cpu"))
    pb = g.get_partition_book()
    seeds = equal_share(
        dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True), int(cfg.seed), rank
    )
    # train.batch_size is the global batch: the trainers together take as many seeds per step as one
    # process would, so the step count and the learning-rate schedule match a single-process run.
    p.batch_size = max(1, math.ceil(int(t.batch_size) / world))
    p.steps = math.ceil(len(seeds) / p.batch_size)
    p.seeds_per_trainer = len(seeds)
    fanouts = [int(f) for f in cfg.sampler.fanouts]
    eval_fanouts = [int(f) for f in (t.eval_fanouts or fanouts)]
    replace = bool(cfg.sampler.get("replace", False))
    p.eval_batch = eval_batch_size(t)
    loader = dgl.dataloading.DistNodeDataLoader
    p.train_loader = loader(
        g,
        seeds,
        dgl.dataloading.NeighborSampler(fanouts, replace=replace),
        batch_size=p.batch_size,
        shuffle=True,
    )
    eval_sampler = dgl.dataloading.NeighborSampler(eval_fanouts, replace=replace)
    p.loaders = {
        split: loader(
            g,
            dgl.distributed.node_split(g.ndata[f"{split}_mask"], pb, force_even=True),
            eval_sampler,
            batch_size=p.eval_batch,
            shuffle=False,
        )
        for split in ("val", "test")
    }
    n_val = torch.tensor([len(p.loaders["val"].dataset)], dtype=torch.int64)
    torch.distributed.all_reduce(n_val)
    p.has_val = (
        int(n_val) > 0
    )  # no validation split: the latest weights are the best known (as in one process)
    p.optimizer = build_optimizer(p.model.parameters(), t)
    p.scheduler = build_scheduler(p.optimizer, p.steps, t)
    p.best_state = copy.deepcopy(p.model.state_dict())
    return p


def equal_share(seeds: torch.Tensor, seed: int, rank: int) -> torch.Tensor:
    """Every trainer the same number of seeds (node_split's shares differ by one at most): DDP needs the
    same step count everywhere. The few left over are drawn at random, per trainer."""
    n = torch.tensor([len(seeds)], dtype=torch.int64)
    torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MIN)
    if int(n) == len(seeds):
        return seeds
    keep = torch.randperm(len(seeds), generator=torch.Generator().manual_seed(seed * 1009 + rank))[: int(n)]
    return seeds[keep.sort().values]


def fit(cfg, g, job: dict, p: Parts, rank: int) -> dict:
    """The epochs: train, validate, keep the best weights, checkpoint (rank 0); early stopping as train.patience."""
    from gnnscale.dist.distdgl.loop import DistBatches
    from gnnscale.models.checkpoint import save_checkpoint
    from gnnscale.storage.run_dir import BEST, LAST, append_metrics, checkpoint_file
    from gnnscale.training.loop import train_epoch
    from gnnscale.training.seeding import epoch_seed, reseed, rng_state
    from gnnscale.utils.ui import info

    t = cfg.train
    epochs, patience, every = int(t.epochs), int(t.patience), int(t.eval_every)
    batches = DistBatches(g, p.train_loader, p.steps)
    best_val, best_epoch, stopped, records = float("nan"), 0, False, []
    metric = p.metric
    run_dir = Path(job["run_dir"]) if rank == 0 else None
    for epoch in range(1, epochs + 1):
        reseed(epoch_seed(int(cfg.seed), epoch, 0, rank))
        stats = train_epoch(
            p.model, batches, p.task, p.optimizer, p.scheduler, p.precision,
            grad_clip=float(t.grad_clip), input_dropout=float(t.input_dropout), sync=p.sync,
        )  # fmt: skip
        record = {
            "epoch": epoch,
            "loss": round(stats["loss"], 6),
            "train_acc": round(stats["train_acc"], 6),
            "lr": p.scheduler.get_last_lr()[0],
        }
        improved = False
        if not p.has_val:
            improved, best_epoch = True, epoch
            p.best_state = copy.deepcopy(p.model.state_dict())
        elif epoch % every == 0 or epoch == epochs:
            reseed(epoch_seed(int(cfg.seed), epoch, 1, rank))
            val = p.evaluate("val")
            record.update({f"val_{metric}": _finite(val[metric]), "val_loss": _finite(val["loss"])})
            improved = not math.isnan(val[metric]) and (math.isnan(best_val) or val[metric] > best_val)
            if improved:
                best_val, best_epoch = float(val[metric]), epoch
                p.best_state = copy.deepcopy(p.model.state_dict())
        record.update({k: round(v, 4) for k, v in stats.items() if k.endswith("_s")})
        record.update(
            {"seeds_per_s": round(stats["seeds_per_s"], 1), "steps": stats["steps"], "best": improved}
        )
        stopped = p.has_val and patience > 0 and epoch - best_epoch >= patience
        records.append(record)
        if rank == 0:
            append_metrics(run_dir, record)
            state = _state(p, job, epoch, best_val, best_epoch, stopped, rng_state())
            if improved:
                save_checkpoint(checkpoint_file(run_dir, BEST), state)
            save_checkpoint(checkpoint_file(run_dir, LAST), state)
            info(_line(record, epochs, metric))
        if stopped:
            info(
                f"early stop: no better val_{metric} for {patience} epochs (best {best_val:.4f} at epoch {best_epoch})"
            )
            break
    return {
        "best_val": _finite(best_val),
        "best_epoch": best_epoch,
        "epochs_run": len(records),
        "stopped": stopped,
        "epoch_time_s": _median(records, "epoch_time_s"),
        "seeds_per_s": _median(records, "seeds_per_s"),
        "time_split_s": {k: _median(records, k) for k in TIME_SPLIT},
    }


def _state(
    p: Parts, job: dict, epoch: int, best_val: float, best_epoch: int, stopped: bool, rng: dict
) -> dict:
    """The single-process trainer's checkpoint (training/trainer.py Trainer._state), same keys and identity."""
    return {
        "model": p.model.state_dict(),
        **job["identity"],
        "epoch": epoch,
        "optimizer": p.optimizer.state_dict(),
        "scheduler": p.scheduler.state_dict(),
        "scaler": p.precision.scaler.state_dict(),
        "rng": rng,
        "best_val": best_val,
        "best_epoch": best_epoch,
        "metric": p.metric,
        "stopped": stopped,
    }


def _line(r: dict, epochs: int, metric: str) -> str:
    val = r.get(f"val_{metric}")
    return (
        f"epoch {r['epoch']}/{epochs}  loss {r['loss']:.4f}  train_acc {r['train_acc']:.4f}"
        + (f"  val_{metric} {val:.4f}" if val is not None else "")
        + f"  {r['epoch_time_s']:.2f}s"
    )


def _finite(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def _median(records: list[dict], key: str) -> float | None:
    vals = [r[key] for r in records if r.get(key) is not None]
    return round(statistics.median(vals), 4) if vals else None


if __name__ == "__main__":
    main(sys.argv[1])
