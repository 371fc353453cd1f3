"""The DGL view of a graph_dir's CSC: storage hands out arrays, the samplers need a DGLGraph."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from gnnscale.storage.csc import open_csc


def csc_to_dgl(indptr: np.ndarray, indices: np.ndarray, num_nodes: int):
    """A DGL graph over CSC arrays (mmap'd ones too) without copying: DGL takes the tensors as they are."""
    import dgl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only mmap -> tensor: DGL never writes to it
        ip, ix = torch.from_numpy(indptr), torch.from_numpy(indices)
    g = dgl.graph(("csc", (ip, ix, torch.empty(0, dtype=torch.int64))), num_nodes=num_nodes)
    return g.formats("csc")


def to_dgl_graph(graph):
    """The DGL graph of a GraphDir's mmap'd CSC (GraphDirError with "run build-csr first" when absent)."""
    indptr, indices = open_csc(graph)
    return csc_to_dgl(indptr, indices, graph.num_nodes)
