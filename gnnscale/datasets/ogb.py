"""An OGB node-property dataset folder as OGB lays it out on disk, read without the `ogb` package:

    raw/edge.csv.gz            src,dst per line (no header)
    raw/node-feat.csv.gz       one comma-separated float row per node
    raw/node-label.csv.gz      one label per line (NaN = unlabelled, as in ogbn-papers100M)
    raw/num-node-list.csv.gz   optional: the node count
    split/<name>/{train,valid,test}.csv.gz   node ids, one per line

Every file is streamed with pandas' chunked reader, so an ogbn-papers100M-sized file never sits
whole in memory; only the split id lists (a few percent of the nodes) are held.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from gnnscale.datasets.base import NodeBlock, Source, require_file
from gnnscale.datasets.edgelist import read_edge_chunks
from gnnscale.errors import DataError

BLOCK_ROWS = 65536
SPLIT_FILES = ("train", "valid", "test")
READ_ERRORS = (
    ValueError,
    pd.errors.ParserError,
    pd.errors.EmptyDataError,
    OSError,
    EOFError,
    zlib.error,
    OverflowError,
)


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def count_lines(path: Path) -> int:
    """Rows of a gzip text file, counted over decompressed 16 MiB pieces (one pass, no parsing)."""
    rows, last = 0, b"\n"
    try:
        with gzip.open(path, "rb") as fh:
            while piece := fh.read(1 << 24):
                rows += piece.count(b"\n")
                last = piece[-1:]
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read '{path}': {_short(exc)}", "re-download the dataset folder") from None
    return rows + (last != b"\n")


def read_num_nodes(path: Path) -> int:
    try:
        values = pd.read_csv(path, header=None, dtype=np.int64).to_numpy().ravel()
    except READ_ERRORS as exc:
        raise DataError(
            f"cannot read '{path}' as one integer node count: {_short(exc)}", "re-download the dataset folder"
        ) from None
    if len(values) != 1:
        raise DataError(
            f"'{path}' lists {len(values)} node counts (one per graph)",
            "only single-graph node-property datasets (ogbn-*) are supported",
        )
    return int(values[0])


def feature_width(path: Path) -> int:
    try:
        with gzip.open(path, "rt") as fh:
            line = fh.readline()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read '{path}': {_short(exc)}", "re-download the dataset folder") from None
    if not line.strip():
        raise DataError(f"'{path}' is empty", "re-download the dataset folder")
    return len(line.split(","))


def as_labels(values: np.ndarray, path: Path) -> np.ndarray:
    nan = np.isnan(values)
    if (values[~nan] != np.round(values[~nan])).any() or (values[~nan] < 0).any():
        raise DataError(
            f"'{path}' holds a label that is not a class id 0..C-1",
            "labels must be non-negative integers (NaN = unlabelled)",
        )
    return np.where(nan, -1, values).astype(np.int64)


def find_split_dir(root: Path, setting: str) -> Path | None:
    folder = root / "split"
    names = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if setting != "auto":
        if setting not in names:
            raise DataError(
                f"no split '{setting}' under '{folder}' (found: {', '.join(names) or 'none'})",
                "set data.split_name= to one of them, or auto",
            )
        return folder / setting
    if not names:
        return None  # none shipped: the writer makes the seeded random split
    if len(names) > 1:
        raise DataError(
            f"'{folder}' holds several splits: {', '.join(names)}", "choose one with data.split_name="
        )
    return folder / names[0]


def _empty_split(path: Path) -> DataError:
    # OGB ships every split non-empty; an empty file is a truncated download or a broken export, and
    # taken as is it would train on nothing (train) or report no score (valid/test) without a word.
    return DataError(
        f"OGB split file '{path}' lists no node ids",
        "re-download the dataset folder, or set data.use_source_split=false for a seeded random split",
    )


def read_ids(path: Path, n: int) -> np.ndarray:
    require_file(path, "OGB split file", "data.split_name")
    try:
        frame = pd.read_csv(path, header=None, dtype=np.int64)
    except pd.errors.EmptyDataError:
        raise _empty_split(path) from None
    except READ_ERRORS as exc:
        raise DataError(
            f"'{path}' must hold one integer node id per line: {_short(exc)}",
            "re-download the dataset folder",
        ) from None
    if frame.shape[1] != 1:
        raise DataError(
            f"'{path}' has {frame.shape[1]} columns, expected one node id per line",
            "re-download the dataset folder",
        )
    ids = np.sort(frame.to_numpy().ravel())
    if not len(ids):
        raise _empty_split(path)
    if ids[0] < 0 or ids[-1] >= n:
        bad = ids[0] if ids[0] < 0 else ids[-1]
        raise DataError(
            f"'{path}' names node {int(bad)}, outside 0..{n - 1}", "the split does not belong to this dataset"
        )
    return ids


class OgbSource(Source):
    def __init__(self, cfg):
        self.cfg = cfg
        self.root = require_file(cfg.path, "OGB dataset folder")
        if not self.root.is_dir():
            raise DataError(
                f"data.path='{self.root}' is not a folder",
                "point data.path= at the OGB dataset folder (holding raw/ and split/)",
            )
        self.name = self.root.name if cfg.name in ("auto", "", None) else str(cfg.name)
        raw = self.root / "raw"
        self.edge_file = require_file(raw / "edge.csv.gz", "OGB edge file")
        self.feat_file = require_file(raw / "node-feat.csv.gz", "OGB node feature file")
        self.label_file = require_file(raw / "node-label.csv.gz", "OGB node label file")
        count_file = raw / "num-node-list.csv.gz"
        self.num_nodes = read_num_nodes(count_file) if count_file.exists() else count_lines(self.label_file)
        self.feat_dim = feature_width(self.feat_file)
        self.num_classes = None
        self.chunk_edges = int(cfg.chunk_edges)
        split_dir = find_split_dir(self.root, str(cfg.split_name)) if cfg.use_source_split else None
        self.split_dir = split_dir
        self._split_ids = self._read_split(split_dir) if split_dir is not None else None

    def _read_split(self, folder: Path) -> list[np.ndarray]:
        ids = [read_ids(folder / f"{part}.csv.gz", self.num_nodes) for part in SPLIT_FILES]
        every = np.concatenate(ids)
        if len(np.unique(every)) != len(every):
            raise DataError(
                f"a node is listed twice in the split under '{folder}' (within or across train/valid/test)",
                "make the split files disjoint",
            )
        return ids

    def _block_split(self, lo: int, hi: int) -> np.ndarray | None:
        if self._split_ids is None:
            return None
        split = np.full(hi - lo, -1, dtype=np.int8)
        for code, ids in enumerate(self._split_ids):
            a, b = np.searchsorted(ids, [lo, hi])
            split[ids[a:b] - lo] = code
        return split

    def _chunks(self, path: Path, dtype) -> Iterator[np.ndarray]:
        try:
            with pd.read_csv(path, header=None, dtype=dtype, chunksize=BLOCK_ROWS, engine="c") as reader:
                for frame in reader:
                    yield frame.to_numpy(dtype=dtype)
        except READ_ERRORS as exc:
            raise DataError(
                f"'{path}' has a malformed row: {_short(exc)}",
                "every row needs the same number of numeric, comma-separated values",
            ) from None

    def node_blocks(self) -> Iterator[NodeBlock]:
        labels = self._chunks(self.label_file, np.float64)
        start = 0
        for feat in self._chunks(self.feat_file, np.float32):
            label = next(labels, np.empty((0, 1)))
            if label.shape[1] != 1:
                raise DataError(
                    f"'{self.label_file}' has {label.shape[1]} columns",
                    "only single-label node classification is supported (one label per line)",
                )
            if len(label) != len(feat):
                raise DataError(
                    f"'{self.label_file}' and '{self.feat_file}' have different row counts",
                    "give one label and one feature row per node",
                )
            if start + len(feat) > self.num_nodes:
                raise DataError(
                    f"'{self.feat_file}' has more rows than the {self.num_nodes} nodes",
                    "give one feature row per node",
                )
            yield NodeBlock(
                start,
                feat,
                as_labels(label[:, 0], self.label_file),
                self._block_split(start, start + len(feat)),
            )
            start += len(feat)
        if next(labels, None) is not None:
            raise DataError(
                f"'{self.label_file}' has more rows than '{self.feat_file}'",
                "give one label and one feature row per node",
            )
        if start != self.num_nodes:
            raise DataError(
                f"'{self.feat_file}' has {start} rows for {self.num_nodes} nodes",
                "give one feature row per node",
            )

    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return read_edge_chunks(self.edge_file, ",", False, self.chunk_edges)

    def describe(self) -> dict:
        return {
            "path": str(self.root),
            "split": self.split_dir.name if self.split_dir is not None else "random",
        }
