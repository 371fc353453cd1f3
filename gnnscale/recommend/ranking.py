"""How a recommend run ranks, decided from what produced the embeddings (emb_info.json): over the graph or
over an edge split's message-passing graph (then scored against its held-out test partners), and by the
index's metric alone or re-ranked by the checkpoint's pair decoder."""

from __future__ import annotations

from gnnscale.recommend.holdout import HeldOut, pair_csc
from gnnscale.recommend.job import Ranking
from gnnscale.recommend.rerank import decoder_for
from gnnscale.storage.csc import open_csc
from gnnscale.storage.edge_split import open_edge_split
from gnnscale.tasks.pair_features import PairStructure
from gnnscale.utils.ui import info


def open_ranking(opts, emb_info: dict | None, graph, width: int) -> tuple[Ranking, tuple]:
    """(the Ranking, the CSC whose neighbours are left out: the graph's, or the edge split's)."""
    name = (emb_info or {}).get("edge_split")
    held, exclude = None, []
    if name:
        split = open_edge_split(graph, name)
        csc = (split.indptr, split.indices)
        held = HeldOut(split.test, graph.num_nodes, graph.node_order)
        exclude = [pair_csc(split.val, graph.num_nodes)]
        info(
            f"recommend: the embeddings were computed on edge split '{name}' (infer.edge_split): its "
            f"message-passing graph is the one recommended on, and the {split.test.shape[1]:,} held-out "
            "test edges are the partners recall@K counts (validation edges are left out of every list)"
        )
    else:
        csc = open_csc(graph)
    decoder = decoder_for(opts, emb_info, width)
    if decoder is not None:
        info(
            f"recommend: top-{max(int(opts.k), int(opts.candidates))} of the index and the "
            f"{opts.fof_candidates} friends of friends with the most common neighbours, re-ranked by the "
            f"checkpoint's pair decoder ({decoder.kind}); recommend.rerank=off ranks by {opts.metric} alone"
        )
    elif (emb_info or {}).get("decoder") in ("mlp", "dot+counts"):
        info(
            f"note: the embeddings' model scores pairs with its {emb_info['decoder']} decoder; with "
            f"recommend.rerank={opts.rerank} the top-K here are by {opts.metric} alone, not the model's score"
        )
    structure = PairStructure(*csc, graph.num_nodes) if decoder is not None or held is not None else None
    return Ranking(decoder, structure, held, exclude), csc
