"""The process's CPU math: torch's and DGL's thread teams, and weights kept out of the subnormal range.

Weight decay shrinks weights that get little gradient toward zero geometrically. After a few epochs their
products with the activations fall below 1.2e-38 (subnormal), where the CPU kernels that are not FMA
matrix products (DGL's aggregation, elementwise ops) take a slow path. Measured with +exp=sage_link on the
built-in synthetic graph: from epoch 6, forward and backward went from 3 s to 6-18 s an epoch each while
sampling stayed at 2 s, with thousands of weights below 1e-30. torch.set_flush_denormal sets only the
calling thread's flag (measured: the OpenMP workers still produced subnormals), so the training loop
zeroes such weights every FLUSH_EVERY steps instead.
"""

from __future__ import annotations

import torch

from gnnscale.sampling import set_sampling_threads

FLUSH_EVERY = 64  # optimizer steps; a zeroed Adam moment needs hundreds of steps to decay back below normal
# Below these a weight (next to its peers of about 1e-2) or an Adam moment changes no float32 sum, but its
# products with the activations are subnormal.
_NEGLIGIBLE_WEIGHT, _NEGLIGIBLE_STATE = 1e-20, 1e-30


def configure_cpu(threads: int) -> None:
    torch.set_num_threads(threads)
    set_sampling_threads(threads)  # DGL's OpenMP team is its own: seeded and sized apart from torch's


@torch.no_grad()
def flush_subnormals(params, optimizer) -> None:
    """Zero the CPU float32 weights below 1e-20 and optimizer state below 1e-30 in magnitude (the same on
    every data-parallel rank): a weight decayed that far stays exactly 0 instead of going subnormal."""
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    for tensors, below in ((params, _NEGLIGIBLE_WEIGHT), (state, _NEGLIGIBLE_STATE)):
        for t in tensors:
            if t.device.type == "cpu" and t.dtype == torch.float32:
                t.masked_fill_(t.abs() < below, 0.0)
