"""Gradient communication of data-parallel training: DDP communication hooks (`dist.grad_compression`)
and a meter of what each epoch handed to all-reduce.

Bytes are the payload each rank hands to all-reduce (what the hook sends, not the wire traffic: a ring
all-reduce moves about 2(W-1)/W times the payload per rank). `comm_bytes_fp32` is what plain fp32
all-reduce of the same gradients would have handed over, so their ratio is the compression ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gnnscale.errors import ConfigError

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


@dataclass
class CommMeter:
    calls: int = 0  # collective calls (hook buckets, PowerSGD's several per bucket counted as one)
    rounds: int = 0  # steps that synchronised (gradients all-reduced or parameters averaged)
    bytes: int = 0
    bytes_fp32: int = 0

    def take(self) -> dict:
        out = {
            "comm_bytes": self.bytes,
            "comm_bytes_fp32": self.bytes_fp32,
            "comm_calls": self.calls,
            "sync_rounds": self.rounds,
        }
        self.calls = self.rounds = self.bytes = self.bytes_fp32 = 0
        return out


def check_compression(kind: str) -> str:
    if kind not in COMPRESSIONS:
        raise ConfigError(
            f"dist.grad_compression={kind} is not one of {', '.join(COMPRESSIONS)}",
            "pick one, e.g. dist.grad_compression=bf16",
        )
    return kind


def register_hook(ddp, kind: str, meter: CommMeter, powersgd_rank: int, powersgd_start_iter: int):
    """Register the compression hook on a DDP model, wrapped so every bucket it sends is metered."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    check_compression(kind)
    if kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(powersgd_rank),
            start_powerSGD_iter=int(powersgd_start_iter),
        )
        hook, size = powerSGD_hook.powerSGD_hook, _powersgd_bytes
    else:
        state = None  # the default process group
        hook = {
            "none": default_hooks.allreduce_hook,
            "fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook,
        }[kind]
        itemsize = 4 if kind == "none" else 2
        size = lambda _state, bucket: bucket.buffer().numel() * itemsize  # noqa: E731

    def metered(state, bucket):
        meter.calls += 1
        meter.bytes += int(size(state, bucket))
        meter.bytes_fp32 += bucket.buffer().numel() * 4
        return hook(state, bucket)

    ddp.register_comm_hook(state, metered)


def _powersgd_bytes(state, bucket) -> int:
    """PowerSGD's payload for one bucket, by its own rule (powerSGD_hook): vanilla all-reduce during its
    warm-up, then the P and Q factors of each matrix worth compressing plus the rest uncompressed."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    if state.iter < state.start_powerSGD_iter:
        return bucket.buffer().numel() * 4
    total = 0
    for grad in bucket.gradients():
        if grad.ndimension() <= 1:
            total += grad.numel() * 4
            continue
        rows = grad.shape[0]
        cols = grad.numel() // rows
        rank = min(rows, cols, state.matrix_approximation_rank)
        compress, full, small = _should_compress(rows, cols, rank, state.min_compression_rate)
        total += (small if compress else full) * 4
    return total


def param_bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def as_tensor(values, device: torch.device) -> torch.Tensor:
    return torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
