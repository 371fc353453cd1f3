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


def files_of(fmt: str, subset: bool) -> list[str]:
    files = [CSV] if fmt == "csv" else [RECOMMENDATIONS, SCORES]
    return files + ([NODES] if subset else [])


def write_npy(path: Path, array: np.ndarray) -> None:
    """A small .npy (nodes.npy: row i of the outputs is node nodes[i]; recall_sample.npy), atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array)
