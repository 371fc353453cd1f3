"""Streamed outputs: recommendations.npy (int64 [n, K]) + scores.npy (float32 [n, K]) as memory maps, or
recommendations.csv; each written under a temporary name and renamed into place only when complete."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import numpy as np

from gnnscale.utils.atomic import atomic_path

RECOMMENDATIONS, SCORES, CSV, NODES = "recommendations.npy", "scores.npy", "recommendations.csv", "nodes.npy"


class NpyOutput:
    def __init__(self, rec_path: Path, score_path: Path, rows: int, k: int):
        self.ids = np.lib.format.open_memmap(rec_path, mode="w+", dtype=np.int64, shape=(rows, k))
        self.scores = np.lib.format.open_memmap(score_path, mode="w+", dtype=np.float32, shape=(rows, k))

    def write(self, lo: int, nodes: np.ndarray, ids: np.ndarray, scores: np.ndarray) -> None:
        self.ids[lo : lo + len(ids)] = ids
        self.scores[lo : lo + len(ids)] = scores

    def close(self) -> None:
        self.ids.flush()
        self.scores.flush()
        del self.ids, self.scores


class CsvOutput:
    """node,rank,candidate,score: one line per filled slot (rank 1 = best)."""

    def __init__(self, path: Path):
        self.fh = open(path, "w")
        self.fh.write("node,rank,candidate,score\n")

    def write(self, lo: int, nodes: np.ndarray, ids: np.ndarray, scores: np.ndarray) -> None:
        r, c = np.nonzero(ids >= 0)  # row-major: each node's filled slots, best first
        lines = [
            f"{a},{b},{cand},{s:.6g}"
            for a, b, cand, s in zip(
                nodes[r].tolist(), (c + 1).tolist(), ids[r, c].tolist(), scores[r, c].tolist(), strict=True
            )
        ]
        if lines:
            self.fh.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self.fh.close()


@contextlib.contextmanager
def open_output(run_dir: Path, fmt: str, rows: int, k: int) -> Iterator[NpyOutput | CsvOutput]:
    """The writer for recommend.format; its files appear under their names only if the block completes."""
    with contextlib.ExitStack() as stack:
        if fmt == "csv":
            out = CsvOutput(stack.enter_context(atomic_path(run_dir / CSV)))
        else:
            rec = stack.enter_context(atomic_path(run_dir / RECOMMENDATIONS))
            out = NpyOutput(rec, stack.enter_context(atomic_path(run_dir / SCORES)), rows, k)
        try:
            yield out
        finally:
            out.close()


def output_bytes(rows: int, k: int, fmt: str, csc, directed: bool) -> int:
    """About what a run writes under run_dir: the outputs (npy: an int64 id + a float32 score per slot;
    csv: a line per slot), nodes.npy for a subset, and a directed graph's transposed adjacency (scratch)."""
    num_nodes, num_edges = len(csc[0]) - 1, len(csc[1])
    if fmt == "csv":  # node,rank,candidate,score: two ids, the rank, a 6-digit score, separators
        slot = 2 * len(str(num_nodes)) + len(str(k)) + 16
    else:
        slot = 8 + 4
    scratch = 8 * num_edges if directed else 0
    return rows * k * slot + 8 * rows + scratch + 65536


def files_of(fmt: str, subset: bool) -> list[str]:
    files = [CSV] if fmt == "csv" else [RECOMMENDATIONS, SCORES]
    return files + ([NODES] if subset else [])


def read_examples(run_dir: Path, files: list[str], rows: int = 3, top: int = 5) -> list[dict]:
    """The first `rows` query nodes of a finished run with their best `top` partners and scores, read back
    from its outputs (the pipeline's headline): [{"node": 0, "partners": [[17, 3.2], ...]}, ...]."""
    run_dir = Path(run_dir)
    if CSV in files:
        out: dict[int, list] = {}
        with open(run_dir / CSV) as fh:
            next(fh)  # header
            for line in fh:
                node, rank, cand, score = line.rstrip("\n").split(",")
                if int(node) not in out and len(out) == rows:
                    break
                if int(rank) <= top:
                    out.setdefault(int(node), []).append([int(cand), float(score)])
        return [{"node": n, "partners": p} for n, p in out.items()]
    ids = np.load(run_dir / RECOMMENDATIONS, mmap_mode="r")[:rows, :top]
    scores = np.load(run_dir / SCORES, mmap_mode="r")[:rows, :top]
    nodes = np.load(run_dir / NODES)[:rows] if NODES in files else np.arange(len(ids))
    return [
        {"node": int(n), "partners": [[int(c), float(s)] for c, s in zip(i, sc, strict=True) if c >= 0]}
        for n, i, sc in zip(nodes, ids, scores, strict=True)
    ]


def write_npy(path: Path, array: np.ndarray) -> None:
    """A small .npy (nodes.npy: row i of the outputs is node nodes[i]; recall_sample.npy), atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array)
