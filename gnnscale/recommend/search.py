"""Top-K per query after leaving out the query itself and its neighbours; tuning and recall@K.

faiss returns the kq nearest rows; it cannot skip a per-query set of ids at this scale (an IDSelector is
one set for the whole batch), so the exclusion is done here on a few more candidates than K.
"""

from __future__ import annotations

import numpy as np

from gnnscale.recommend.index import KNOBS, knob_ladder, set_knob

RESULT_BYTES = 256 << 20  # one search call's results and exclusion temporaries: rows x kq x ~48 bytes


def first_kq(k: int, degrees: np.ndarray) -> int:
    """Candidates asked for at first: K + the query itself + the chunk's 99th-percentile degree (rows
    with more neighbours than that are asked again)."""
    return k + 1 + (int(np.percentile(degrees, 99)) if len(degrees) else 0)


def search_excluding(search, xq, nodes, k, nbrs, num_nodes) -> tuple[np.ndarray, np.ndarray]:
    """ids int64 [rows, k] and scores float32 [rows, k] of the best candidates that are neither the row's
    node nor its neighbour, first_kq of them asked for at first. A row left short is asked again with
    more candidates (at least K + 1 + its degree, which exact search always satisfies) unless the index
    had no more to give: it returned fewer than kq (an IVF's probed lists ran out), or kq already
    reached twice what exact search needs or every node. Unfilled slots: -1 / NaN. Rows go in batches
    that keep RESULT_BYTES."""
    rows = len(nodes)
    out_i = np.full((rows, k), -1, dtype=np.int64)
    out_d = np.full((rows, k), np.nan, dtype=np.float32)
    degree = nbrs.degree(nodes)
    need = k + 1 + degree
    todo = np.arange(rows)
    kq = min(first_kq(k, degree), num_nodes)
    while len(todo):
        step, short = max(1, RESULT_BYTES // (kq * 48)), []
        for a in range(0, len(todo), step):
            part = todo[a : a + step]
            dist, ids = search(xq[part], kq)
            keep = (ids >= 0) & ~nbrs.excluded(nodes[part], ids)
            rank = np.cumsum(keep, axis=1, dtype=np.int32)
            final = (rank[:, -1] >= k) | (ids[:, -1] < 0) | (kq >= num_nodes) | (kq >= 2 * need[part])
            r, c = np.nonzero(keep & (rank <= k) & final[:, None])
            out_i[part[r], rank[r, c] - 1] = ids[r, c]
            out_d[part[r], rank[r, c] - 1] = dist[r, c]
            short.append(part[~final])
        todo = np.concatenate(short)
        if len(todo):
            kq = min(num_nodes, max(2 * kq, int(need[todo].max())))
    return out_i, out_d


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float | None:
    """Mean over rows of |approx ∩ exact| / |exact| (ids, -1 = empty slot); None when nothing to compare."""
    scores = []
    for a, e in zip(approx, exact, strict=True):
        e = e[e >= 0]
        if len(e):
            scores.append(len(np.intersect1d(a[a >= 0], e)) / len(e))
    return float(np.mean(scores)) if scores else None


def tune_knob(
    index, kind, k, xq, nodes, exact_ids, nbrs, num_nodes, target, report=None
) -> tuple[int, list[dict]]:
    """The cheapest knob value (nprobe / efSearch) whose recall@K on the sample reaches target."""
    tried = []
    for value in knob_ladder(kind, index, k):
        set_knob(index, kind, value)
        ids, _ = search_excluding(index.search, xq, nodes, k, nbrs, num_nodes)
        rec = recall_at_k(ids, exact_ids)
        tried.append({KNOBS[kind]: value, "recall": None if rec is None else round(rec, 4)})
        if report is not None:
            report(tried[-1])
        if rec is None or rec >= target:
            break
    return value, tried
