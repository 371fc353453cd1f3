"""Delta propagation: an update of a linear-aggregator layer from its cached conv outputs (pre-activations).

SAGEConv 'mean' and 'gcn' are linear in their input rows h and affine in the neighbour mean:
  mean: z_v = W_s h_v + W_n (1/d_v) sum_{u in N(v)} h_u + b
  gcn:  z_v = W_n (h_v + sum_{u in N(v)} h_u) / (d_v + 1) + b
so when input rows C change by D_u = h'_u - h_u and some rows' in-edge lists change (N -> N', d -> d'):
  mean: z'_v = r z_v + W_s (h'_v - r h_v) + (1 - r) b + S_v / d'_v,   r = d_v / d'_v  (0 when d'_v = 0)
  gcn:  z'_v = b + r (z_v - b) + ([v in C] W_n D_v + S_v) / (d'_v + 1),   r = (d_v + 1) / (d'_v + 1)
  S_v = sum_{u in N(v), u in C} W_n D_u + W_n (sum_{u added} h'_u - sum_{u removed} h'_u)
(from sum_{N'} h' - sum_N h = sum_N D + sum_{N'} h' - sum_N h'), with r = 1 wherever the in-edges did not
change. The sum over C runs over the base run's in-edges (contiguous CSC slices when that graph is the
stored one); the changed edges are few. A layer then costs |C| projected rows, the edges leaving C and
the changed edges, instead of every affected row's whole neighbourhood; the layer's norm and activation
are row-wise and redone on z'.

The projections of layer l+1 (W_n D_u, W_s D_u, ...) are made while layer l's pass has both versions of
each row in hand (DeltaInputsBuilder), so no layer gathers rows back from a file.

Precision: W_s D_v, which enters z whole, is projected in float64 (and stored rounded); the terms a row
divides by its degree are projected in float32, as the full run computes them; z + delta is formed in
float64 and rounded once. The sum over each row's edges from C runs in float32 through DGL's SpMM: its
float64 kernel was 5-10x slower on the 500k-node benchmark and gave the same maximum error, because what
remains is the base run's own float32 rounding carried in z, about one float32 recomputation's worth per
layer (3.1e-6 and 5.7e-6 for layers 1-2 there, values up to ~10). This is also why a layer that most of
the change reaches is recomputed instead (update.DELTA_MAX_CHANGED): a recomputation from inputs that
differ by that much lands within them, a delta carries both roundings (1.2e-5 on the benchmark's logits
layer, against 6e-6 recomputed). An update of an update starts from rounded z, so the error grows by
about one rounding per link of the chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnnscale.inference.blocks import Adjacency

_CHUNK = 1 << 16  # rows per projection step (bounds the float64 temporaries)
_NO_EIDS = torch.empty(0, dtype=torch.int64)  # dgl.create_block: edge ids are 0..E-1


def propagates(conv) -> bool:
    """Whether a change can be propagated through this conv as a delta (see the module docstring)."""
    import dgl.nn as dglnn

    return (
        isinstance(conv, dglnn.SAGEConv)
        and conv._aggre_type in ("mean", "gcn")
        and conv.activation is None
        and conv.norm is None
    )


@dataclass
class InEdgeChange:
    """Rows whose in-edge list differs between the base run's graph and the updated one, and how."""

    rows: np.ndarray  # sorted node ids
    deg_old: np.ndarray  # their in-degree in the base run's graph
    deg_new: np.ndarray
    edge_row: np.ndarray  # per changed edge (sorted by row): index into rows
    edge_src: np.ndarray
    edge_weight: np.ndarray  # +k: added k times, -k: removed (multigraphs keep duplicate edges)

    @classmethod
    def between(cls, old: Adjacency, new: Adjacency) -> "InEdgeChange":
        """From the two graphs' deltas over the same stored CSC: only the edges either one patches."""
        n = new.num_nodes
        indptr, indices = new.indptr, new.indices

        def removed(adj):  # (dst * n + src) of its removed stored edges
            pos = adj.removed_pos
            dst = np.searchsorted(indptr, pos, side="right") - 1
            return dst * n + np.asarray(indices[pos], dtype=np.int64)

        # net count per (dst, src) in new minus old: a stored edge counts -1 where removed
        key = np.concatenate(
            [new.add_dst * n + new.add_src, removed(old), old.add_dst * n + old.add_src, removed(new)]
        )
        plus = len(new.add_dst) + len(old.removed_pos)
        sign = np.concatenate([np.ones(plus, np.int64), -np.ones(len(key) - plus, np.int64)])
        uniq, inv = np.unique(key, return_inverse=True)
        net = np.bincount(inv, weights=sign, minlength=len(uniq)).astype(np.int64)
        keep = net != 0
        uniq, net = uniq[keep], net[keep]
        rows, edge_row = np.unique(uniq // n, return_inverse=True)
        base = np.asarray(indptr[rows + 1], dtype=np.int64) - np.asarray(indptr[rows], dtype=np.int64)

        def count(dst):  # edges per row of `rows` among destinations dst
            at = np.searchsorted(rows, dst)
            ok = at < len(rows)
            ok[ok] = rows[at[ok]] == dst[ok]
            return np.bincount(at[ok], minlength=len(rows))

        def patched(adj):  # in-degree of `rows` in adj
            gone = count(np.searchsorted(indptr, adj.removed_pos, side="right") - 1)
            return base - gone + count(adj.add_dst)

        return cls(rows, patched(old), patched(new), edge_row.reshape(-1), uniq % n, net)


def _weights(conv):
    """(W_n, W_s or None, b) of a SAGEConv in float64."""
    w_n = conv.fc_neigh.weight.detach().to(torch.float64)
    if conv._aggre_type == "gcn":
        w_s, b = None, conv.bias
    else:
        w_s, b = conv.fc_self.weight.detach().to(torch.float64), conv.fc_self.bias
    out = w_n.shape[0]
    b = b.detach().to(torch.float64) if b is not None else torch.zeros(out, dtype=torch.float64)
    return w_n, w_s, b


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64)


@dataclass
class DeltaInputs:
    """A delta layer's inputs, projected by its own weights (see the module docstring)."""

    changed: np.ndarray  # C: sorted ids of the input rows that changed
    p_n: torch.Tensor  # [|C|, out] float32: W_n D_u
    p_s: torch.Tensor | None  # [|C|, out] float32: W_s D_u ('mean')
    q_r: torch.Tensor | None  # [|R|, out] float32: W_s h_v of the rows with changed in-edges ('mean')
    e_r: torch.Tensor  # [|R|, out] float32: W_n (sum of added h'_u - sum of removed h'_u), per such row


class DeltaInputsBuilder:
    """Collects a layer's DeltaInputs from rows handed over in ascending order (the previous layer's pass,
    or gathers for the first layer): the changed rows in both versions (add_changed), the base version
    of the rows with changed in-edges (add_base, 'mean') and the new version of the changed edges'
    sources (add_sources)."""

    def __init__(self, conv, changed: np.ndarray, edges: InEdgeChange):
        self.w_n, self.w_s, _ = _weights(conv)
        # W_s D_v enters z whole: projected in float64, then stored rounded. The terms a row divides by its
        # degree (W_n D_u, the changed edges' W_n h_u, and W_s h_v, which counts (1 - d/d') ~ 1/d' times)
        # are projected in float32, like the full run's own sums: their rounding shrinks with the degree.
        self.w_n32 = conv.fc_neigh.weight.detach().to(torch.float32)
        self.w_s32 = self.w_s.to(torch.float32) if self.w_s is not None else None
        out = self.w_n.shape[0]
        self.mean = conv._aggre_type == "mean"
        self.changed = changed
        self.p_n = torch.empty((len(changed), out), dtype=torch.float32)
        self.p_s = torch.empty((len(changed), out), dtype=torch.float32) if self.mean else None
        self.q_r = torch.zeros((len(edges.rows), out), dtype=torch.float32) if self.mean else None
        self.e_r = torch.zeros((len(edges.rows), out), dtype=torch.float32)
        self.edges = edges
        self._by_src = np.argsort(edges.edge_src, kind="stable")
        self._src_sorted = edges.edge_src[self._by_src]
        self.need_base = edges.rows if self.mean else np.empty(0, dtype=np.int64)
        self.need_sources = np.unique(edges.edge_src)
        self._done = 0

    def add_changed(self, ids: np.ndarray, new: torch.Tensor, old: torch.Tensor) -> None:
        a, b = self._done, self._done + len(ids)
        if not np.array_equal(self.changed[a:b], ids):
            raise AssertionError("changed rows must arrive in ascending order, each once")
        for lo in range(0, len(ids), _CHUNK):  # bounds the float64 temporaries
            hi = min(lo + _CHUNK, len(ids))
            diff = _f64(new[lo:hi]) - _f64(old[lo:hi])
            if self.mean:
                self.p_s[a + lo : a + hi] = diff @ self.w_s.T
            self.p_n[a + lo : a + hi] = diff.to(torch.float32) @ self.w_n32.T
        self._done = b

    def add_base(self, ids: np.ndarray, old: torch.Tensor) -> None:
        """Base-run rows of `ids`, sorted rows of need_base: W_s h_v."""
        if self.mean and len(ids):
            at = torch.from_numpy(np.searchsorted(self.edges.rows, ids))
            self.q_r[at] = old.to(torch.float32) @ self.w_s32.T

    def add_sources(self, ids: np.ndarray, new: torch.Tensor) -> None:
        """New rows of `ids`: every row of need_sources within [ids[0], ids[-1]], sorted."""
        if not len(ids):
            return
        a, b = np.searchsorted(self._src_sorted, [ids[0], ids[-1] + 1])
        if a < b:
            e = self._by_src[a:b]
            proj = new.to(torch.float32) @ self.w_n32.T
            local = torch.from_numpy(np.searchsorted(ids, self.edges.edge_src[e]))
            weight = torch.from_numpy(self.edges.edge_weight[e].astype(np.float32)).unsqueeze(1)
            self.e_r.index_add_(0, torch.from_numpy(self.edges.edge_row[e]), proj[local] * weight)

    def finish(self) -> DeltaInputs:
        if self._done != len(self.changed):
            raise AssertionError(f"{self._done} of {len(self.changed)} changed rows were handed over")
        return DeltaInputs(self.changed, self.p_n, self.p_s, self.q_r, self.e_r)


def gathered_inputs(conv, changed: np.ndarray, edges: InEdgeChange, new, old) -> DeltaInputs:
    """The first layer's inputs, from row gathers (the changed feature rows are few)."""
    builder = DeltaInputsBuilder(conv, changed, edges)
    for lo in range(0, len(changed), _CHUNK):
        ids = changed[lo : lo + _CHUNK]
        t = torch.from_numpy(ids)
        builder.add_changed(ids, new.gather(t), old.gather(t))
    for lo in range(0, len(builder.need_base), _CHUNK):
        ids = builder.need_base[lo : lo + _CHUNK]
        builder.add_base(ids, old.gather(torch.from_numpy(ids)))
    for lo in range(0, len(builder.need_sources), _CHUNK):
        ids = builder.need_sources[lo : lo + _CHUNK]
        builder.add_sources(ids, new.gather(torch.from_numpy(ids)))
    return builder.finish()


def _within(ids: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return ids[np.searchsorted(ids, lo) : np.searchsorted(ids, hi)]


@dataclass
class DeltaStats:
    rows: int  # rows whose output was updated (the affected set)
    projected: int  # changed input rows (|C|)
    edges_from_changed: int  # edges from C into the updated rows, summed
    changed_edges: int  # added / removed edges, summed

    def as_detail(self) -> dict:
        return {
            "rows_projected": self.projected,
            "edges_from_changed_rows": self.edges_from_changed,
            "changed_edges": self.changed_edges,
        }


def propagate_layer(
    conv,
    finish,
    inputs: DeltaInputs,
    rows: np.ndarray,
    base_adj: Adjacency,
    edges: InEdgeChange,
    z_old,
    z_out,
    h_out,
    *,
    batch_size: int,
    next_inputs: DeltaInputsBuilder | None = None,
    project=None,
    progress=None,
) -> DeltaStats:
    """One layer's new conv outputs (z_out, may be None) and outputs (h_out) for every node.

    rows: sorted ids of the output rows to update; every other row is the base run's, copied.
    z_old: a StreamReader over the base run's conv outputs (for the last layer: its outputs).
    finish(z) -> h applies the layer's norm and activation (None for the last layer). They are row-wise
    and deterministic, so the base run's h is finish(z_old) bit for bit and is not read back: every
    layer file this package writes holds h = finish(z) row by row. Files are read and written in
    contiguous batches, front to back. next_inputs collects the next layer's DeltaInputs as rows pass;
    project (projected.Projections) the next layer's projections, for a next layer recomputed in full.
    """
    import dgl

    n = base_adj.num_nodes
    _, _, b = _weights(conv)
    mean = conv._aggre_type == "mean"
    changed = inputs.changed
    in_c = np.zeros(n, dtype=bool)
    in_c[changed] = True
    pos_c = np.full(n, -1, dtype=np.int64)
    pos_c[changed] = np.arange(len(changed))
    pos_r = np.full(n, -1, dtype=np.int64)
    pos_r[edges.rows] = np.arange(len(edges.rows))
    nb = next_inputs
    # in-degree now = in the base graph, except the rows with changed in-edges
    deg_new_r = np.full(n, -1, dtype=np.int64)
    deg_new_r[edges.rows] = edges.deg_new
    out_dim = inputs.p_n.shape[1]
    # Reused across batches: fresh large buffers every batch cost page faults and zeroing each time.
    zbuf = torch.empty((batch_size, out_dim), dtype=torch.float32)
    hbuf = torch.empty((batch_size, out_dim), dtype=torch.float32)
    dbuf = torch.empty((batch_size, out_dim), dtype=torch.float64)
    zbuf64 = torch.empty((batch_size, out_dim), dtype=torch.float64)
    summed = 0
    for lo in range(0, n, batch_size):
        hi = min(lo + batch_size, n)
        zb = zbuf[: hi - lo]
        zb.copy_(z_old.batch(lo, hi))
        d = rows[np.searchsorted(rows, lo) : np.searchsorted(rows, hi)]
        k = len(d)
        whole = k == hi - lo  # every row of the batch is updated: slices, no gathers
        loc = torch.from_numpy(d - lo)
        if nb is not None:  # the base rows of h the next layer's projections need
            h_before = finish(zb.index_select(0, loc)) if k else None
            ids = _within(nb.need_base, lo, hi)
            if len(ids):
                nb.add_base(ids, finish(zb.index_select(0, torch.from_numpy(ids - lo))))
        if k:
            # The base graph's in-edges of the whole batch: a row with an in-edge from C is in `rows`,
            # whether that edge stays (an out-neighbour of C) or goes (a changed row).
            ip, src = base_adj.in_edges(np.arange(lo, hi, dtype=np.int64))
            deg = np.diff(ip)[d - lo]
            changed_deg = deg_new_r[d]
            has_r = np.flatnonzero(changed_deg >= 0)
            d_old = deg[has_r].astype(np.float64)
            deg[has_r] = changed_deg[has_r]
            sel = np.flatnonzero(in_c[src])
            summed += len(sel)
            # Mostly updated batch: delta holds every row of the batch (0 where not updated) and is added
            # to z in one pass; else only the updated rows, gathered and scattered.
            dense = 2 * k >= hi - lo
            slot = d - lo if dense else np.arange(k)
            width = hi - lo if dense else k
            delta = dbuf[:width]
            if mean:  # 1/d' (DGL's mean is 0 for a row without in-edges), or 1/(d' + 1)
                scale = np.divide(1.0, deg, out=np.zeros(k), where=deg > 0)
            else:
                scale = 1.0 / (deg + 1.0)
            if len(sel):
                row_at = np.full(hi - lo, -1, dtype=np.int64)
                row_at[d - lo] = slot
                owner = row_at[np.searchsorted(ip, sel, side="right") - 1]
                crow = np.zeros(width + 1, dtype=np.int64)
                np.cumsum(np.bincount(owner, minlength=width), out=crow[1:])
                block = dgl.create_block(
                    ("csc", (torch.from_numpy(crow), torch.from_numpy(pos_c[src[sel]]), _NO_EIDS)),
                    num_src_nodes=len(changed),
                    num_dst_nodes=width,
                )
                # copy_u_sum, then the scale: DGL's u_mul_e_sum with per-edge 1/d' took 3-4x longer
                delta.copy_(dgl.ops.copy_u_sum(block, inputs.p_n))
                row_scale = np.zeros(width)
                row_scale[slot] = scale
                delta.mul_(torch.from_numpy(row_scale).unsqueeze(1))
            else:
                delta.zero_()
            pr = pos_r[d]
            rr = r = None
            if len(has_r):
                e_r = _f64(inputs.e_r[torch.from_numpy(pr[has_r])])
                delta.index_add_(
                    0, torch.from_numpy(slot[has_r]), e_r * torch.from_numpy(scale[has_r]).unsqueeze(1)
                )
                d_new = deg[has_r].astype(np.float64)
                if mean:  # no in-edges now: DGL's mean is 0
                    r = np.divide(d_old, d_new, out=np.zeros_like(d_old), where=d_new > 0)
                else:
                    r = (d_old + 1) / (d_new + 1)
                keep = r != 1
                rr, r = has_r[keep], r[keep]  # rows whose base share is rescaled
            s = np.flatnonzero(in_c[d])
            if len(s):
                at = torch.from_numpy(pos_c[d[s]])
                if mean:  # W_s D_v
                    delta.index_add_(0, torch.from_numpy(slot[s]), _f64(inputs.p_s[at]))
                else:  # W_n D_v / (d' + 1)
                    own = _f64(inputs.p_n[at]) * torch.from_numpy(scale[s]).unsqueeze(1)
                    delta.index_add_(0, torch.from_numpy(slot[s]), own)
            if rr is not None and len(rr):
                # z' = r z + (1 - r)(b [+ W_s h_v]) + ...: add (r - 1) z here, z itself below
                rt, at = torch.from_numpy(r).unsqueeze(1), torch.from_numpy(slot[rr])
                z_r = _f64(zb[torch.from_numpy(d[rr] - lo)])
                base = b + _f64(inputs.q_r[torch.from_numpy(pos_r[d[rr]])]) if mean else b
                delta[at] += (rt - 1) * z_r + (1 - rt) * base
            # z' = z + delta in float64, rounded once (+ 0.0 leaves the rows not updated as they were).
            # Conversions are separate copies: torch's mixed float32/float64 arithmetic is ~10x slower.
            if dense:
                z = zbuf64[: hi - lo]
                z.copy_(zb)
                z.add_(delta)
                zb.copy_(z)
            else:
                delta.add_(_f64(zb.index_select(0, loc)))
                zb.index_copy_(0, loc, delta.to(torch.float32))
        if finish is None:
            h_out.write_range(lo, zb)
        else:
            if z_out is not None:
                z_out.write_range(lo, zb)
            # One pass over the batch: new rows from z', the others are finish(z_old), the base rows.
            hb = hbuf[: hi - lo]
            hb.copy_(zb)
            hb = finish(hb)
            h_out.write_range(lo, hb)
            if project is not None:
                project.add(lo, hb)
            if nb is not None:
                if k:
                    nb.add_changed(d, hb if whole else hb.index_select(0, loc), h_before)
                ids = _within(nb.need_sources, lo, hi)
                if len(ids):
                    nb.add_sources(ids, hb.index_select(0, torch.from_numpy(ids - lo)))
        h_out.release()
        if progress is not None:
            progress(hi, n)
    return DeltaStats(len(rows), len(changed), summed, int(np.abs(edges.edge_weight).sum()))
