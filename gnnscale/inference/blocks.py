"""Full-neighbour DGL blocks straight from CSC rows, over the stored graph or the graph plus an edge delta.

This is what `MultiLayerFullNeighborSampler(1)` yields for a batch of destination nodes (every in-edge,
destinations first among the sources), built by slicing the mmap'd CSC instead of going through the
sampler: a contiguous batch is one slice of `indices`, and an edge delta can be applied per row.
"""

from __future__ import annotations

import numpy as np
import torch

_SCAN_CHUNK = 1 << 22  # edges per step when scanning every edge (bounded heap)


def rows_edges(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edge positions of the given (sorted) rows in CSC order, and each position's row index in `rows`."""
    starts = np.asarray(indptr[rows], dtype=np.int64)
    lens = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    total = int(lens.sum())
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), lens)
    offs = np.cumsum(lens) - lens
    pos = np.arange(total, dtype=np.int64) - offs[owner] + starts[owner]
    return pos, owner


class Adjacency:
    """In-edges per destination: the CSC arrays (mmap) minus removed base edges plus added edges."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, removed_pos=None, add_src=None, add_dst=None):
        self.indptr, self.indices = indptr, indices
        self.num_nodes = len(indptr) - 1
        empty = np.empty(0, dtype=np.int64)
        self.removed_pos = np.asarray(removed_pos if removed_pos is not None else empty, dtype=np.int64)
        add_src = np.asarray(add_src if add_src is not None else empty, dtype=np.int64)
        add_dst = np.asarray(add_dst if add_dst is not None else empty, dtype=np.int64)
        # Keep added edges in (dst, src) order so a patched row reads like a CSC row.
        order = np.lexsort((add_src, add_dst))
        self.add_src, self.add_dst = add_src[order], add_dst[order]
        self.has_delta = len(self.removed_pos) > 0 or len(self.add_src) > 0

    @property
    def num_edges(self) -> int:
        return len(self.indices) - len(self.removed_pos) + len(self.add_src)

    def in_edges(self, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(local indptr [len(dst)+1], global sources [E]) of the sorted destination ids `dst`."""
        n = len(dst)
        contiguous = n > 0 and int(dst[-1]) - int(dst[0]) + 1 == n
        if contiguous:
            a, b = int(self.indptr[dst[0]]), int(self.indptr[dst[-1] + 1])
            ip = np.asarray(self.indptr[dst[0] : dst[-1] + 2], dtype=np.int64) - a
            if not self.has_delta:
                return ip, np.asarray(self.indices[a:b], dtype=np.int64)
            pos = np.arange(a, b, dtype=np.int64)
            owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(ip))
        else:
            pos, owner = rows_edges(self.indptr, dst)
            if not self.has_delta:
                ip = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(np.bincount(owner, minlength=n), out=ip[1:])
                return ip, np.asarray(self.indices[pos], dtype=np.int64)
        src = np.asarray(self.indices[pos], dtype=np.int64)
        if len(self.removed_pos):
            keep = ~_sorted_isin(pos, self.removed_pos)
            src, owner = src[keep], owner[keep]
        if len(self.add_dst):
            lo = np.searchsorted(self.add_dst, dst, side="left")
            hi = np.searchsorted(self.add_dst, dst, side="right")
            cnt = hi - lo
            if cnt.any():
                sel = (
                    np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                ) + np.repeat(lo, cnt)
                src = np.concatenate([src, self.add_src[sel]])
                owner = np.concatenate([owner, np.repeat(np.arange(n, dtype=np.int64), cnt)])
                order = np.lexsort((src, owner))
                src, owner = src[order], owner[order]
        ip = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner, minlength=n), out=ip[1:])
        return ip, src

    def out_neighbours(self, mask: np.ndarray) -> np.ndarray:
        """Bool mask of every node with an in-edge from a masked node (one streamed scan of the edges)."""
        hit = np.zeros(self.num_nodes, dtype=bool)
        if not mask.any():
            return hit
        for a in range(0, len(self.indices), _SCAN_CHUNK):
            b = min(a + _SCAN_CHUNK, len(self.indices))
            pos = np.nonzero(mask[np.asarray(self.indices[a:b])])[0] + a
            if len(self.removed_pos) and len(pos):
                pos = pos[~_sorted_isin(pos, self.removed_pos)]
            if len(pos):
                hit[np.searchsorted(self.indptr, pos, side="right") - 1] = True
        if len(self.add_src):
            hit[self.add_dst[mask[self.add_src]]] = True
        return hit

    def out_degrees(self) -> np.ndarray:
        deg = np.zeros(self.num_nodes, dtype=np.int64)
        for a in range(0, len(self.indices), _SCAN_CHUNK):
            deg += np.bincount(np.asarray(self.indices[a : a + _SCAN_CHUNK]), minlength=self.num_nodes)
        if len(self.removed_pos):
            np.subtract.at(deg, np.asarray(self.indices[self.removed_pos]), 1)
        if len(self.add_src):
            np.add.at(deg, self.add_src, 1)
        return deg


def _sorted_isin(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(sorted_set, values)
    idx[idx == len(sorted_set)] = 0
    return sorted_set[idx] == values


def make_block(dst: np.ndarray, ip: np.ndarray, src: np.ndarray):
    """A DGL block for sorted destination ids `dst` with CSC in-edges (ip, global src).

    Sources are the destinations first (DGL's block convention, which SAGEConv relies on to find each
    destination's own row) followed by the other distinct sources in increasing id order, so the
    gathers from a layer array read forward through it. Returns (block, source ids).
    """
    import dgl

    dst_t = torch.from_numpy(np.ascontiguousarray(dst, dtype=np.int64))
    src_t = torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64))
    n_dst = len(dst_t)
    uniq, inv = torch.unique(src_t, sorted=True, return_inverse=True)
    if n_dst:
        at = torch.searchsorted(dst_t, uniq).clamp_(max=n_dst - 1)
        in_dst = dst_t[at] == uniq
    else:
        at, in_dst = torch.zeros_like(uniq), torch.zeros(len(uniq), dtype=torch.bool)
    extra = ~in_dst
    local = torch.where(in_dst, at, n_dst + torch.cumsum(extra, 0) - 1)
    src_ids = torch.cat([dst_t, uniq[extra]])
    block = dgl.create_block(
        (
            "csc",
            (
                torch.from_numpy(np.ascontiguousarray(ip, dtype=np.int64)),
                local[inv],
                torch.arange(len(src_t)),
            ),
        ),
        num_src_nodes=len(src_ids),
        num_dst_nodes=n_dst,
    )
    block.srcdata[dgl.NID] = src_ids
    block.dstdata[dgl.NID] = dst_t
    return block, src_ids
