"""The source interface: every raw format streams node rows in order and edges in chunks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from gnnscale.errors import DataError


@dataclass
class NodeBlock:
    start: int
    feat: np.ndarray  # [n, F]
    label: np.ndarray  # [n] int64, -1 = unlabelled
    split: np.ndarray | None = None  # [n] int8: 0 train / 1 val / 2 test / -1 none; None = no own split


class Source(ABC):
    """A raw graph. Attributes are known before streaming starts, so the writer can size its files."""

    name: str
    num_nodes: int
    feat_dim: int
    num_classes: int | None = None  # None = max label + 1
    feat_dtype: str = "float32"

    @abstractmethod
    def node_blocks(self) -> Iterator[NodeBlock]:
        """Yield consecutive node rows starting at node 0."""

    @abstractmethod
    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (src, dst) int64 arrays of global node IDs, in any order."""

    def describe(self) -> dict:
        """Provenance recorded in meta.json under `source`."""
        return {}


def require_file(path: str | Path | None, what: str, key: str = "data.path") -> Path:
    if path is None or str(path) == "":
        raise DataError(f"no {what} given", f"set {key}=PATH")
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{what} '{p}' does not exist", f"check {key}=")
    return p


def blocks_from_arrays(feat, label, split=None, block_rows: int = 65536) -> Iterator[NodeBlock]:
    """Node blocks over in-memory (or mmap'd) arrays."""
    n = len(feat)
    for lo in range(0, n, block_rows):
        hi = min(lo + block_rows, n)
        yield NodeBlock(
            lo,
            np.asarray(feat[lo:hi]),
            np.asarray(label[lo:hi]),
            None if split is None else np.asarray(split[lo:hi]),
        )


def chunks_from_arrays(src, dst, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for lo in range(0, len(src), chunk):
        yield (
            np.asarray(src[lo : lo + chunk], dtype=np.int64),
            np.asarray(dst[lo : lo + chunk], dtype=np.int64),
        )


def split_from_masks(n: int, train, val, test) -> np.ndarray:
    """Masks -> one int8 split code per node; a node in several masks is an input error."""
    split = np.full(n, -1, dtype=np.int8)
    for code, mask in enumerate((train, val, test)):
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != n:
            raise DataError(
                f"a split mask has {len(mask)} entries for {n} nodes", "masks need one entry per node"
            )
        if (split[mask] != -1).any():
            raise DataError("a node is in more than one of train/val/test", "make the split masks disjoint")
        split[mask] = code
    return split
