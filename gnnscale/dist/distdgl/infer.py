"""Layer-wise inference on a DistGraph: layer l of every node into a DistTensor before layer l+1 starts.

Each trainer computes its even share of the nodes (node_split), one full-neighbour block at a time, with
the model's own `layer_forward` — the function single-process layer-wise inference uses — so the rows
equal gnnscale.inference's for the same weights. The layers live in the servers' memory as DistTensors;
trainer rank 0 then writes each to an .npy in graph_dir node order (partition_graph renumbered the nodes;
the partition's `orig_id` node data maps them back).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

_WRITE_ROWS = 1 << 16  # rows pulled from the servers per request when writing a layer out


@torch.no_grad()
def layerwise(g, model, batch_size: int) -> tuple[list, list[float]]:
    """(every layer's output as a DistTensor [N, dim_l], seconds per layer); every trainer calls it."""
    import dgl

    model.eval()
    n = g.num_nodes()
    nodes = dgl.distributed.node_split(
        torch.ones(n, dtype=torch.bool), g.get_partition_book(), force_even=True
    )
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    x = g.ndata["feat"]
    outs, seconds = [], []
    for layer in range(model.num_layers):
        t0 = time.perf_counter()
        y = dgl.distributed.DistTensor(
            (n, model.dims[layer + 1]), torch.float32, f"gnnscale_h{layer + 1}", persistent=True
        )
        loader = dgl.dataloading.DistNodeDataLoader(
            g, nodes, sampler, batch_size=batch_size, shuffle=False, drop_last=False
        )
        for input_nodes, seeds, blocks in loader:
            y[seeds] = model.layer_forward(layer, blocks[0], x[input_nodes].to(torch.float32))
        g.barrier()  # layer l is complete everywhere before anyone reads it as layer l+1's input
        outs.append(y)
        x = y
        seconds.append(time.perf_counter() - t0)
    return outs, seconds


def write_layers(g, layers: list, folder: Path) -> list[Path]:
    """Each DistTensor into folder/h_<l>.npy, row i = graph_dir node i (written whole, then renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    n = g.num_nodes()
    orig = g.ndata["orig_id"]
    paths = []
    for layer, y in enumerate(layers, 1):
        path = folder / f"h_{layer}.npy"
        partial = path.with_name(path.name + ".partial")
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(n, y.shape[1]))
        for lo in range(0, n, _WRITE_ROWS):
            ids = torch.arange(lo, min(lo + _WRITE_ROWS, n))
            out[orig[ids].numpy()] = y[ids].numpy()
        out.flush()
        del out
        with open(partial, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(partial, path)
        paths.append(path)
    return paths
