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

from gnnscale.inference.blocks import Adjacency, BlockBuilder, projects_sources, reads_sources_by_edge
from gnnscale.inference.layerfile import LayerFile
from gnnscale.storage.feature_store import FeatureStore


class RowSource(Protocol):
    def gather(self, ids: torch.Tensor) -> torch.Tensor: ...


@dataclass
class LayerStats:
    layer: int
    dim: int
    rows: int
    edges: int
    seconds: float
    sources: str = "gathered"  # 'in place': the blocks read the input array directly

    def as_dict(self) -> dict:
        return {
            "layer": self.layer,
            "dim": self.dim,
            "rows_computed": self.rows,
            "edges": self.edges,
            "seconds": round(self.seconds, 3),
            "sources": self.sources,
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


class _Input:
    """A layer's input rows: a layer file (or the features, staged into one when read in place)."""

    def __init__(self, src, tensor: torch.Tensor | None = None, owned: LayerFile | None = None):
        self.src, self.tensor, self.owned = src, tensor, owned

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tensor is not None:
            return torch.index_select(self.tensor, 0, ids)
        return self.src.gather(ids)

    def dst_rows(self, dst: np.ndarray) -> torch.Tensor:
        lo, hi = int(dst[0]), int(dst[-1]) + 1
        return self.tensor[lo:hi] if hi - lo == len(dst) else self.gather(torch.from_numpy(dst))

    def release(self) -> None:
        release = getattr(self.src, "release", None)
        if release is not None:
            release()

    def close(self) -> None:
        if self.owned is not None:
            self.owned.close()
            self.owned.path.unlink()


def _staged_features(features, n: int, dim: int, path: Path, mode: str, chunk: int = 1 << 16) -> _Input:
    """The features as one [N, F] float32 tensor to read in place: the store's own if it is one, else a copy."""
    full = getattr(features, "_full", None)
    if isinstance(full, torch.Tensor) and full.dtype == torch.float32 and full.shape == (n, dim):
        return _Input(features, full)
    staged = LayerFile(path, shape=(n, dim), mode=mode)
    if hasattr(features, "copy_into"):
        features.copy_into(staged.tensor)
    elif isinstance(features, FeatureStore):
        copy_shard_features(features.graph, staged.tensor)
    else:
        for lo in range(0, n, chunk):
            ids = np.arange(lo, min(lo + chunk, n), dtype=np.int64)
            staged.write(ids, features.gather(torch.from_numpy(ids)).to(torch.float32))
            staged.release()
    staged.release()
    return _Input(staged, staged.tensor, owned=staged)


def copy_shard_features(graph, out: torch.Tensor) -> None:
    """Every shard's feature rows into out[N, F] (float32), one contiguous slice per shard."""
    starts = graph.node_starts
    for i in range(graph.num_shards):
        out[int(starts[i]) : int(starts[i + 1])] = graph.shard(i)["feat"]


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
    builder = BlockBuilder(n)
    stats: list[LayerStats] = []
    prev: LayerFile | None = None
    with torch.no_grad():
        for layer in range(num_layers):
            t0 = time.time()
            todo = rows[layer]
            # Reading the input array in place (no gather of ~U rows per batch) when the layer allows it;
            # on an accelerator the rows have to move anyway, so gather just the needed ones there.
            in_place = (
                device.type == "cpu" and model.arch != "mlp" and reads_sources_by_edge(model.layers[layer])
            )
            if layer > 0:
                inp = _Input(prev, prev.tensor)
            elif in_place and (
                todo is None or len(todo) >= n // 8
            ):  # staging costs one pass over the features
                inp = _staged_features(
                    features, n, model.dims[0], Path(paths[0]).with_name("h_0.npy.partial"), mode
                )
            else:
                inp, in_place = _Input(features), False
            dim = model.dims[layer + 1]
            out = LayerFile(paths[layer], shape=(n, dim) if create[layer] else None, mode=mode)
            total = n if todo is None else len(todo)
            done = edges = 0
            step = batch_size
            if in_place and projects_sources(model.layers[layer]):
                # Read in place, this layer projects all N source rows once per batch (N x out, narrow),
                # and its per-batch activations scale with out, not in: wider batches cost no more memory
                # per destination and amortise the projection (1 batch = what a full-graph forward does).
                step = batch_size * -(-model.dims[layer] // dim)
            for dst in batches(todo, n, step):
                if model.arch == "mlp":  # features only: the block just marks the destinations
                    ip, src = np.zeros(len(dst) + 1, dtype=np.int64), np.empty(0, dtype=np.int64)
                else:
                    ip, src = adj.in_edges(dst)
                if in_place:
                    block = builder.global_(dst, ip, src)
                    y = model.layer_forward(layer, block, (inp.tensor, inp.dst_rows(dst)))
                else:
                    block, src_ids = builder.compact(dst, ip, src)
                    x = inp.gather(src_ids).to(torch.float32)
                    if out_deg is not None:
                        blk_deg = block.out_degrees().clamp(min=1).double()
                        x = x * (blk_deg / out_deg[src_ids]).sqrt().to(x.dtype).unsqueeze(1)
                    y = model.layer_forward(layer, block.to(device), x.to(device))
                out.write(dst, y.to("cpu", torch.float32))
                inp.release()
                out.release()
                done += len(dst)
                edges += len(src)
                if progress is not None:
                    progress(layer, done, total)
            inp.close()
            if prev is not None:
                prev.close()
            prev = out
            stats.append(
                LayerStats(
                    layer + 1, dim, total, edges, time.time() - t0, "in place" if in_place else "gathered"
                )
            )
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
