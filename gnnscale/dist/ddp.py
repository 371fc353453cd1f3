"""DDP's side of the trainer's Sync seam (training/sync.py): the process group, the DDP wrapper with its
communication hook, local steps, and the reductions the loop and evaluation ask for.

Local steps (`dist.local_steps=K`) are periodic model averaging (local SGD): every rank steps on every
batch without all-reducing gradients (DDP's `no_sync`) and the ranks average their parameters every K
steps and at the end of each epoch. Chosen over gradient accumulation because it keeps one optimizer
step per batch, so the LR schedule and the number of updates stay those of the single-process run;
accumulating K batches would make the batch K times larger and the updates K times fewer.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta

import torch

from gnnscale.dist.comm import CommMeter, as_tensor, param_bytes, register_hook
from gnnscale.training.sync import SINGLE, Sync


def launched() -> bool:
    """This process is one rank of a job torchrun (or gnnscale's launcher) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_world() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def start_sync(dist_cfg, device: torch.device) -> Sync:
    """SINGLE for dist=none; else join the job's process group (gloo on CPU, NCCL on CUDA)."""
    if dist_cfg.kind != "ddp":
        return SINGLE
    import torch.distributed as dist

    backend = (
        dist_cfg.backend if dist_cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    )
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=int(dist_cfg.timeout_s)))
    return DDPSync(dist_cfg, device)


class DDPSync(Sync):
    def __init__(self, dist_cfg, device: torch.device):
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.cfg, self.device = dist_cfg, device
        # NCCL reduces tensors on the GPU; gloo on the CPU
        self.comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.local_steps = max(1, int(dist_cfg.local_steps))
        self.meter = CommMeter()
        self._ddp = None
        self._step = 0
        self._calls_before = 0

    def forward_module(self, model):
        if self._ddp is None or self._ddp.module is not model:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # No buffers to broadcast in gnnscale's models; skipping it saves a collective per forward.
            self._ddp = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
            self._params = list(model.parameters())
            register_hook(
                self._ddp,
                self.cfg.grad_compression,
                self.meter,
                self.cfg.powersgd_rank,
                self.cfg.powersgd_start_iter,
            )
        return self._ddp

    def step(self, last: bool):
        self._step += 1
        self._calls_before = self.meter.calls
        if self.local_steps > 1 and self._ddp is not None:
            return self._ddp.no_sync()
        return contextlib.nullcontext()

    def after_step(self, last: bool) -> None:
        if self.meter.calls > self._calls_before:
            self.meter.rounds += 1
        if self.local_steps > 1 and (self._step % self.local_steps == 0 or last):
            from torch.distributed.algorithms.model_averaging.utils import average_parameters

            average_parameters(iter(self._params), self.dist.group.WORLD)  # one flat all-reduce
            self.meter.calls += 1
            self.meter.rounds += 1
            self.meter.bytes += param_bytes(self._params)
            self.meter.bytes_fp32 += param_bytes(self._params)
        if last:
            self._step = 0

    def sum(self, values) -> list[float]:
        t = as_tensor(values, self.comm_device)
        self.dist.all_reduce(t)
        return t.tolist()

    def max(self, values) -> list[float]:
        t = as_tensor(values, self.comm_device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def gather(self, items: list) -> list:
        parts: list = [None] * self.world
        self.dist.all_gather_object(parts, items)
        return [item for part in parts for item in part]

    def agree(self, make):
        """Rank 0's value of make(), on every rank (run folder names, resume decisions)."""
        box = [make() if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        self.dist.barrier()

    def epoch_stats(self) -> dict:
        return {"world_size": self.world, **self.meter.take()}

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
