"""`gnnscale recommend`: each node's top-K candidate partners by embedding similarity, excluding itself
and its existing neighbours (either direction).

inputs.py       embeddings (an infer run's mmap'd .npy), query node ids, option checks
neighbours.py   who is already linked to whom: the CSC's in-edges, plus out-edges for a directed graph
index.py        the faiss index (exact flat, IVF or HNSW) and a streamed exact scan
search.py       chunked search with neighbour exclusion, search-parameter tuning and recall@K
output.py       recommendations.npy + scores.npy (mmap'd, published atomically) or recommendations.csv
ranking.py      how a run ranks, from emb_info.json: on the graph or an edge split, re-ranked or not
fof.py          friends of friends ranked by common neighbours (candidates, and the baseline)
rerank.py       the second stage: candidates scored by the link checkpoint's own pair decoder
holdout.py      recall@K / NDCG@K of an edge split's held-out partners
job.py          one run: index, tuning, chunked search, re-ranking, outputs
"""
