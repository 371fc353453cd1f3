"""An update run's layers: for each layer, the cheapest exact way from the base run's cached layers.

  delta   linear aggregators with the base run's conv outputs cached (propagate.py): cost follows the
          changed input rows and their out-edges, not the affected rows
  full    the contiguous path a full run takes, over every row (exact: a row depends only on its in-edges
          and inputs), then the rows outside the affected set are put back from the base run bit for bit
  rows    only the affected rows, on a copy of the base run's file (few affected rows, other layers)
  reused  nothing reaches the layer: the base run's file, hard-linked

Every row outside a layer's affected set keeps the base run's value, bit for bit, whatever the method
(but for a layer recomputed in full over a base run that kept no conv outputs: all of it is recomputed,
so that the new conv-output file agrees with the layer file row by row, h = finish(z), as propagate.py
relies on).

Files: a delta pass reads the base run's conv outputs and writes its own outputs front to back, through
streamfile.py (O_DIRECT, no page cache) unless the next layer reads them in place. A full layer right
after a delta layer whose conv projects its inputs first (in > out) takes those projections from the
delta pass instead of reading its input rows (projected.py).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnnscale.inference.blocks import Adjacency
from gnnscale.inference.layerfile import LayerFile, seed_unaffected_rows
from gnnscale.inference.layerwise import (
    LayerContext,
    LayerStats,
    caches_preactivation,
    compute_layer,
    finish_layer,
    open_input,
)
from gnnscale.inference.projected import Projections, layer_from_projections, projectable
from gnnscale.inference.propagate import (
    DeltaInputsBuilder,
    InEdgeChange,
    gathered_inputs,
    propagate_layer,
    propagates,
)
from gnnscale.inference.streamfile import StreamReader, StreamWriter

# The rows path recomputes scattered rows (non-contiguous in-edges, gathers, scattered writes) at ~3x the
# cost per row of the contiguous full path on the 500k-node benchmark: beyond this fraction of the nodes,
# computing every row is cheaper.
ROWS_FULL_FRACTION = 0.3

# A delta layer carries the base run's float32 rounding in z (propagate.py); once a change reaches more than
# this fraction of a layer's input rows, a recomputation costs about as much and agrees with a fresh run to
# the last bits, so that layer and every later one are recomputed instead.
DELTA_MAX_CHANGED = 0.5

# Seconds per unit, from the layers of the 500k-node benchmark (2 cores, float32 unless named): one
# multiply-add of a projection (a float64 one costs ~2.5x), one edge x feature of an SpMM, and one
# row x feature of the elementwise work a delta pass adds (base z read, combine in float64, finish).
_MM32, _MM64, _EDGE, _ELEM = 1.3e-11, 3.3e-11, 2.7e-10, 5.0e-9


# What those estimates leave out, measured on the same benchmark's updates (0.1 / 1 / 5 % of nodes changed):
# a delta layer streams the base run's conv outputs and writes every row whatever the change (~1.0 s of
# layer 1's 1.05 s at 0.1 %, where delta_cost said 0.02); a first layer's delta costs more per affected
# row than delta_cost's _ELEM (1.05 / 1.54 / 2.97 s at 14k / 113k / 350k rows); a layer recomputed inside
# an update took 1.5x the base run's same layer (4.34 vs 2.83 s: it restores the unreached rows).
_STREAM, _FIRST_ROW, _FULL_IN_UPDATE = 7.6e-9, 1.6e-8, 1.5


def update_seconds(plan, n: int, dims, affected, base_layer_s) -> float | None:
    """What the per-layer plan should take, the layers recomputed in full priced from the base run's own
    measured layer times (base_layer_s); None without them, or where a layer recomputes scattered rows
    (a path with no measured price)."""
    if base_layer_s is None or len(base_layer_s) != len(plan):
        return None
    total = 0.0
    for i, (method, why) in enumerate(plan):
        if method == "delta":
            total += why["estimated_s"]["delta"] + n * dims[i + 1] * _STREAM
            total += len(affected[i]) * dims[i + 1] * _FIRST_ROW if i == 0 else 0.0
        elif method == "full":
            total += base_layer_s[i] * _FULL_IN_UPDATE
        elif method == "rows":
            return None
    return total


def delta_cost(n, e, *, in_dim, out_dim, changed, edges_from_changed, rows, mean) -> tuple[float, float]:
    """(delta, full) estimated seconds for one layer, leaving out what both do (write the outputs)."""
    mm = in_dim * out_dim * (2 if mean else 1)  # W_s and W_n, or W_n alone
    full = n * mm * _MM32 + e * min(in_dim, out_dim) * _EDGE
    delta = changed * mm * _MM64 + edges_from_changed * out_dim * _EDGE + rows * out_dim * _ELEM
    return delta, full


@dataclass
class UpdateInputs:
    """What the layers of an update read: both graphs, both feature sets, the base run's cache."""

    adj: Adjacency  # the updated graph
    adj_old: Adjacency  # the base run's graph
    features: object  # rows now (PatchedFeatures)
    features_old: object  # rows in the base run
    feat_changed: np.ndarray  # sorted ids whose feature rows changed
    base_h: list[Path]  # the base run's layer files
    base_z: list[Path | None]  # its conv outputs (hidden layers), None where it kept none


def plan_methods(model, inputs: UpdateInputs, rows: list[np.ndarray], device) -> list[tuple[str, dict]]:
    """(method, why) per layer. Delta layers come first: each needs the previous one's pass to hand it
    its projected inputs, and a layer recomputed in full has no base rows in hand to do that."""
    adj, n = inputs.adj, inputs.adj.num_nodes
    out_deg = None
    plan, delta_ok = [], device.type == "cpu"
    for layer in range(model.num_layers):
        conv, dim, in_dim = model.layers[layer], model.dims[layer + 1], model.dims[layer]
        hidden = layer < model.num_layers - 1
        affected = rows[layer]
        changed = inputs.feat_changed if layer == 0 else rows[layer - 1]
        base_z = inputs.base_z[layer] if hidden else inputs.base_h[layer]
        delta_ok = delta_ok and model.arch == "sage" and propagates(conv) and base_z is not None
        if len(affected) == 0:
            plan.append(("reused", {}))
            continue
        if delta_ok:
            if out_deg is None:
                out_deg = adj.out_degrees()
            e_c = int(out_deg[changed].sum())
            d_cost, f_cost = delta_cost(
                n, adj.num_edges, in_dim=in_dim, out_dim=dim, changed=len(changed), edges_from_changed=e_c,
                rows=len(affected), mean=conv._aggre_type == "mean",
            )  # fmt: skip
            why = {"estimated_s": {"delta": round(d_cost, 2), "full": round(f_cost, 2)}}
            if len(changed) <= DELTA_MAX_CHANGED * n and d_cost < f_cost:
                plan.append(("delta", why))
                continue
            delta_ok = False
            plan.append(("full", why))
            continue
        delta_ok = False
        plan.append(("full" if len(affected) >= ROWS_FULL_FRACTION * n else "rows", {}))
    return plan


def update_layers(
    model,
    inputs: UpdateInputs,
    rows: list[np.ndarray],
    paths: list[Path],
    z_paths: list[Path | None],
    *,
    mode: str,
    batch_size: int,
    device: torch.device,
    progress=None,
    plan: list[tuple[str, dict]] | None = None,
) -> tuple[list[LayerStats], list[bool]]:
    """Every layer of the update into paths[l] (and z_paths[l]); returns the stats and, per layer, whether
    a conv-output file was written (the next update can propagate through that layer only if so).
    plan: plan_methods' (made here when not given)."""
    adj, n, num_layers = inputs.adj, inputs.adj.num_nodes, model.num_layers
    ctx = LayerContext(model, adj, device)
    plan = plan if plan is not None else plan_methods(model, inputs, rows, device)
    methods = [m for m, _ in plan]
    edges = InEdgeChange.between(inputs.adj_old, adj) if "delta" in methods else None
    delta_in = None
    if methods[0] == "delta":
        delta_in = gathered_inputs(
            model.layers[0], inputs.feat_changed, edges, inputs.features, inputs.features_old
        )
    plan_projected = [
        m == "full"
        and i > 0
        and methods[i - 1] == "delta"
        and projectable(model.layers[i])
        and device.type == "cpu"
        for i, m in enumerate(methods)
    ]
    projections = None
    stats, wrote_z = [], []
    prev: LayerFile | None = None
    with torch.no_grad():
        for layer in range(num_layers):
            t0 = time.time()
            method, detail = plan[layer]
            conv, dim = model.layers[layer], model.dims[layer + 1]
            hidden = layer < num_layers - 1
            affected = rows[layer]
            base_z = inputs.base_z[layer] if hidden else inputs.base_h[layer]
            out_path = paths[layer]
            z_path = z_paths[layer] if caches_preactivation(model, layer) else None
            # A full layer after a delta layer that projects its inputs first takes the projections from
            # the delta pass (projected.py); nothing this run reads again goes through the page cache.
            projected = plan_projected[layer]
            next_projected = hidden and plan_projected[layer + 1]
            next_reads = hidden and methods[layer + 1] in ("full", "rows") and not next_projected
            finish = (lambda z, i=layer: finish_layer(model, i, z)) if hidden else None
            layer_progress = (lambda done, total, i=layer: progress(i, done, total)) if progress else None
            if method == "reused":
                _link(inputs.base_h[layer], out_path)
                wrote = z_path is not None and base_z is not None and hidden
                if wrote:
                    _link(base_z, z_path)
                out, edges_done = LayerFile(out_path, mode=mode, writable=False), 0
            elif method == "delta":
                nxt = (
                    DeltaInputsBuilder(model.layers[layer + 1], affected, edges)
                    if hidden and methods[layer + 1] == "delta"
                    else None
                )
                z_old = StreamReader(base_z, batch_size)
                proj_next = Projections(model.layers[layer + 1], n) if next_projected else None
                out = _output(out_path, (n, dim), mode, next_reads)
                z_out = StreamWriter(z_path, (n, dim)) if z_path is not None else None
                try:
                    ds = propagate_layer(
                        conv,
                        finish,
                        delta_in,
                        affected,
                        inputs.adj_old,
                        edges,
                        z_old,
                        z_out,
                        out,
                        batch_size=batch_size,
                        next_inputs=nxt,
                        project=proj_next,
                        progress=layer_progress,
                    )
                finally:
                    z_old.close()
                for f in (z_out, out if isinstance(out, StreamWriter) else None):
                    if f is not None:
                        f.close()  # surfaces a failed write now, not at the end of the run
                delta_in = nxt.finish() if nxt is not None else None
                projections = proj_next
                edges_done = ds.edges_from_changed + ds.changed_edges
                detail = {**detail, **ds.as_detail()}
                wrote = z_out is not None
            elif projected:
                out = _output(out_path, (n, dim), mode, next_reads)
                z_out = StreamWriter(z_path, (n, dim)) if z_path is not None else None
                keep = _Restore(affected, n, inputs.base_h[layer], base_z if hidden else None)
                edges_done = layer_from_projections(
                    projections,
                    adj,
                    out,
                    z_out,
                    finish,
                    keep,
                    batch_size=batch_size,
                    progress=layer_progress,
                )
                projections = None
                for f in (z_out, keep, out if isinstance(out, StreamWriter) else None):
                    if f is not None:
                        f.close()
                wrote = z_out is not None
                detail = {**detail, "from": "projections of the previous layer's pass"}
            else:
                inp, in_place = open_input(
                    inputs.features,
                    layer,
                    prev,
                    ctx.in_place(layer),
                    None if method == "full" else affected,
                    n,
                    model.dims[0],
                    Path(out_path).with_name("h_0.npy.partial"),
                    mode,
                )
                keep = None
                if method == "full":
                    out = LayerFile(out_path, shape=(n, dim), mode=mode)
                    if base_z is not None or z_path is None:  # else all recomputed: h = finish(z) per row
                        keep = _Restore(affected, n, inputs.base_h[layer], base_z if hidden else None)
                    wrote = z_path is not None
                else:
                    seed_unaffected_rows(inputs.base_h[layer], out_path, affected, n)
                    out = LayerFile(out_path, mode=mode)
                    wrote = False  # the rows path has no base conv outputs to complete the file with
                z_out = StreamWriter(z_path, (n, dim)) if wrote else None
                _, edges_done = compute_layer(
                    ctx,
                    layer,
                    inp,
                    in_place,
                    out,
                    batch_size=batch_size,
                    rows=None if method == "full" else affected,
                    z_out=z_out,
                    keep=keep,
                    progress=progress,
                )
                for f in (z_out, keep):
                    if f is not None:
                        f.close()
                inp.close()
            if prev is not None:
                prev.close()
            prev = out
            wrote_z.append(bool(wrote) and hidden)
            sources = "gathered"
            if method == "full" or (method == "rows" and ctx.in_place(layer)):
                sources = "in place"
            stats.append(
                LayerStats(
                    layer + 1, dim, len(affected), int(edges_done), time.time() - t0, sources, method, detail
                )
            )
    if prev is not None:
        prev.close()
    return stats, wrote_z


def _output(path: Path, shape: tuple[int, int], mode: str, read_next: bool):
    """A layer's output file: mapped when the next layer reads it back, else streamed past the page cache."""
    return LayerFile(path, shape=shape, mode=mode) if read_next else StreamWriter(path, shape)


class _Restore:
    """compute_layer's keep hook for a full layer: rows outside the affected set back to the base run's."""

    def __init__(self, affected: np.ndarray, n: int, base_h: Path, base_z: Path | None):
        self.mask = np.ones(n, dtype=bool)
        self.mask[affected] = False
        self.h = LayerFile(base_h, writable=False)
        self.z = LayerFile(base_z, writable=False) if base_z is not None else None

    def __call__(self, kind: str, lo: int, t: torch.Tensor) -> None:
        src = self.h if kind == "h" else self.z
        if src is None:
            return
        idx = np.flatnonzero(self.mask[lo : lo + len(t)])
        if len(idx):
            at = torch.from_numpy(idx)
            t[at] = src.tensor[lo : lo + len(t)][at]

    def close(self) -> None:
        self.h.close()
        if self.z is not None:
            self.z.close()


def _link(src: Path, dst: Path) -> None:
    """A layer the update does not reach is the base run's file: finished files are never written again,
    so sharing the inode is safe (a copy where the filesystem has no hard links)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
