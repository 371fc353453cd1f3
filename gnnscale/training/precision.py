"""precision=fp32|bf16|fp16: torch autocast on CPU or CUDA, plus loss scaling for fp16.

Two CPU gaps are filled here: torch 2.2 has no CPU GradScaler (gnnscale's LossScaler does the
same dynamic scaling), and DGL 2.1's CPU sparse kernels reject float16 (gspmm/gsddmm run those
inputs in fp32 and hand fp16 back, so autocast's fp16 matmuls still do the dense work).
"""

from __future__ import annotations

import contextlib

import torch

from gnnscale.errors import ConfigError

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """Dynamic loss scaling with torch.cuda.amp.GradScaler's interface and state_dict keys."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        self._scale = float(init_scale)
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._unscaled = False
        self._found_inf = False

    def is_enabled(self) -> bool:
        return True

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def unscale_(self, optimizer) -> None:
        if self._unscaled:
            return
        inv, found = 1.0 / self._scale, False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(inv)
                    found = found or not bool(torch.isfinite(p.grad).all())
        self._found_inf, self._unscaled = found, True

    def step(self, optimizer) -> None:
        self.unscale_(optimizer)
        if not self._found_inf:  # an overflowed step is skipped, as GradScaler does
            optimizer.step()

    def update(self) -> None:
        if self._found_inf:
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0
        self._unscaled = self._found_inf = False

    def state_dict(self) -> dict:
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state: dict) -> None:
        if state:
            self._scale = float(state["scale"])
            self._growth_factor = float(state["growth_factor"])
            self._backoff_factor = float(state["backoff_factor"])
            self._growth_interval = int(state["growth_interval"])
            self._growth_tracker = int(state["_growth_tracker"])


class Precision:
    def __init__(self, name: str, device: torch.device):
        if name not in DTYPES:
            raise ConfigError(
                f"precision.dtype={name!r} is not known", f"choose precision={'|'.join(DTYPES)}"
            )
        self.name, self.device = name, device
        self.dtype = DTYPES[name]
        if device.type == "cuda" and name == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError(
                "precision=bf16 but this GPU has no bfloat16 support", "use precision=fp16 or precision=fp32"
            )
        if name == "fp16" and device.type == "cuda":
            self.scaler = torch.cuda.amp.GradScaler()
        elif name == "fp16":
            self.scaler = LossScaler()
            _patch_dgl_cpu_half()
        else:
            self.scaler = torch.cuda.amp.GradScaler(enabled=False)  # a no-op with the same calls

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)


_patched = False


def _patch_dgl_cpu_half() -> None:
    global _patched
    if _patched:
        return
    from dgl.ops import sddmm, spmm

    spmm.gspmm_internal = _fp32_sparse(spmm.gspmm_internal)
    sddmm.gsddmm_internal = _fp32_sparse(sddmm.gsddmm_internal)
    _patched = True


def _fp32_sparse(fn):
    def wrapped(gidx, op, *args, **kwargs):
        half = any(
            isinstance(a, torch.Tensor) and a.dtype == torch.float16 and a.device.type == "cpu" for a in args
        )
        if not half:
            return fn(gidx, op, *args, **kwargs)
        args = tuple(
            a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.float16 else a for a in args
        )
        out = fn(gidx, op, *args, **kwargs)
        return out.half() if isinstance(out, torch.Tensor) else out

    wrapped.__wrapped__ = fn
    return wrapped
