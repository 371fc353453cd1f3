"""Layer-wise inference: layer l for every node (or only the affected ones) before layer l+1 starts.

Each node gets its exact embedding (full neighbourhoods, eval mode), and the work per node per layer
is done once, not once per node that has it in its L-hop neighbourhood. Working memory is one batch's
neighbourhood plus the rows of the layer being read and written, independent of the number of layers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from gnnscale.inference.blocks import Adjacency, make_block
from gnnscale.inference.layerfile import LayerFile


class RowSource(Protocol):
    def gather(self, ids: torch.Tensor) -> torch.Tensor: ...


@dataclass
class LayerStats:
    layer: int
    dim: int
    rows: int
    edges: int
    seconds: float

    def as_dict(self) -> dict:
        return {
            "layer": self.layer,
            "dim": self.dim,
            "rows_computed": self.rows,
            "edges": self.edges,
            "seconds": round(self.seconds, 3),
        }


def layer_paths(folder: Path, num_layers: int) -> list[Path]:
    """layers/h_1.npy ... h_L.npy; h_L is the final layer's output (the logits)."""
    return [Path(folder) / f"h_{i + 1}.npy" for i in range(num_layers)]


def batches(rows: np.ndarray | None, num_nodes: int, batch_size: int):
    """Sorted destination ids per batch: contiguous ranges for all nodes, chunks of `rows` otherwise."""
    if rows is None:
        for lo in range(0, num_nodes, batch_size):
            yield np.arange(lo, min(lo + batch_size, num_nodes), dtype=np.int64)
    else:
        for lo in range(0, len(rows), batch_size):
            yield rows[lo : lo + batch_size]


class _Released:
    """Features have no pages of ours to drop; layer files do (in 'disk' mode)."""

    def __init__(self, src):
        self.src = src

    def gather(self, ids):
        return self.src.gather(ids)

    def release(self):
        release = getattr(self.src, "release", None)
        if release is not None:
            release()


def run_layers(
    model,
    adj: Adjacency,
    features: RowSource,
    paths: Sequence[Path],
    *,
    mode: str,
    batch_size: int,
    rows: Sequence[np.ndarray | None] | None = None,
    create: bool | Sequence[bool] = True,
    device: torch.device = torch.device("cpu"),
    progress: Callable[[int, int, int], None] | None = None,
) -> list[LayerStats]:
    """Compute layer outputs into `paths` (one .npy per layer).

    rows[l] = the sorted node ids layer l must (re)compute, or None for every node. Where create[l] is False
    the file exists already (copied from a previous run) and only those rows are overwritten.
    progress(layer, done_rows, total_rows) is called after every batch.
    """
    n = adj.num_nodes
    num_layers = model.num_layers
    rows = list(rows) if rows is not None else [None] * num_layers
    create = [create] * num_layers if isinstance(create, bool) else list(create)
    # GraphConv normalises by the source's out-degree *in the block*, which for a batch of destinations
    # is not its degree in the graph; rescaling each source row by sqrt(d_block / d_graph) makes the
    # block's normalisation equal the full graph's (GraphConv is linear in its input rows).
    out_deg = torch.from_numpy(adj.out_degrees()).clamp_(min=1).double() if model.arch == "gcn" else None
    stats: list[LayerStats] = []
    prev: LayerFile | None = None
    with torch.no_grad():
        for layer in range(num_layers):
            t0 = time.time()
            inp = _Released(features if layer == 0 else prev)
            dim = model.dims[layer + 1]
            out = LayerFile(paths[layer], shape=(n, dim) if create[layer] else None, mode=mode)
            todo = rows[layer]
            total = n if todo is None else len(todo)
            done = edges = 0
            for dst in batches(todo, n, batch_size):
                if model.arch == "mlp":  # features only: the block just marks the destinations
                    ip, src = np.zeros(len(dst) + 1, dtype=np.int64), np.empty(0, dtype=np.int64)
                else:
                    ip, src = adj.in_edges(dst)
                block, src_ids = make_block(dst, ip, src)
                x = inp.gather(src_ids).to(torch.float32)
                if out_deg is not None:
                    blk_deg = block.out_degrees().clamp(min=1).double()
                    x = x * (blk_deg / out_deg[src_ids]).sqrt().to(x.dtype).unsqueeze(1)
                y = model.layer_forward(layer, block.to(device), x.to(device)).to("cpu", torch.float32)
                out.write(dst, y)
                inp.release()
                out.release()
                done += len(dst)
                edges += len(src)
                if progress is not None:
                    progress(layer, done, total)
            out.flush()
            if prev is not None:
                prev.close()
            prev = out
            stats.append(LayerStats(layer + 1, dim, total, edges, time.time() - t0))
    if prev is not None:
        prev.close()
    return stats


def full_graph_forward(model, graph, features: torch.Tensor) -> list[torch.Tensor]:
    """The naive reference: every layer on the whole graph at once (all of one layer's activations in RAM).

    Returns every layer's output; used by the tests and the benchmark to check layer-wise results.
    """
    outs = []
    with torch.no_grad():
        h = features.to(torch.float32)
        for layer in range(model.num_layers):
            h = model.layer_forward(layer, graph, h)
            outs.append(h)
    return outs
