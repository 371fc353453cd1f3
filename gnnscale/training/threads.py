"""Helper threads' OpenMP settings: gathers and the first-layer sums' passes run beside the model."""

from __future__ import annotations

import torch


def single_threaded() -> None:
    """A helper thread runs its torch ops on one OpenMP thread (a per-thread setting): a second team of
    spinning OpenMP workers would steal the cores the model's matmuls are using."""
    from dgl.utils import set_num_threads

    # torch sets each new thread's OpenMP count on its first parallel op: let that happen first.
    torch.index_select(torch.zeros(1 << 16, 4), 0, torch.zeros(1 << 16, dtype=torch.int64))
    set_num_threads(1)
