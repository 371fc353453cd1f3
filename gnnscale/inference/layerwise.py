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
from gnnscale.inference.projected import Projections, layer_from_projections, projectable
from gnnscale.inference.streamfile import StreamWriter
from gnnscale.inference.tiled import FeatureChunks, LayerChunks, plan_tiles, tiled_layer
from gnnscale.models.sums import sums_before_projecting
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.utils.ui import info


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
    method: str | None = None  # an update's: delta | full | rows | reused (see inference/update.py)
    detail: dict | None = None

    def as_dict(self) -> dict:
        out = {
            "layer": self.layer,
            "dim": self.dim,
            "rows_computed": self.rows,
            "edges": self.edges,
            "seconds": round(self.seconds, 3),
            "sources": self.sources,
        }
        if self.method is not None:
            out["method"] = self.method
        return {**out, **(self.detail or {})}


def layer_paths(folder: Path, num_layers: int) -> list[Path]:
    """layers/h_1.npy ... h_L.npy; h_L is the final layer's output (the logits)."""
    return [Path(folder) / f"h_{i + 1}.npy" for i in range(num_layers)]


def preact_path(h_path: Path) -> Path:
    """layers/z_l.npy: the conv output of layer l (before its norm and activation), next to h_l.npy."""
    return Path(h_path).with_name("z_" + Path(h_path).name[2:])


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


def staged_features(features, n: int, dim: int, path: Path, mode: str, chunk: int = 1 << 16) -> _Input:
    """The features as one [N, F] float32 tensor to read in place: the store's own if it is one, else a copy."""
    full = getattr(features, "_full", None)
    if isinstance(full, torch.Tensor) and full.dtype == torch.float32 and full.shape == (n, dim):
        return _Input(features, full)
    # 'memory' stages into the heap: filling fresh page cache cost several times more than fresh heap on
    # the benchmark machine (a VM), and the copy lives only for the first layer. 'disk' keeps it a file.
    staged = _HeapRows(n, dim) if mode == "memory" else LayerFile(path, shape=(n, dim), mode=mode)
    if hasattr(features, "copy_into"):
        features.copy_into(staged)
    elif isinstance(features, FeatureStore) and features.feat_dim == features.stored_dim:
        copy_shard_features(features.graph, staged)  # the shards' rows as they are (no degree column)
    else:
        for lo in range(0, n, chunk):
            ids = np.arange(lo, min(lo + chunk, n), dtype=np.int64)
            staged.write(ids, features.gather(torch.from_numpy(ids)).to(torch.float32))
            staged.release()
    staged.release()
    return _Input(staged, staged.tensor, owned=staged if isinstance(staged, LayerFile) else None)


class _HeapRows:
    """An [N, F] float32 tensor with LayerFile's writing interface."""

    def __init__(self, n: int, dim: int):
        self.tensor = torch.empty((n, dim), dtype=torch.float32)

    def write_range(self, lo: int, rows: torch.Tensor) -> None:
        self.tensor[lo : lo + len(rows)] = rows

    def write(self, ids: np.ndarray, rows: torch.Tensor) -> None:
        self.tensor[torch.from_numpy(np.asarray(ids, dtype=np.int64))] = rows.to(torch.float32)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.tensor, 0, ids)

    def release(self) -> None:
        pass


def copy_shard_features(graph, out) -> None:
    """Every shard's feature rows into out ([N, F] float32 rows with write_range), one write per shard."""
    starts = graph.node_starts
    for i in range(graph.num_shards):
        out.write_range(int(starts[i]), graph.shard(i)["feat"].to(torch.float32))
        out.release()


def finish_layer(model, i: int, z: torch.Tensor) -> torch.Tensor:
    """Layer i's output from its conv's output z (norm, activation, dropout in eval: row-wise, exact).

    The model's own post-conv step, which layer_forward also uses, so the cached pre-activations and
    the outputs can never follow two versions of the model. May modify z in place (relu_).
    """
    return model.after_conv(i, z)


def caches_preactivation(model, i: int) -> bool:
    """Whether layer i's conv output is worth caching: a linear aggregator that --update can propagate
    a change through (delta.py), and a hidden layer (the last layer's output is its conv output)."""
    from gnnscale.inference.propagate import propagates

    return i < model.num_layers - 1 and model.arch == "sage" and propagates(model.layers[i])


class LayerContext:
    """What every batch of a layer shares: the block builder and the GCN degree correction."""

    def __init__(self, model, adj: Adjacency, device: torch.device):
        self.model, self.adj, self.device = model, adj, device
        self.builder = BlockBuilder(adj.num_nodes)
        # GraphConv normalises by the source's out-degree *in the block*, which for a batch of destinations
        # is not its degree in the graph; rescaling each source row by sqrt(d_block / d_graph) makes the
        # block's normalisation equal the full graph's (GraphConv is linear in its input rows).
        self.out_deg = (
            torch.from_numpy(adj.out_degrees()).clamp_(min=1).double() if model.arch == "gcn" else None
        )

    def in_place(self, layer: int) -> bool:
        """Read the input array in place (no gather of ~U rows per batch) when the layer allows it; on an
        accelerator the rows have to move anyway, so gather just the needed ones there."""
        model = self.model
        return (
            self.device.type == "cpu" and model.arch != "mlp" and reads_sources_by_edge(model.layers[layer])
        )


def compute_layer(
    ctx: LayerContext,
    layer: int,
    inp: _Input,
    in_place: bool,
    out: LayerFile,
    *,
    batch_size: int,
    rows: np.ndarray | None = None,
    z_out: LayerFile | None = None,
    keep=None,
    progress: Callable[[int, int, int], None] | None = None,
    project: Projections | None = None,
) -> tuple[int, int]:
    """Layer `layer` for the sorted destination ids `rows` (None: every node) into `out` (and its conv
    outputs into z_out). keep("z" | "h", lo, rows): a hook that may change the rows lo.. of a contiguous
    batch before they are written (an update restores the rows it did not need to change). project:
    the next layer's projections, filled from this layer's outputs (every node, contiguous batches).
    Returns (rows, edges)."""
    model, adj, n = ctx.model, ctx.adj, ctx.adj.num_nodes
    conv = model.layers[layer] if model.arch != "mlp" else None
    total = n if rows is None else len(rows)
    done = edges = 0
    step = batch_size
    dim = model.dims[layer + 1]
    if in_place and projects_sources(conv):
        # Read in place, this layer projects all N source rows once per batch (N x out, narrow),
        # and its per-batch activations scale with out, not in: wider batches cost no more memory
        # per destination and amortise the projection (1 batch = what a full-graph forward does).
        step = batch_size * -(-model.dims[layer] // dim)
    emit = _Emit(ctx, layer, out, z_out, keep, project)
    for dst in batches(rows, n, step):
        if conv is None:  # features only: the block just marks the destinations
            ip, src = np.zeros(len(dst) + 1, dtype=np.int64), np.empty(0, dtype=np.int64)
        else:
            ip, src = adj.in_edges(dst)
        if in_place:
            block = ctx.builder.global_(dst, ip, src)
            x = (inp.tensor, inp.dst_rows(dst))
        else:
            block, src_ids = ctx.builder.compact(dst, ip, src)
            x = inp.gather(src_ids).to(torch.float32)
            if ctx.out_deg is not None:
                blk_deg = block.out_degrees().clamp(min=1).double()
                x = x * (blk_deg / ctx.out_deg[src_ids]).sqrt().to(x.dtype).unsqueeze(1)
            block, x = block.to(ctx.device), x.to(ctx.device)
        emit(dst, model.layer_forward(layer, block, x, finish=False))
        inp.release()
        done += len(dst)
        edges += len(src)
        if progress is not None:
            progress(layer, done, total)
    return total, edges


class _Emit:
    """A batch's conv output z on its way out: z_out, the norm and activation, out, the next layer's
    projections (the same steps whichever way z was computed)."""

    def __init__(self, ctx, layer: int, out, z_out, keep, project: Projections | None):
        self.ctx, self.layer, self.out, self.z_out = ctx, layer, out, z_out
        self.keep, self.project = keep, project

    def __call__(self, dst: np.ndarray, z: torch.Tensor) -> None:
        """z on the model's device; everything written is float32 on the CPU."""
        lo = int(dst[0])
        if self.z_out is not None:
            zc = z.to("cpu", torch.float32)  # z itself on the CPU: keep's changes reach the finish below
            if self.keep is not None:
                self.keep("z", lo, zc)
            self.z_out.write(dst, zc)
            self.z_out.release()
            z = zc.to(z.device)
        y = finish_layer(self.ctx.model, self.layer, z).to("cpu", torch.float32)
        if self.keep is not None:
            self.keep("h", lo, y)
        self.out.write(dst, y)
        self.out.release()
        if self.project is not None:
            self.project.add(lo, y)


def open_input(
    features,
    layer: int,
    prev: LayerFile | None,
    in_place: bool,
    todo,
    n: int,
    dim: int,
    path: Path,
    mode: str,
):
    """(input, in place?) of a layer: the previous layer's file, or the features (staged into one file
    when the layer reads them in place over enough rows to pay for one pass over them)."""
    if layer > 0:
        return _Input(prev, prev.tensor), in_place
    if in_place and (todo is None or len(todo) >= n // 8):
        return staged_features(features, n, dim, path, mode), True
    return _Input(features), False


def run_layers(
    model,
    adj: Adjacency,
    features: RowSource,
    paths: Sequence[Path],
    *,
    mode: str,
    batch_size: int,
    preact: Sequence[Path | None] | None = None,
    device: torch.device = torch.device("cpu"),
    progress: Callable[[int, int, int], None] | None = None,
    free_bytes: int | None = None,
) -> list[LayerStats]:
    """Every node's layer outputs into `paths` (one .npy per layer), and conv outputs into preact[l] where
    given. progress(layer, done_rows, total_rows) is called after every batch. free_bytes: the memory a
    layer may take beyond what the process holds; given, a summing layer streams its input by tiles
    (tiled.py) instead of mapping it. (An update's layers: inference/update.py, over the same compute_layer.)
    """
    n = adj.num_nodes
    num_layers = model.num_layers
    preact = list(preact) if preact is not None else [None] * num_layers
    ctx = LayerContext(model, adj, device)
    stats: list[LayerStats] = []
    prev: LayerFile | None = None
    project: Projections | None = None  # this layer's input, projected as the layer before wrote it
    with torch.no_grad():
        for layer in range(num_layers):
            t0 = time.time()
            dim = model.dims[layer + 1]
            nxt = next_projections(model, layer, n, device)
            # Nobody reads the conv outputs in this run, nor a layer's rows when the next layer starts
            # from their projections (or there is none): they bypass the page cache (streamfile.py).
            # Filling fresh page cache was the largest cost beside the compute: pwrite took 2.2 s of a
            # 6 s run (500k nodes, two 512 MB layers).
            read_back = nxt is None and layer + 1 < num_layers
            out = (
                LayerFile(paths[layer], shape=(n, dim), mode=mode)
                if read_back
                else StreamWriter(paths[layer], (n, dim))
            )
            z_out = StreamWriter(preact[layer], (n, dim)) if preact[layer] else None
            if project is not None:
                total, edges, how = (
                    n,
                    _from_projections(ctx, layer, project, out, z_out, nxt, batch_size, progress),
                    "projected",
                )
            else:
                total, edges, how = _compute(
                    ctx,
                    layer,
                    features,
                    prev,
                    out,
                    z_out,
                    nxt,
                    paths,
                    mode=mode,
                    batch_size=batch_size,
                    progress=progress,
                    free_bytes=free_bytes,
                )
            if z_out is not None:
                z_out.close()
            if prev is not None:
                prev.close()
            prev, project = out, nxt
            stats.append(LayerStats(layer + 1, dim, total, edges, time.time() - t0, how))
    if prev is not None:
        prev.close()
    return stats


def next_projections(model, layer: int, n: int, device: torch.device) -> Projections | None:
    """The next layer's projections, to fill from this layer's outputs, where the next layer projects
    its sources (in > out): it then never reads this layer's wide rows back (projected.py)."""
    if device.type != "cpu" or layer + 1 >= model.num_layers or model.arch != "sage":
        return None
    conv = model.layers[layer + 1]
    return Projections(conv, n) if projectable(conv) else None


def _from_projections(ctx, layer, project, out, z_out, nxt, batch_size, progress) -> int:
    model = ctx.model

    def keep(kind: str, lo: int, rows: torch.Tensor) -> None:
        if kind == "h" and nxt is not None:
            nxt.add(lo, rows)

    def done(rows: int, total: int) -> None:
        if progress is not None:
            progress(layer, rows, total)

    finish = None if layer == model.num_layers - 1 else (lambda z: finish_layer(model, layer, z))
    return layer_from_projections(
        project, ctx.adj, out, z_out, finish, keep, batch_size=batch_size, progress=done
    )


def _compute(ctx, layer, features, prev, out, z_out, nxt, paths, *, mode, batch_size, progress, free_bytes):
    """(rows, edges, how) of a layer computed from its input rows: streamed by tiles where they do not
    fit (free_bytes given) and the layer sums them, else read in place or gathered per batch."""
    model, n = ctx.model, ctx.adj.num_nodes
    in_dim = model.dims[layer]
    streams = layer > 0 or isinstance(features, FeatureStore)  # FeatureChunks reads a store's shards
    if (
        free_bytes is not None
        and streams
        and ctx.device.type == "cpu"
        and sums_before_projecting(model.layers[layer])
    ):
        free = free_bytes - (nxt.nbytes if nxt is not None else 0)
        free -= 6 * batch_size * (in_dim + model.dims[layer + 1]) * 4  # one batch's dense part
        plan = plan_tiles(n, ctx.adj.num_edges, in_dim, free, batch_size, ctx.adj.indices.dtype.itemsize)
        info(f"layer {layer + 1} reads its input from disk, {plan.describe(n)}")
        source = FeatureChunks(features) if layer == 0 else LayerChunks(prev)
        emit = _Emit(ctx, layer, out, z_out, None, nxt)

        def each(lo: int, z: torch.Tensor) -> None:
            emit(np.arange(lo, lo + len(z), dtype=np.int64), z)

        def done(rows: int) -> None:
            if progress is not None:
                progress(layer, rows, n)

        try:
            total, edges = tiled_layer(
                ctx, layer, source, batch_size=batch_size, plan=plan, emit=each, progress=done
            )
        finally:
            source.close()
        return total, edges, plan.describe(n)
    inp, in_place = open_input(
        features,
        layer,
        prev,
        ctx.in_place(layer),
        None,
        n,
        model.dims[0],
        Path(paths[0]).with_name("h_0.npy.partial"),
        mode,
    )
    try:
        total, edges = compute_layer(
            ctx, layer, inp, in_place, out, batch_size=batch_size, z_out=z_out, progress=progress, project=nxt
        )
    finally:
        inp.close()
    return total, edges, "in place" if in_place else "gathered"


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
