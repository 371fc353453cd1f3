"""A seeded uniform partition: no memory beyond the assignment, and as balanced as a partition can be."""

from __future__ import annotations

import numpy as np


def random_assignment(num_nodes: int, num_parts: int, seed: int, train_mask: np.ndarray | None = None):
    """Nodes dealt round-robin in a seeded random order, training nodes first: every part gets the same
    number of nodes and of training nodes, give or take one."""
    rng = np.random.default_rng(seed)
    if train_mask is None:
        order = rng.permutation(num_nodes)
    else:
        mask = np.asarray(train_mask, dtype=bool)
        order = np.concatenate(
            [rng.permutation(np.flatnonzero(mask)), rng.permutation(np.flatnonzero(~mask))]
        )
    out = np.empty(num_nodes, dtype=np.int32)
    out[order] = np.arange(num_nodes, dtype=np.int64) % num_parts
    return out
