"""`gnnscale recommend`: an infer run's embeddings -> each node's top-K candidate partners that are not
already its neighbours (either direction) nor itself, scored by inner product (or cosine).

Exact search (faiss IndexFlatIP) below recommend.exact_below nodes, an IVF index above (or HNSW) over rows
lifted to equal norm (inner product becomes nearest neighbour), its nprobe / efSearch tuned on a sample of
queries to reach recommend.target_recall against exact search. Queries run in chunks and stream into
mmap'd recommendations.npy / scores.npy. Before any of it the graph_dir's shards and CSC are checked
against meta.json (verify=stamp|full|off, as every reading stage) and a disk without room for the outputs
is refused (exit 2). The work is in gnnscale/recommend/.
"""

from __future__ import annotations

from omegaconf import DictConfig

from gnnscale.config.schema import RecommendOptions
from gnnscale.errors import ConfigError
from gnnscale.recommend.index import choose_kind
from gnnscale.recommend.inputs import check_k, check_options, graph_dir_of, open_embeddings, query_nodes
from gnnscale.recommend.job import recommend
from gnnscale.recommend.output import output_bytes
from gnnscale.recommend.ranking import open_ranking
from gnnscale.stages.common import metered, stage_options
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import SUMMARY, find_embeddings, make_run_dir, write_summary
from gnnscale.storage.verify import verify_graph_dir
from gnnscale.utils.diskspace import ensure_space
from gnnscale.utils.ui import info, summary_table


def run(cfg: DictConfig) -> dict:
    opts = stage_options(cfg, "recommend", RecommendOptions, check_options)
    if cfg.get("emb") and cfg.get("infer_dir"):
        raise ConfigError(
            "both emb= and infer_dir= are set", "pass one: an embeddings .npy or an infer run_dir"
        )
    emb_path, emb_info = find_embeddings(cfg.get("emb") or cfg.get("infer_dir"))
    graph = GraphDir(graph_dir_of(cfg.get("graph_dir"), emb_info, emb_path))
    emb = open_embeddings(emb_path, emb_info, graph.num_nodes)
    check_k(opts.k, graph.num_nodes)
    nodes = query_nodes(opts.nodes, graph.num_nodes)
    verify_graph_dir(graph.path, cfg.verify, meta=graph.meta)  # exit 2 naming a bad file
    ranking, csc = open_ranking(opts, emb_info, graph, emb.shape[1])
    kind, why = choose_kind(opts.index, graph.num_nodes, int(opts.exact_below))
    if emb_info and emb_info.get("graph_shards_sha256") not in (
        None,
        [s["sha256"] for s in graph.meta["shards"]],
    ):
        info(f"warning: {emb_path} was computed on another version of {graph.path} (shard checksums differ)")
    run_dir = make_run_dir(cfg, "recommend")
    directed, queries = bool(graph.meta["directed"]), graph.num_nodes if nodes is None else len(nodes)
    # mapped writes (SIGBUS on a full disk, not ENOSPC): refuse up front
    ensure_space(run_dir, output_bytes(queries, int(opts.k), opts.format, csc, directed))
    with metered() as meter:
        result = recommend(
            emb, csc, directed, nodes, run_dir, opts,
            kind=kind, seed=int(cfg.seed), order=graph.node_order, ranking=ranking,
        )  # fmt: skip
    summary = {
        "stage": "recommend",
        "embeddings": str(emb_path),
        "graph_dir": str(graph.path),
        "num_nodes": graph.num_nodes,
        **result,
        "index_why": why,
        **meter.stats(),
    }
    write_summary(run_dir, summary)
    summary_table(f"recommend: top-{opts.k} of {summary['embeddings']}", _rows(summary))
    info(f"outputs: {run_dir}  ({SUMMARY}, {', '.join(summary['files'])})")
    return {**summary, "run_dir": str(run_dir)}


def _rows(s: dict) -> dict:
    idx = s["index"]
    knob = ", ".join(f"{key}={idx[key]}" for key in ("nlist", "nprobe", "hnsw_m", "ef_search") if key in idx)
    rows = {
        "queries": f"{s['queries']:,} of {s['num_nodes']:,} nodes, k={s['k']}, metric={s['metric']}",
        "index": f"{idx['kind']} ({s['index_why']}){'; ' + knob if knob else ''}",
        "index build (s)": s["index_build_s"],
        "search (s)": s["search_s"],
        "queries / s": s["queries_per_s"],
    }
    if s["recall"]:
        rec = s["recall"]
        at = f"recall_at_{rec['k']}"
        rows[f"index recall@{rec['k']} vs exact"] = (
            f"{rec[at]} on {rec['sample_queries']:,} queries (target {rec['target']})"
        )
    if s["rerank"]:
        r = s["rerank"]
        rows["re-ranked by"] = (
            f"the checkpoint's {r['decoder']} decoder: the index's top {r['index_candidates']} "
            f"+ {r['fof_candidates']} friends of friends"
        )
    k = s["k"]
    for name, got in (s["held_out"] or {}).items():
        who = "friends of friends by CN" if name == "friends_of_friends_cn" else name
        rows[f"held-out recall / ndcg@{k}: {who}"] = (
            f"{got[f'recall_at_{k}']} / {got[f'ndcg_at_{k}']} ({got['queries']:,} queries)"
        )
    if s["short_rows"]:
        rows["rows with < k candidates"] = s["short_rows"]
    rows["wall time (s)"] = s["wall_time_s"]
    rows["peak memory (MB)"] = f"{s['peak_anon_mb']} anonymous, {s['peak_rss_mb']} RSS"
    return rows
