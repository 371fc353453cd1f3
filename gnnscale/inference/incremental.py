"""Which rows each layer must recompute after a graph change (design note 001: cache + recompute locally).

h_l(v) depends on h_{l-1} of v and of v's in-neighbours, and on v's in-edge set, so
  affected_0 = nodes whose features changed
  affected_l = affected_{l-1} ∪ out-neighbours(affected_{l-1}) ∪ destinations of changed edges
with out-neighbours taken in the updated graph. GCN also normalises by the source's out-degree, so a
changed edge's source perturbs every message it sends: its out-neighbours join every layer too.
Every other row of every layer is bit-for-bit the cached one, so reusing it is exact.
"""

from __future__ import annotations

import numpy as np

from gnnscale.inference.blocks import Adjacency


def affected_rows(
    arch: str,
    num_layers: int,
    adj: Adjacency,
    feat_nodes: np.ndarray,
    changed_src: np.ndarray,
    changed_dst: np.ndarray,
) -> list[np.ndarray]:
    """Sorted node ids to recompute, per layer (index 0 = the first layer's output)."""
    n = adj.num_nodes
    cur = np.zeros(n, dtype=bool)
    cur[feat_nodes] = True
    if arch == "mlp":  # features only: edges change nothing, and a node only its own rows
        return [np.nonzero(cur)[0] for _ in range(num_layers)]
    every_layer = np.zeros(n, dtype=bool)
    every_layer[changed_dst] = True
    if arch == "gcn" and len(changed_src):
        src = np.zeros(n, dtype=bool)
        src[changed_src] = True
        every_layer |= adj.out_neighbours(src)
    out = []
    for _ in range(num_layers):
        if not cur.all():
            cur = cur | adj.out_neighbours(cur) | every_layer
        out.append(np.nonzero(cur)[0])
    return out
