"""The formation to train with, by design note 001's checklist, and the numbers that decided it.

The rules, first match wins:
1. full         full-graph training fits the budget and the graph is small (<= FULL_GRAPH_NODES nodes,
                the checklist's "about 100k nodes") or its labels are sparse (<= SPARSE_LABELS of the
                nodes train: semi-supervised, where sampling wastes the structure).
2. distributed  one host cannot hold even the leanest mini-batch run: the smallest batch, features
                memory-mapped from disk, no prefetch, but the CSC resident (sampling reads it all over:
                below that every batch pages it back in) - its plan exceeds the budget.
3. cluster_gcn  neighbourhood completeness is at stake, and full-graph training is not chosen:
                a) the sampler asks for every neighbour (a fanout of -1): sampled blocks explode with
                   depth, while a batch of clusters keeps whole neighbourhoods at a bounded cost; or
                b) one batch's measured input already reaches EXPLOSION_SHARE of the graph: each step
                   recomputes most of the graph, and a Cluster-GCN epoch does it once; or
                c) degrees are even, yet the fanouts keep less than KEPT_EDGES of the in-edges at some
                   layer (a dense graph): sampling truncates most neighbourhoods, clusters keep theirs.
4. importance   the in-degrees are skewed (stats.py's rule): uniform draws miss the hubs that hold much
                of the graph's edges; draws proportional to degree find them.
5. neighbor     otherwise: uniform neighbour sampling at the largest batch / fanouts that fit.
"""

from __future__ import annotations

from gnnscale.profile.stats import GraphStats
from gnnscale.utils.memlimit import Budget, gb

FORMATIONS = ("full", "neighbor", "importance", "cluster_gcn", "distributed")
FULL_GRAPH_NODES = 100_000
SPARSE_LABELS = 0.10
EXPLOSION_SHARE = 0.5
KEPT_EDGES = 0.2


def recommend(stats: GraphStats, full: dict, minibatch: dict, budget: Budget, cfg) -> dict:
    """full: full_graph_memory's dict; minibatch: plan.py's minibatch section (its "leanest_must_fit_bytes",
    "measured", "worst_case", "largest_fitting", "fanouts")."""
    n = stats.num_nodes
    train_share = stats.num_train / max(n, 1)
    full_fits = full["total_bytes"] <= budget.bytes
    small = n <= FULL_GRAPH_NODES
    sparse = 0 < train_share <= SPARSE_LABELS
    lean = int(minibatch["leanest_must_fit_bytes"])
    fanouts = minibatch.get("fanouts")
    measured = minibatch.get("measured")
    # Only a sampled neighbourhood can explode; a subgraph or full-graph formation's batch is its own size.
    input_share = measured["input_nodes"] / max(n, 1) if measured and fanouts else None
    kept = _kept(stats, fanouts)
    skewed = stats.degrees.skewed if stats.degrees is not None else None
    numbers = {
        "num_nodes": n,
        "train_fraction": round(train_share, 4),
        "full_graph_bytes": int(full["total_bytes"]),
        "full_graph_fits": full_fits,
        "budget_bytes": int(budget.bytes),
        "leanest_minibatch_bytes": lean,
        "batch_input_share": None if input_share is None else round(input_share, 4),
        "min_kept_edge_fraction": None if kept is None else round(kept, 4),
        "skewed": skewed,
    }
    if stats.degrees is not None:
        numbers["p99_over_median"] = round(stats.degrees.p99_over_median, 2)
        numbers["gini"] = round(stats.degrees.gini, 4)
    reasons: list[str] = []
    budget_line = f"the {gb(budget.bytes)} budget ({budget.why})"
    fit_line = (
        f"full-graph training needs about {gb(full['total_bytes'])}, "
        f"{'within' if full_fits else 'over'} {budget_line}"
    )

    if full_fits and (small or sparse):
        why = (
            f"{n:,} nodes (<= {FULL_GRAPH_NODES:,})"
            if small
            else f"sparse labels ({train_share:.1%} of the nodes train, <= {SPARSE_LABELS:.0%})"
        )
        reasons += [
            fit_line + ".",
            f"Full-graph training: the graph is small enough - {why}: exact gradients, no sampling noise.",
        ]
        formation = "full"
    elif lean > budget.bytes:
        reasons += [
            fit_line + ".",
            f"Even the leanest mini-batch run (batch {minibatch['leanest_batch_size']}, features memory-mapped, "
            f"no prefetch, the {gb(stats.csc_bytes)} CSC resident) needs about {gb(lean)}, over {budget_line}.",
            "Distributed training: one host cannot hold this graph; partition it across machines "
            "(dist=distdgl, gnnscale partition).",
        ]
        formation = "distributed"
    else:
        reasons.append(
            fit_line
            + (
                "."
                if not full_fits
                else f", but {n:,} nodes is above {FULL_GRAPH_NODES:,} with dense labels."
            )
        )
        formation, more = _sampled(stats, fanouts, input_share, kept, skewed)
        reasons += more
    fit = minibatch.get("largest_fitting") or {}
    if formation in ("neighbor", "importance") and fit:
        reasons.append(describe_fit(fit))
    configured = str(cfg.sampler.kind) if cfg is not None else None
    numbers["configured_sampler"] = configured
    if configured is not None and configured != formation:
        reasons.append(
            f"The configuration uses sampler={configured}; this plan advises {_PRESETS[formation]}."
        )
    return {
        "formation": formation,
        "preset": _PRESETS[formation],
        "reasons": reasons,
        "numbers": numbers,
        "largest_fitting": fit,
        "rules": rules(),
    }


def rules() -> list[str]:
    """The rules with their thresholds, in the order they are tried (the module docstring explains them)."""
    return [
        f"full: full-graph training fits the budget and the graph has <= {FULL_GRAPH_NODES:,} nodes or "
        f"<= {SPARSE_LABELS:.0%} of its nodes train",
        "distributed: the leanest mini-batch run (smallest batch, features memory-mapped, no prefetch, "
        "CSC resident) exceeds the budget",
        f"cluster_gcn: a fanout is -1, or one batch reads >= {EXPLOSION_SHARE:.0%} of the graph, or (degrees "
        f"even) the fanouts keep < {KEPT_EDGES:.0%} of the in-edges at some layer",
        "importance: the in-degrees are skewed (p99/median and Gini over their thresholds)",
        "neighbor: otherwise",
    ]


_PRESETS = {
    "full": "+exp=full_gcn (or +exp=full_sage)",
    "neighbor": "+exp=sage_2hop",
    "importance": "+exp=sage_importance",
    "cluster_gcn": "+exp=cluster_gcn",
    "distributed": "dist=distdgl (after gnnscale partition)",
}


def _kept(stats: GraphStats, fanouts) -> float | None:
    """The smallest share of in-edges a layer's fanout keeps. A described graph has only its average
    degree: min(f, avg) / avg bounds the share from above (E[min(d, f)] <= min(E[d], f)), so a bound
    under KEPT_EDGES still decides."""
    if not fanouts:
        return None
    if stats.degrees is None:
        avg = stats.avg_degree
        return min(1.0 if f < 0 else min(1.0, f / avg) for f in fanouts) if avg > 0 else None
    return min(stats.degrees.kept_fraction(int(f)) for f in fanouts)


def _sampled(stats, fanouts, input_share, kept, skewed) -> tuple[str, list[str]]:
    if fanouts and any(int(f) < 0 for f in fanouts):
        return "cluster_gcn", [
            f"The sampler takes every neighbour (fanouts {list(fanouts)}): sampled neighbourhoods explode "
            "with depth.",
            "Cluster-GCN: batches of graph clusters keep whole neighbourhoods inside them at a bounded cost.",
        ]
    if input_share is not None and input_share >= EXPLOSION_SHARE:
        return "cluster_gcn", [
            f"One sampled batch already reads {input_share:.0%} of the graph's nodes (>= "
            f"{EXPLOSION_SHARE:.0%}): every step recomputes most of the graph (a smaller train.batch_size "
            "reads less, at more steps per epoch).",
            "Cluster-GCN: each epoch visits every cluster once, neighbourhoods complete inside them.",
        ]
    if kept is not None and kept < KEPT_EDGES and not skewed:
        return "cluster_gcn", [
            f"The fanouts {list(fanouts)} keep {'at most' if stats.degrees is None else 'only'} {kept:.0%} "
            "of the in-edges at some layer (< "
            f"{KEPT_EDGES:.0%}; average in-degree {stats.avg_degree:.1f}): sampling truncates most "
            "neighbourhoods.",
            "Cluster-GCN: clusters keep most of each neighbourhood (METIS cuts few edges).",
        ]
    if skewed:
        d = stats.degrees
        return "importance", [
            f"In-degrees are skewed: p99/median {d.p99_over_median:.1f} and Gini {d.gini:.2f} (the top 1% of "
            f"nodes receive {d.top1pct_edge_share:.0%} of the edges; max {d.max:,}, median {d.median:g}).",
            "Importance sampling: neighbours drawn in proportion to their degree reach the hubs that uniform "
            "draws miss.",
        ]
    if stats.degrees is None:
        return "neighbor", [
            "Neighbour sampling: a node task at scale. The graph is described, not read: its degree "
            "distribution (and so its skew) is unknown.",
        ]
    d = stats.degrees
    return "neighbor", [
        f"In-degrees are even enough for uniform draws: p99/median {d.p99_over_median:.1f}, Gini {d.gini:.2f}.",
        "Neighbour sampling: a node task at scale, each batch's cost fixed by the fanouts.",
    ]


def describe_fit(fit: dict) -> str:
    parts = []
    if fit.get("batch_size"):
        parts.append(f"train.batch_size up to {fit['batch_size']:,} at the configured fanouts")
    if fit.get("fanouts"):
        parts.append(
            f"fanouts up to {fit['fanouts']} (x{fit['fanout_scale']:g}) at the configured batch size"
        )
    if not parts:
        return "Nothing larger than the smallest batch fits the budget."
    state = "fits" if fit.get("configured_fits") else "does NOT fit"
    return f"The configured batch {state}; within the budget: " + "; ".join(parts) + "."
