"""METIS through DGL (`dgl.metis_partition_assignment`): fewest cut edges, nodes balanced within 3%."""

from __future__ import annotations

import contextlib
import io
import os
import sys

import numpy as np
import torch

from gnnscale.partition.graph import Adjacency
from gnnscale.sampling.graph import csc_to_dgl


@contextlib.contextmanager
def _quiet():
    """DGL prints its timings (Python) and METIS's edge cut (C++, to the stderr descriptor): hide both."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def metis_assignment(
    adj: Adjacency, num_parts: int, train_mask: np.ndarray | None = None, balance_edges: bool = False
) -> np.ndarray:
    """Part id per node. With `train_mask`, training and other nodes are two METIS constraints, so
    each part holds about the same number of both (DistDGL's balance_ntypes); `balance_edges` adds
    in-degree constraints (more constraints, more cut edges: off by default, as in Cluster-GCN)."""
    if num_parts == 1:
        return np.zeros(adj.num_nodes, dtype=np.int64)
    import dgl

    # DGL's METIS takes int64 graphs only: int32 indices are widened here (memory.py counts the copy)
    g = csc_to_dgl(adj.indptr, adj.indices, adj.num_nodes, idtype=torch.int64)
    ntypes = None
    if train_mask is not None and 0 < int(np.count_nonzero(train_mask)) < adj.num_nodes:
        ntypes = torch.from_numpy(np.asarray(train_mask, dtype=np.int64))
    with _quiet():
        part = dgl.metis_partition_assignment(
            g, num_parts, balance_ntypes=ntypes, balance_edges=balance_edges
        )
    if part is None:
        raise RuntimeError(f"METIS returned no partition of {adj.num_nodes} nodes into {num_parts} parts")
    return part.numpy()
