"""What full-graph training (`sampler=full`: every layer over the whole graph, one step per epoch) holds.

Counted tensor by tensor from what the train stage and DGL's layers keep for backward (checked with
torch.autograd.graph.saved_tensors_hooks on GraphConv and SAGEConv, CPU, fp32), N = the graph's nodes:

- features: the matrix in RAM (feature_cache=auto holds it there when it fits) and the gathered copy
  the step reads (the gather buffer, with its 1.25x headroom); input dropout adds its output, held for
  the whole step.
- each layer's activations, kept for backward: SAGE keeps the layer's input (its projections read it)
  and the aggregated neighbours when aggregation runs before the projection (d_in <= d_out); GCN keeps
  one d_in-wide tensor, the matmul's operand (the input times its norm, or the aggregated neighbours);
  after every layer but the last: batch norm's input (norm=batch), the ReLU output, and dropout's mask
  (a float tensor on CPU). The next layer's input is this layer's dropout output, counted once.
- their gradients: backward frees each activation's gradient once it has passed on, so at most a few
  live at once: BACKWARD_LIVE hidden-sized gradients beside the saved activations.
- parameters, gradients and Adam's two moments: 4 x 4 bytes per parameter.
- graph structure: the CSC is memory-mapped (RSS, not heap); aggregating backwards (and GCN's out-degree
  norm) makes DGL build the transpose, a CSR with edge ids, on the heap.
- heap slack: a step's tensors under 32 MB come from the heap, which keeps their freed holes (see
  MMAP_THRESHOLD): counted once more.
- the process: what it holds before training (interpreter, torch, DGL, labels: measured in this process)
  and the trainer's own overhead (training/memory_plan.TRAINER_OVERHEAD). Both are in the total, because what is
  compared with it is the absolute peak RssAnon of a `gnnscale train +exp=full_gcn` process.
"""

from __future__ import annotations

from gnnscale.models import build_model
from gnnscale.profile.stats import GraphStats
from gnnscale.training.memory_plan import TRAINER_OVERHEAD

BYTES = 4  # float32 activations and parameters
GATHER_HEADROOM = 1.25  # training/batches.FeatureBuffers grows its buffer to 1.25x the rows asked for
BACKWARD_LIVE = 2  # hidden-sized gradients alive at once during backward
# utils/alloc.keep_heap_warm serves allocations under 32 MB from the heap and keeps what is freed there:
# a step's smaller tensors do not land in the previous step's holes every time, and the heap settles at
# about twice them (measured: syn20k full_gcn, every step tensor 19.5 MB or less: 0.72x without this term,
# 0.88x with it; Cora 0.88 -> 0.97; the 50k graph, whose hidden-wide tensors are mmap'd, 0.92 -> 0.98).
MMAP_THRESHOLD = 32 << 20


def _model_sizes(model_cfg, stats: GraphStats) -> tuple[list[int], int]:
    """(in_dim, hidden..., classes) and the parameter count, read off the model train would build."""
    model = build_model(model_cfg, stats.feat_dim, stats.num_classes)
    return list(model.dims), sum(p.numel() for p in model.parameters())


def layer_activations(arch: str, dims: list[int], norm: str, dropout: float) -> list[dict]:
    """Per layer: the float columns (per node) kept for backward, named."""
    out = []
    last = len(dims) - 2
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        kept = {}
        if arch == "gcn":
            # The matmul's operand: the input times the norm (d_in > d_out: project first) or the
            # aggregated neighbours (d_in <= d_out: aggregate first); either way one d_in-wide tensor.
            kept["input x norm, or aggregated"] = d_in
        else:
            # SAGE's projections (and an MLP's) read the input itself; layer 0's is the gathered
            # features, counted under features.
            if i > 0:
                kept["input"] = d_in
            if arch == "sage" and d_in <= d_out:
                kept["aggregated neighbours"] = d_in
        if i < last:
            if norm in ("batch", "layer"):
                kept["norm input"] = d_out
            kept["relu output"] = d_out
            if dropout > 0:
                kept["dropout mask"] = d_out
        out.append({"layer": i, "d_in": d_in, "d_out": d_out, "columns": kept})
    return out


def full_graph_memory(
    stats: GraphStats,
    model_cfg,
    input_dropout: float = 0.0,
    baseline_bytes: int = 0,
    features_in_ram: bool = True,
    mapped_now_bytes: int = 0,
) -> dict:
    """Per-term bytes and the total (the predicted peak RssAnon of a full-graph train process).
    mapped_now_bytes: the file pages this process has mapped (libraries), for the RSS figure."""
    n, e = stats.num_nodes, stats.num_edges
    arch, norm = str(model_cfg.arch), str(model_cfg.norm or "none")
    dims, params = _model_sizes(model_cfg, stats)
    # Each step's tensors (name -> sizes of its tensors); held ones (features, buffers, graph) apart.
    step: dict[str, list[int]] = {}
    if input_dropout > 0:
        step["input dropout output"] = [n * stats.feat_dim * BYTES]
    layers = []
    for row in layer_activations(arch, dims, norm, float(model_cfg.dropout)):
        tensors = [n * cols * BYTES for cols in row["columns"].values()]
        step[f"layer {row['layer']} activations"] = tensors
        layers.append({**row, "activation_bytes": sum(tensors)})
    widest = max(dims[1:])
    step["activation gradients (live during backward)"] = [n * widest * BYTES] * BACKWARD_LIVE
    terms = {
        "process baseline (measured now)": int(baseline_bytes),
        "trainer overhead (measured constant)": TRAINER_OVERHEAD,
        "features in RAM": stats.feature_bytes if features_in_ram else 0,
        "gathered features (the step's input)": int(GATHER_HEADROOM * n * stats.feat_dim * BYTES),
        **{name: sum(sizes) for name, sizes in step.items()},
        "parameters, gradients, Adam moments": params * BYTES * 4,
        # in the graph's idtype (int32 over int32 indices): indptr, indices and edge ids
        "graph structure: transposed CSR (heap)": (n + 1 + 2 * e) * stats.index_bytes if arch != "mlp" else 0,
        "heap slack (freed step tensors under 32 MB)": sum(
            t for sizes in step.values() for t in sizes if t < MMAP_THRESHOLD
        ),
    }
    total = sum(terms.values())
    mapped = stats.csc_bytes if arch != "mlp" else 0
    return {
        "what": (
            "predicted peak RssAnon (heap) of `gnnscale train sampler=full` on this graph, process baseline "
            "included; rss_bytes adds the memory-mapped CSC and the libraries' pages"
        ),
        "terms_bytes": terms,
        "total_bytes": int(total),
        "total_gb": round(total / 1e9, 3),
        "training_bytes": int(total - baseline_bytes - TRAINER_OVERHEAD),
        "csc_mapped_bytes": int(mapped),
        "rss_bytes": int(total + mapped + mapped_now_bytes),
        "num_params": int(params),
        "dims": dims,
        "layers": layers,
    }
