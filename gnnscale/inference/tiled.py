"""A summing SAGE layer (chunked.py) whose input does not fit in memory: destination tiles, streamed sources.

The destinations are taken a tile at a time, as many as the memory plan allows their running sums for
(tile rows x in x 4 B, with the tile's CSC slice). For each tile the layer's input is read once, front
to back, a source chunk at a time (O_DIRECT spans of the feature shards, or the previous layer's file),
the next chunk read while the current one is summed; every destination adds its chunk's neighbour sum.
A random graph's batch of destinations needs rows from all over the file, so reading each row once per
tile replaces reading it once per in-neighbour's batch (about avg-degree times). The tile's sums then
go through the layer's dense part batch by batch, exactly as an in-memory run's batches do.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from gnnscale.inference.chunked import ChunkEdges, carried_sum
from gnnscale.models.sums import sage_from_sums
from gnnscale.utils.alloc import release_free_heap

# Destinations summed at once (their running sums are copied in front of each chunk's rows: the carry):
# one DGL call per chunk for this many; 16,384 took 0.7x the time of 4,096 (1M nodes, 10 chunks).
SUM_ROWS = 16384

# Of the memory left, the share tiles plan for: the rest absorbs the allocator's slack (a 5M-node
# layer's peak came out 3 % above a plan that used it all).
PLANNED_SHARE = 0.9
# A source chunk: large enough that a chunk's sums are few, long reads (the rest of free memory goes to
# the tiles, and fewer tiles mean fewer passes over the input), small beside a capped run's memory.
MAX_CHUNK_BYTES = 256 << 20
MIN_CHUNK_BYTES = 16 << 20
_PIECE_BYTES = 16 << 20  # one O_DIRECT read of a shard span: many requests in flight, a small buffer


class FeatureChunks:
    """The feature rows (as float32, degree column included) of a FeatureStore, a source chunk at a time,
    read with O_DIRECT spans (storage/feature_reader.py): no page cache, no faults."""

    def __init__(self, features):
        from gnnscale.storage.feature_reader import FeatureReader

        self.features = features
        self.reader = FeatureReader(features.graph)
        self.dim = features.feat_dim
        self.starts = np.asarray(features.graph.node_starts, dtype=np.int64)
        self._piece_rows = max(1, _PIECE_BYTES // self.reader.row_bytes)
        self._bufs = [self.reader.span_buffer(self._piece_rows) for _ in range(2)]

    def read(self, lo: int, hi: int, out: torch.Tensor) -> None:
        """Rows [lo, hi) into out[: hi - lo]; the next piece is read while the last one is copied."""
        stored = self.features.stored_dim
        pieces = []
        for s in range(len(self.starts) - 1):
            a, b = max(lo, int(self.starts[s])), min(hi, int(self.starts[s + 1]))
            pieces += [(p, min(p + self._piece_rows, b)) for p in range(a, b, self._piece_rows)]
        job = self.reader.read_span(*pieces[0], self._bufs[0]) if pieces else None
        for i, (a, b) in enumerate(pieces):
            rows = job.result()
            if i + 1 < len(pieces):
                job = self.reader.read_span(*pieces[i + 1], self._bufs[(i + 1) % 2])
            out[a - lo : b - lo, :stored] = rows.view(self.features.dtype).view(b - a, stored)
        if self.features._logdeg is not None:
            out[: hi - lo, -1] = self.features._logdeg[lo:hi]

    def rows(self, lo: int, hi: int) -> torch.Tensor:
        return self.features.gather(torch.arange(lo, hi)).to(torch.float32)

    def close(self) -> None:
        self.reader.close()


class LayerChunks:
    """A previous layer's rows (a LayerFile) a source chunk at a time: sequential reads of its file."""

    def __init__(self, layer_file):
        self.file = layer_file
        self.dim = layer_file.shape[1]

    def read(self, lo: int, hi: int, out: torch.Tensor) -> None:
        buf = memoryview(out[: hi - lo].numpy()).cast("B")
        at, fd = self.file.offset + lo * self.file.row_bytes, self.file._fh.fileno()
        while len(buf):
            got = os.preadv(fd, [buf], at)
            if got <= 0:
                raise OSError(f"{self.file.path} ended early at byte {at}")
            buf, at = buf[got:], at + got

    def rows(self, lo: int, hi: int) -> torch.Tensor:
        return self.file.tensor[lo:hi].clone()

    def close(self) -> None:
        pass


def streamed(source, bounds: np.ndarray):
    """(chunk, buffer) for every source chunk in order, chunk c + 1 read while chunk c is used; a buffer
    holds the chunk's rows after SUM_ROWS rows of carry area (chunked.carried_sum)."""
    most = int(np.diff(bounds).max())
    bufs = [torch.empty((SUM_ROWS + most, source.dim), dtype=torch.float32) for _ in range(2)]

    def load(c: int) -> torch.Tensor:
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        buf = bufs[c % 2]
        source.read(lo, hi, buf[SUM_ROWS:])
        return buf[: SUM_ROWS + hi - lo]

    with ThreadPoolExecutor(1, thread_name_prefix="gnnscale-chunks") as pool:
        nxt = pool.submit(load, 0)
        for c in range(len(bounds) - 1):
            buf = nxt.result()
            if c + 1 < len(bounds) - 1:
                nxt = pool.submit(load, c + 1)
            yield c, buf


@dataclass(frozen=True)
class TilePlan:
    """How a summing layer streams its input: destinations per tile, source rows per chunk."""

    tile_rows: int
    chunk_rows: int

    def bounds(self, num_nodes: int) -> np.ndarray:
        return np.append(np.arange(0, num_nodes, self.chunk_rows, dtype=np.int64), np.int64(num_nodes))

    def describe(self, num_nodes: int) -> str:
        tiles, chunks = -(-num_nodes // self.tile_rows), len(self.bounds(num_nodes)) - 1
        rows = min(self.tile_rows, num_nodes)
        return f"streamed: {tiles} tile{'s' * (tiles > 1)} of {rows:,} rows, input read in {chunks} chunks per tile"


def plan_tiles(
    num_nodes: int, num_edges: int, in_dim: int, free_bytes: int, step: int, edge_bytes: int = 4
) -> TilePlan:
    """Chunk buffers (two, with their carry areas, and the reader's pieces) first, then as many
    destinations per tile as the rest holds (a multiple of the layer's batch step, at least one step):
    each a running sum, its in-edges' sources as stored (edge_bytes), its (row, chunk) segment starts."""
    row = in_dim * 4
    free_bytes = int(free_bytes * PLANNED_SHARE)
    chunk_bytes = min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, free_bytes // 8), num_nodes * row)
    chunk_rows = max(1, chunk_bytes // row)
    left = free_bytes - 2 * (SUM_ROWS + chunk_rows) * row - 2 * _PIECE_BYTES
    chunks = -(-num_nodes // chunk_rows)
    per_row = row + num_edges / max(1, num_nodes) * edge_bytes + 8 * chunks
    rows = int(max(0, left) // per_row) // step * step
    return TilePlan(max(step, min(rows, -(-num_nodes // step) * step)), int(chunk_rows))


def tiled_layer(
    ctx, layer: int, source, *, batch_size: int, plan: TilePlan, emit, progress=None
) -> tuple[int, int]:
    """Layer `layer` for every node, plan.tile_rows destinations at a time; emit(lo, z) takes each
    batch's conv output (as compute_layer's batches would give it). progress(rows): a tile's sums count
    for the first half of its rows, its batches for the second. Returns (rows, edges)."""
    model, adj = ctx.model, ctx.adj
    conv, n = model.layers[layer], adj.num_nodes
    bounds, tile = plan.bounds(n), plan.tile_rows
    indptr = adj.indptr
    edges = 0
    for t0 in range(0, n, tile):
        t1 = min(n, t0 + tile)
        a, b = int(indptr[t0]), int(indptr[t1])
        ip = np.asarray(indptr[t0 : t1 + 1], dtype=np.int64) - a
        src = np.array(adj.indices[a:b])  # the tile's CSC slice in the heap, as stored (int32 mostly)
        edges += b - a
        # each batch of the tile in pieces of at most SUM_ROWS destinations: [(batch start, piece starts)]
        cuts = [
            (b0, list(range(b0, min(b0 + batch_size, t1 - t0), SUM_ROWS)))
            for b0 in range(0, t1 - t0, batch_size)
        ]
        spans = [(r, min(r + SUM_ROWS, b0 + batch_size, t1 - t0)) for b0, rs in cuts for r in rs]
        splits = [ChunkEdges(ip[r0 : r1 + 1] - ip[r0], src[ip[r0] : ip[r1]], bounds) for r0, r1 in spans]
        sums: list[torch.Tensor] = [torch.empty(0)] * len(splits)  # per piece: DGL's output, no copy back
        for c, buf in streamed(source, bounds):
            for i, split in enumerate(splits):
                if c > 0:
                    buf[: split.rows] = sums[i]
                sums[i] = carried_sum(*split.edges(c), buf, SUM_ROWS, carry=c > 0)
            if progress is not None:
                progress(t0 + (t1 - t0) * (c + 1) // (2 * (len(bounds) - 1)))
        del splits, src
        # The chunks' sums, freed below glibc's grown mmap threshold, leave holes in the heap that the
        # batches below do not fit (and theirs the next tile's chunks): the peak went 40 MB past a 660 MB
        # budget on 1M nodes, and a 734 MB cgroup's kernel killed the run. Handed back here and after the
        # batches: peak 597-618 MB, for ~8% more CPU (the pages fault in again once per tile).
        release_free_heap()
        deg = torch.from_numpy(np.diff(ip))
        first = 0
        for b0, rs in cuts:
            lo, hi = t0 + b0, min(t0 + b0 + batch_size, t1)
            part = sums[first] if len(rs) == 1 else torch.cat(sums[first : first + len(rs)])
            first += len(rs)
            emit(lo, sage_from_sums(conv, part, deg[b0 : hi - t0], source.rows(lo, hi)))
            if progress is not None:
                progress(t0 + (t1 - t0 + hi - t0) // 2)
        del sums
        release_free_heap()
    return n, edges
