"""METIS's peak memory, estimated from the graph's size before it starts, and the refusal when it won't fit.

Calibrated on synthetic graphs (scripts/bench_partition.py; bench/results/partition.json): the growth of
RssAnon while `dgl.metis_partition_assignment` runs (importing DGL, its symmetric copy of the graph and
that copy's CSR, METIS's coarsened graphs) was 150 MB at 50k nodes / 1M directed edges, 430 MB at
200k / 3.9M, 700 MB at 500k / 9.9M and 2.4 GB at 2M / 39.7M, within 3 % of each other for 8 parts and for
one per 1,000 nodes. The bytes per edge fall as graphs grow (94 -> 58); the constants bound every
measurement, by 25-30 % at the largest.
"""

from __future__ import annotations

from gnnscale.errors import MemoryBudgetError
from gnnscale.utils.memlimit import gb, resolve_budget
from gnnscale.utils.memory import rss_anon_mb

BYTES_PER_EDGE = 64  # per directed edge of the symmetric graph METIS is given
BYTES_PER_NODE = 200
FIXED_BYTES = 150 * 2**20  # importing DGL (~60 MB of heap) and METIS's own tables
REBUILD_BYTES_PER_EDGE = 8  # a graph not stored simple and symmetric is rebuilt and held in RAM
WIDEN_BYTES_PER_EDGE = 8  # stored int32 indices are widened for DGL's METIS (int64 graphs only), in RAM


def metis_bytes(
    num_nodes: int,
    num_edges: int,
    simple_symmetric: bool = True,
    directed: bool = False,
    index_itemsize: int = 8,
) -> int:
    """Peak growth of anonymous memory while METIS partitions a graph whose CSC holds `num_edges` edges.
    A graph that is not stored simple and symmetric is rebuilt first (int64 indices): up to twice its edges
    when directed. One used as stored is copied to int64 first when its indices are int32."""
    if simple_symmetric:
        widen = WIDEN_BYTES_PER_EDGE * num_edges if index_itemsize < 8 else 0
        return FIXED_BYTES + BYTES_PER_NODE * num_nodes + BYTES_PER_EDGE * num_edges + widen
    sym_edges = num_edges * (2 if directed else 1)
    return FIXED_BYTES + BYTES_PER_NODE * num_nodes + (BYTES_PER_EDGE + REBUILD_BYTES_PER_EDGE) * sym_edges


def check_metis_memory(
    num_nodes: int,
    num_edges: int,
    spec: str = "auto",
    simple_symmetric: bool = True,
    directed: bool = False,
    key: str = "partition.memory_budget",
    index_itemsize: int = 8,
) -> dict:
    """{estimate_mb, budget_mb, budget}; MemoryBudgetError (exit 2, one line) when METIS would not fit.
    The estimate is what this process holds now plus METIS's growth."""
    budget = resolve_budget(spec, key)
    held = int((rss_anon_mb() or 0.0) * 2**20)
    estimate = held + metis_bytes(num_nodes, num_edges, simple_symmetric, directed, index_itemsize)
    if estimate > budget.bytes:
        raise MemoryBudgetError(
            f"METIS on {num_nodes:,} nodes / {num_edges:,} edges needs about {gb(estimate)}, "
            f"over the memory budget of {gb(budget.bytes)} ({budget.why})",
            "use partition.method=random (no memory beyond the assignment), a graph with fewer edges, "
            "or a machine with more memory",
        )
    return {
        "estimate_mb": round(estimate / 2**20, 1),
        "budget_mb": round(budget.bytes / 2**20, 1),
        "budget": budget.why,
    }
