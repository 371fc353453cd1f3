"""The DGL view of a graph_dir's CSC: storage hands out arrays, the samplers need a DGLGraph.

DGL wants indptr, indices and edge ids of one dtype, the graph's idtype. int64 indices (a CSC built before
build-csr wrote int32) give an int64 graph, nothing copied. int32 indices give an int32 graph: the indices
are taken as they are and only indptr is copied to int32 (4 bytes per node), unless the graph has 2**31
edges or more (indptr needs int64) or the caller asks for int64 (DGL's METIS takes nothing else); the
indices are then widened, a full copy. DGL's samplers draw the same neighbours over both idtypes
(tests/test_csc_int32.py), but take seeds and edge ids only in the graph's own: `ids_for` casts them, and
what a sampler returns in the graph's idtype is widened to int64 before it indexes anything.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from gnnscale.storage.csc import open_csc


def _idtype_for(indices: torch.Tensor) -> torch.dtype:
    narrow = indices.dtype == torch.int32 and len(indices) < 2**31
    return torch.int32 if narrow else torch.int64


def adj_to_dgl(fmt: str, indptr, indices, num_nodes: int, idtype: torch.dtype | None = None):
    """A DGL graph over one sparse format ("csc" or "csr") of numpy arrays or tensors (mmap'd ones too),
    in the idtype the indices allow (see the module docstring) or `idtype`; only `fmt` is materialised."""
    import dgl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only mmap -> tensor: DGL never writes to it
        ip, ix = torch.as_tensor(indptr), torch.as_tensor(indices)
    idtype = idtype or _idtype_for(ix)
    # a tensor already of the idtype is kept, not copied (this is what keeps the indices zero-copy)
    ip, ix = ip.to(idtype), ix.to(idtype)
    g = dgl.graph((fmt, (ip, ix, torch.empty(0, dtype=idtype))), num_nodes=num_nodes, idtype=idtype)
    return g.formats(fmt)


def csc_to_dgl(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, idtype: torch.dtype | None = None):
    """A DGL graph over CSC arrays (mmap'd or resident) without copying the indices where DGL allows."""
    return adj_to_dgl("csc", indptr, indices, num_nodes, idtype)


def to_dgl_graph(graph):
    """The DGL graph of a GraphDir's mmap'd CSC (GraphDirError with "run build-csr first" when absent)."""
    indptr, indices = open_csc(graph)
    return csc_to_dgl(indptr, indices, graph.num_nodes)


def ids_for(g, ids):
    """Node or edge ids (a tensor, or None) in g's idtype: DGL's samplers refuse any other."""
    if ids is None:
        return None
    return torch.as_tensor(ids).to(g.idtype)


def as_int64(t) -> np.ndarray:
    """A sampler's output ids (tensor, in the graph's idtype) as int64 numpy: what indexes features, labels
    and scratch maps downstream, and what a block's ids are, whichever idtype the graph has."""
    return np.asarray(t.numpy() if isinstance(t, torch.Tensor) else t, dtype=np.int64)
