"""One recommend run: build the index, tune it on a sample of queries against exact search, search every
query in chunks with neighbour exclusion, re-rank each chunk's candidates with the model's pair decoder when
there is one (rerank.py), stream the results out, and report recall@K of the index against exact search and,
on an edge split's message-passing graph, recall@K / NDCG@K of the held-out partners (holdout.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from gnnscale.recommend.fof import FriendsOfFriends
from gnnscale.recommend.holdout import HeldOut
from gnnscale.recommend.index import (
    KNOBS,
    ExactScan,
    build_index,
    default_knob,
    index_bytes,
    set_knob,
    vectors,
)
from gnnscale.recommend.neighbours import Neighbours
from gnnscale.recommend.output import NODES, files_of, open_output, write_npy
from gnnscale.recommend.rerank import PairDecoder, SecondStage
from gnnscale.recommend.search import recall_at_k, search_excluding, tune_knob
from gnnscale.utils.ui import info, make_progress

SCRATCH = ".neighbours"  # run_dir scratch: the out-edge adjacency of a directed graph, removed at the end
SAMPLE_FILE = "recall_sample.npy"  # the output rows whose recall@K summary.json reports


@dataclass
class Sample:
    """Query rows checked against exact search: their ids, vectors and exact top-K (after exclusion)."""

    rows: np.ndarray
    nodes: np.ndarray
    xq: np.ndarray
    exact: np.ndarray
    exact_s: float


def _queries(nodes: np.ndarray | None, lo: int, hi: int):
    """(query ids, embedding rows) of output rows lo..hi: a slice when every node is a query."""
    if nodes is None:
        return np.arange(lo, hi, dtype=np.int64), slice(lo, hi)
    return nodes[lo:hi], nodes[lo:hi]


@dataclass
class Ranking:
    """What happens to the index's results: re-ranked by a pair decoder over the graph's structure (a
    tasks.pair_features.PairStructure), scored against held-out partners (held) beside friends of friends."""

    decoder: PairDecoder | None = None
    structure: object = None  # needed by the decoder's counts and by friends of friends
    held: HeldOut | None = None
    exclude: list = field(default_factory=list)  # more (indptr, indices) whose links are left out (val edges)


def index_k(opts, reranked: bool) -> int:
    """How many results the index returns per query: the re-ranked pool's share, or the list itself."""
    return max(int(opts.k), int(opts.candidates)) if reranked else int(opts.k)


def recommend(
    emb, csc, directed: bool, nodes, run_dir: Path, opts, *, kind: str, seed: int, order=None, ranking=None
) -> dict:
    """order: graph_dir's NodeOrder; embeddings, queries and results are all in the user's ids."""
    ranking = ranking or Ranking()
    n, dim = emb.shape
    k_search = index_k(opts, ranking.decoder is not None)
    m = n if nodes is None else len(nodes)
    if opts.num_threads > 0:
        faiss.omp_set_num_threads(int(opts.num_threads))
    need = index_bytes(kind, n, dim, opts)
    info(
        f"recommend: {m:,} queries over {n:,} x {dim} embeddings; {kind} index ~{need / 2**20:,.0f} MB in RAM"
    )
    nbrs = Neighbours(*csc, directed, run_dir / SCRATCH, order, ranking.exclude)
    fof = None if ranking.structure is None else FriendsOfFriends(ranking.structure, nbrs, order)
    second = None
    if ranking.decoder is not None:
        second = SecondStage(
            emb, ranking.decoder, ranking.structure, fof, opts.k, fof_k=opts.fof_candidates, order=order
        )
    try:
        with make_progress() as bar:
            t0 = time.time()
            index, index_info = build_index(
                kind, emb, opts.metric, opts, seed, _bar_callback(bar, f"add to {kind} index")
            )
            build_s = time.time() - t0
            sample = _sample(emb, nodes, m, kind, nbrs, opts, seed, k_search)
            t0 = time.time()
            knob, tuning = _choose_knob(index, kind, opts, sample, nbrs, n, k_search)
            tune_s = time.time() - t0
            t0 = time.time()
            lists = (second, ranking.held, fof)
            short, captured = _search_all(index, emb, nodes, m, nbrs, sample, run_dir, opts, bar, lists)
            search_s = time.time() - t0
    finally:
        nbrs.close()
    if nodes is not None:
        write_npy(run_dir / NODES, nodes)
    return {
        "queries": m,
        "k": int(opts.k),
        "metric": opts.metric,
        "dim": dim,
        "directed": directed,
        "index": {
            **index_info,
            **({KNOBS[kind]: knob} if knob else {}),
            "ram_estimate_mb": round(need / 2**20, 1),
        },
        "tuning": tuning,
        "recall": _recall(captured, sample, run_dir, opts, k_search),
        "rerank": None
        if second is None
        else {"decoder": second.decoder.kind, "index_candidates": k_search, "fof_candidates": second.fof_k},
        "held_out": None if ranking.held is None else ranking.held.result(int(opts.k)),
        "short_rows": short,
        "files": files_of(opts.format, nodes is not None) + ([SAMPLE_FILE] if sample is not None else []),
        "index_build_s": round(build_s, 3),
        "tune_s": round(tune_s, 3),
        "search_s": round(search_s, 3),
        "queries_per_s": round(m / max(search_s, 1e-9)),
    }


def _bar_callback(bar, description: str):
    """progress(done, total) for a bar task created on the first call (after any untimed setup)."""
    task = []

    def cb(done: int, total: int) -> None:
        if not task:
            task.append(bar.add_task(description, total=total, extra=""))
        bar.update(task[0], completed=done)

    return cb


def _sample(emb, nodes, m: int, kind: str, nbrs, opts, seed: int, k: int) -> Sample | None:
    """recall_sample random queries and their exact results (an approximate index only)."""
    if kind == "exact" or int(opts.recall_sample) == 0:
        return None
    t0 = time.time()
    rows = np.sort(np.random.default_rng(seed).choice(m, size=min(int(opts.recall_sample), m), replace=False))
    ids = rows if nodes is None else nodes[rows]
    xq = vectors(emb, ids, opts.metric)
    n = emb.shape[0]
    exact, _ = search_excluding(ExactScan(emb, opts.metric).search, xq, ids, k, nbrs, n)
    return Sample(rows, ids, xq, exact, time.time() - t0)


def _choose_knob(
    index, kind: str, opts, sample: Sample | None, nbrs, n: int, k: int
) -> tuple[int | None, list | None]:
    """nprobe / efSearch: the user's, else the cheapest reaching target_recall on the sample."""
    if kind not in KNOBS:
        return None, None
    if int(opts[KNOBS[kind]]) or sample is None:
        value, tried = default_knob(kind, index, opts), None
    else:
        value, tried = tune_knob(
            index,
            kind,
            k,
            sample.xq,
            sample.nodes,
            sample.exact,
            nbrs,
            n,
            float(opts.target_recall),
            report=lambda t: info(f"tune {kind}: {t} on {len(sample.rows):,} sampled queries"),
        )
    set_knob(index, kind, value)
    return value, tried


def _search_all(index, emb, nodes, m: int, nbrs, sample: Sample | None, run_dir: Path, opts, bar, lists):
    """Every query, chunk_size at a time, streamed to the output; keeps the sample rows' index results.
    lists: (the SecondStage, the HeldOut, the FriendsOfFriends), each None when not asked for."""
    second, held, friends = lists
    k, n, chunk = int(opts.k), emb.shape[0], int(opts.chunk_size)
    k_search = index_k(opts, second is not None)
    captured = None if sample is None else np.full((len(sample.rows), k_search), -1, dtype=np.int64)
    short = 0
    task = bar.add_task("recommend", total=m, extra=f"k={k}")
    with open_output(run_dir, opts.format, m, k) as writer:
        for lo in range(0, m, chunk):
            hi = min(lo + chunk, m)
            ids, rows = _queries(nodes, lo, hi)
            xq = vectors(emb, rows, opts.metric)
            found, scores = search_excluding(index.search, xq, ids, k_search, nbrs, n)
            if captured is not None:
                a, b = np.searchsorted(sample.rows, [lo, hi])
                captured[a:b] = found[sample.rows[a:b] - lo]
            got, fof = found, None
            if second is not None:
                got, scores, fof = second.rank(ids, found)
            if held is not None:
                if fof is None or fof.shape[1] < k:
                    fof, _ = friends.top(ids, k)
                held.add("model", ids, got)
                held.add("friends_of_friends_cn", ids, fof[:, :k])
            writer.write(lo, ids, got, scores)
            short += int((got[:, -1] < 0).sum())
            bar.update(task, completed=hi)
    return short, captured


def _recall(captured, sample: Sample | None, run_dir: Path, opts, k: int) -> dict | None:
    """recall@K of the written results on the sample rows (saved to recall_sample.npy) vs exact search."""
    if sample is None:
        return None
    write_npy(run_dir / SAMPLE_FILE, sample.rows)
    rec = recall_at_k(captured, sample.exact)
    return {
        "k": k,  # the index's results per query: recommend.k, or the re-ranked pool's recommend.candidates
        f"recall_at_{k}": None if rec is None else round(rec, 4),
        "sample_queries": len(sample.rows),
        "target": float(opts.target_recall),
        "exact_sample_s": round(sample.exact_s, 3),
        "exact_s_per_query": round(sample.exact_s / len(sample.rows), 6),
    }
