"""The cost model the plan predicts speed with and the measurement is judged by: FLOPs per layer and
per step, elementwise activation traffic, batch shapes, and the seeds/s prediction.

FLOPs (layer_flops, train_flops). Per layer, each dense projection costs 2 x rows x d_in x d_out on
the rows DGL applies it to (SAGEConv and GraphConv project the source rows before aggregating when that
narrows the features, the destination rows after it otherwise), and the aggregation one add per edge
per feature at the width it runs at. Backward computes the weights' gradients (about the forward's
FLOPs again) and the inputs' (once more), the latter for every layer but the first: the input
features need no gradient. So a step counts 2x the first layer's forward and 3x the others'.

Prediction (predict_seeds_per_s). One step = the probed sampling time + the batch's feature bytes at
the random-gather bandwidth + its training FLOPs at the matmul rate + its elementwise activation
traffic (activation_bytes: the reads and writes of norm, ReLU, dropout, the projections' sum and the
aggregation, forward and backward) at the same memory bandwidth. On a CPU that traffic is most of the
compute time of a GNN step (measured on the 50k-node sage_2hop graph: matmuls ~40% of forward +
backward); on a GPU it runs at device-memory speed and is left out.
"""

from __future__ import annotations

from typing import Sequence

from gnnscale.sampling.batch import Batch
from gnnscale.training.memory_plan import BatchShape

# ---- FLOPs ---------------------------------------------------------------------------------------


def layer_flops(arch: str, aggregator: str, src: int, dst: int, edges: int, d_in: int, d_out: int) -> float:
    """Forward FLOPs of one layer on a block of src -> dst rows with `edges` edges."""

    def mm(rows: int, k: int, n: int) -> float:
        return 2.0 * rows * k * n

    narrows = d_in > d_out  # DGL then projects the source rows first and aggregates the narrow result
    if arch == "mlp":
        return mm(dst, d_in, d_out)
    if arch == "gcn":
        return mm(src, d_in, d_out) + edges * d_out if narrows else edges * d_in + mm(dst, d_in, d_out)
    if aggregator == "pool":  # fc_pool on every source, max over edges, fc_neigh + fc_self on dst
        return mm(src, d_in, d_in) + edges * d_in + 2 * mm(dst, d_in, d_out)
    if aggregator == "lstm":  # an LSTM(d_in, d_in) step per edge: 4 gates x 2 matmuls, + fc_neigh, fc_self
        return edges * 16.0 * d_in * d_in + 2 * mm(dst, d_in, d_out)
    neigh = mm(src, d_in, d_out) + edges * d_out if narrows else edges * d_in + mm(dst, d_in, d_out)
    return neigh + (mm(dst, d_in, d_out) if aggregator == "mean" else dst * d_in)  # gcn: + self row


def forward_flops(arch: str, aggregator: str, dims: Sequence[int], layers: Sequence[tuple]) -> float:
    """layers: (src rows, dst rows, edges) per layer, input layer first; dims: in_dim, hidden..., classes."""
    return sum(_per_layer(layer_flops, arch, aggregator, dims, layers))


def train_flops(arch: str, aggregator: str, dims: Sequence[int], layers: Sequence[tuple]) -> float:
    """Forward + backward: weight gradients for every layer, input gradients for all but the first."""
    per_layer = _per_layer(layer_flops, arch, aggregator, dims, layers)
    return 2 * sum(per_layer) + sum(per_layer[1:])


def _per_layer(fn, arch: str, aggregator: str, dims: Sequence[int], layers: Sequence[tuple]) -> list[float]:
    return [
        fn(arch, aggregator, s, d, e, k, n)
        for (s, d, e), k, n in zip(layers, dims[:-1], dims[1:], strict=True)
    ]


# Passes over a layer's output (dst rows x d_out floats read or written), forward + backward, by the
# elementwise work around its matmuls: counted from each op's reads and writes (a ReLU reads and writes
# once forward, reads two and writes one backward: 5).
COMBINE_PASSES = 6  # the projections' sum and bias, and their gradients
HIDDEN_PASSES = {"norm": 8, "relu": 5, "dropout": 7}  # on every layer but the last


def activation_bytes(
    dims: Sequence[int], layers: Sequence[tuple], norm: str = "none", dropout: float = 0.0, arch: str = "sage"
) -> float:
    """Bytes of elementwise activation traffic in one training step (float32): the passes over each
    layer's output above, and the aggregation's reads of one row per edge (again backward, except on
    the first layer when it aggregates the input features themselves, which need no gradient)."""
    total = 0.0
    last = len(layers) - 1
    for i, ((_, dst, edges), d_in, d_out) in enumerate(zip(layers, dims[:-1], dims[1:], strict=True)):
        passes = COMBINE_PASSES
        if i < last:
            passes += HIDDEN_PASSES["relu"]
            passes += HIDDEN_PASSES["norm"] if norm not in ("none", None, "") else 0
            passes += HIDDEN_PASSES["dropout"] if dropout > 0 else 0
        total += passes * dst * d_out
        if arch != "mlp":
            width = min(d_in, d_out)  # DGL aggregates at the narrower width
            total += edges * width * (2 if i > 0 or d_in > d_out else 1)
    return 4.0 * total


def shape_layers(shape: BatchShape) -> list[tuple[int, int, int]]:
    """(src, dst, edges) per layer of a BatchShape: layer i reads layer i-1's destinations."""
    src = [shape.input_rows, *shape.dst_rows[:-1]]
    return list(zip(src, shape.dst_rows, shape.edges, strict=True))


def projection_shapes(shape: BatchShape, dims: Sequence[int]) -> list[tuple[int, int, int]]:
    """(m, k, n) of each layer's dominant dense projection, for micro.matmul_flops: on the source rows
    when the layer narrows the features (DGL projects before aggregating), on the destinations otherwise."""
    return [
        (s if k > n else d, int(k), int(n))
        for (s, d, _), k, n in zip(shape_layers(shape), dims[:-1], dims[1:], strict=True)
    ]


def measured_shape(measured: dict) -> BatchShape:
    """The mean batch of a measure_steps result, for projection_shapes and the micro-measurements."""
    shape = measured["shape"]
    return BatchShape(
        int(round(shape["input_rows"])),
        tuple(int(round(v)) for v in shape["dst_rows"]),
        tuple(int(round(v)) for v in shape["edges"]),
    )


def batch_layers(b: Batch, num_layers: int) -> list[tuple[int, int, int]]:
    """(src, dst, edges) per layer of a sampled batch (a subgraph formation runs every layer on its subgraph)."""
    if b.blocks is not None:
        return [(s.num_src_nodes(), s.num_dst_nodes(), s.num_edges()) for s in b.blocks]
    n, e = b.subgraph.num_nodes(), b.subgraph.num_edges()
    return [(n, n, e)] * num_layers


def sampled_edges(b: Batch) -> int:
    """Edges the sampler drew for a batch: every block's, or the subgraph's once."""
    return sum(s.num_edges() for s in b.blocks) if b.blocks is not None else b.subgraph.num_edges()


def predict_seeds_per_s(
    batch_size: int,
    shape: BatchShape,
    dims: Sequence[int],
    row_bytes: int,
    gather_bytes_per_s: float,
    flops_per_s: float,
    sample_s: float,
    arch: str = "sage",
    aggregator: str = "mean",
    norm: str = "none",
    dropout: float = 0.0,
    device_type: str = "cpu",
) -> dict:
    """Seeds/s before any training (the module's docstring: Prediction). shape: the mean probed batch
    (probe_sampling); dims: the model's in_dim, hidden..., classes; row_bytes: feat_dim x the features'
    itemsize; the two rates: micro.gather_bandwidth and micro.matmul_flops; sample_s: the probe's
    seconds per batch; arch / aggregator / norm / dropout: the model config's."""
    layers = shape_layers(shape)
    gather_bytes = shape.input_rows * row_bytes
    flops = train_flops(arch, aggregator, dims, layers)
    traffic = activation_bytes(dims, layers, norm, dropout, arch) if device_type == "cpu" else 0.0
    parts = {
        "sample_s": float(sample_s),
        "gather_s": gather_bytes / gather_bytes_per_s,
        "matmul_s": flops / flops_per_s,
        "activations_s": traffic / gather_bytes_per_s,
    }
    step = sum(parts.values())
    return {
        "seeds_per_s": batch_size / step,
        "step_s": step,
        "parts_s": parts,
        "gather_bytes_per_batch": gather_bytes,
        "flops_per_batch": flops,
        "activation_bytes_per_batch": traffic,
    }
