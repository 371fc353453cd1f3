"""A CSV/TSV edge list (`src,dst` per line) plus optional .npy features / labels / split.

The edge file is read in chunks of `data.chunk_edges` rows, so it never sits whole in memory;
`.gz` files are read compressed. Lines starting with `#` are comments (SNAP files), a first line
in which no field is a number is a header, and columns after the first two (weights) are ignored.
The .npy files are memory-mapped.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from gnnscale.datasets.base import NodeBlock, Source, require_file
from gnnscale.errors import DataError

BLOCK_ROWS = 65536
DELIMITERS = {
    ",": ",",
    "comma": ",",
    "tab": "\t",
    "\t": "\t",
    "\\t": "\t",
    "space": r"\s+",
    " ": r"\s+",
    ";": ";",
}
STRUCTURAL_DIM = 2  # data.features=none: [1, log1p(degree)] per node


def structural_features(degree: np.ndarray) -> np.ndarray:
    """A featureless graph's node features: a constant and log(1 + degree). Degree is the one signal every
    graph has, and a fixed function of the graph (unlike learnable per-node embeddings) keeps the model
    inductive: it applies to nodes added later and its size does not grow with N."""
    out = np.ones((len(degree), STRUCTURAL_DIM), dtype=np.float32)
    out[:, 1] = np.log1p(degree)
    return out


EDGE_HINT = "each line must be two integer node ids 'src,dst' (CSV or TSV, an optional header line)"


def _open_text(path: Path):
    return gzip.open(path, "rt", errors="replace") if path.suffix == ".gz" else open(path, errors="replace")


def first_line(path: Path) -> tuple[int, str]:
    """(1-based line number, text) of the first line that is neither blank nor a `#` comment."""
    try:
        with _open_text(path) as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip() and not line.lstrip().startswith("#"):
                    return number, line.rstrip("\r\n")
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read edge file '{path}': {exc}", "check data.path=") from None
    raise DataError(f"edge file '{path}' holds no edges", EDGE_HINT)


def detect_delimiter(line: str, setting: str) -> str:
    if setting != "auto":
        if setting not in DELIMITERS:
            raise DataError(f"data.delimiter={setting!r} is not valid", "use auto, ',', tab, space or ';'")
        return DELIMITERS[setting]
    for char in ("\t", ",", ";"):
        if char in line:
            return char
    if len(line.split()) >= 2:
        return r"\s+"
    raise DataError(
        f"cannot tell the delimiter of the edge file from its first line {line!r}",
        EDGE_HINT + "; or set data.delimiter=",
    )


def _fields(line: str, sep: str) -> list[str]:
    return line.split() if sep == r"\s+" else [f.strip() for f in line.split(sep)]


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def has_header(line: str, sep: str, path: Path | str = "", number: int = 1) -> bool:
    """True for a header line (no field is a number), False for an edge line; anything else is refused.

    A line such as `0,1.5` is data gone wrong, not column names: dropping it as a header would lose an
    edge and hide the problem, so it is an error that names the line.
    """
    where = f"line {number} of edge file '{path}'" if path else f"line {number} of the edge file"
    fields = _fields(line, sep)
    if len(fields) < 2:
        raise DataError(f"{where} ({line!r}) has fewer than two columns", EDGE_HINT)
    try:
        int(fields[0]), int(fields[1])
    except ValueError:
        if any(_is_number(f) for f in fields):
            raise DataError(
                f"{where} ({line!r}) is neither an edge (two integer node ids) nor a header (no numbers)",
                f"fix or delete line {number}; {EDGE_HINT}",
            ) from None
        return True
    return False


def load_npy(path_value, what: str, key: str) -> np.ndarray:
    path = require_file(path_value, what, key)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(
            f"cannot read {what} '{path}' as .npy: {exc}",
            f"save it with numpy.save as a numeric array and pass {key}=",
        ) from None


def as_labels(raw: np.ndarray, what: str = "labels") -> np.ndarray:
    """int64 labels; float files are accepted when integral, with NaN meaning unlabelled."""
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.ndim != 1:
        raise DataError(
            f"{what} have shape {raw.shape}, expected [N]",
            "store one integer label per node (-1 = unlabelled)",
        )
    if raw.dtype.kind in "iub":
        label = np.asarray(raw, dtype=np.int64)
    elif raw.dtype.kind == "f":
        vals = np.asarray(raw, dtype=np.float64)
        nan = np.isnan(vals)
        if (vals[~nan] != np.round(vals[~nan])).any():
            raise DataError(
                f"{what} hold non-integer values", "store integer class ids (-1 or NaN = unlabelled)"
            )
        label = np.where(nan, -1, vals).astype(np.int64)
    else:
        raise DataError(
            f"{what} have dtype {raw.dtype}, expected integers", "store integer class ids (-1 = unlabelled)"
        )
    if len(label) and label.min() < -1:
        raise DataError(
            f"{what} hold {int(label.min())}", "use -1 for unlabelled nodes and 0..C-1 for classes"
        )
    return label


def read_edge_chunks(
    path: Path, sep: str, header: bool, chunk: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream (src, dst) chunks; a bad line becomes one DataError naming the file."""
    reader_args = dict(
        sep=sep,
        header=0 if header else None,
        usecols=[0, 1],
        dtype=np.int64,
        comment="#",
        chunksize=chunk,
        engine="c",
    )
    try:
        with pd.read_csv(path, **reader_args) as reader:
            for frame in reader:
                values = frame.to_numpy(dtype=np.int64, copy=False)
                yield values[:, 0].copy(), values[:, 1].copy()
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, OverflowError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise DataError(
            f"edge file '{path}' has a malformed line or a non-integer node id ({detail})", EDGE_HINT
        ) from None
    except (OSError, EOFError, zlib.error) as exc:  # unreadable, or a truncated/corrupt .gz
        raise DataError(f"cannot read edge file '{path}': {exc}", "check data.path=") from None


class EdgelistSource(Source):
    def __init__(self, cfg):
        self.cfg = cfg
        self.path = require_file(cfg.path, "edge file")
        if self.path.is_dir():
            raise DataError(
                f"data.path='{self.path}' is a folder", "point data.path= at the CSV/TSV edge file"
            )
        stem = self.path.name[: -len(".gz")] if self.path.name.endswith(".gz") else self.path.name
        self.name = Path(stem).stem if cfg.name in ("auto", "", None) else str(cfg.name)
        self.chunk_edges = int(cfg.chunk_edges)
        number, line = first_line(self.path)
        self.sep = detect_delimiter(line, str(cfg.delimiter))
        self.header = has_header(line, self.sep, self.path, number)
        # No label file: every node is unlabelled (num_classes 0); `task=link` trains on the edges alone.
        self._label = as_labels(load_npy(cfg.labels, "label file", "data.labels")) if cfg.labels else None
        self._structural = isinstance(cfg.features, str) and cfg.features.lower() == "none"  # no feature file
        self._feat = None if self._structural else self._load_features()
        self.num_nodes = self._count_nodes()
        self._degree = self._count_degrees() if self._structural else None
        if self._structural:
            self.feat_dim = STRUCTURAL_DIM
        else:
            self.feat_dim = int(self._feat.shape[1]) if self._feat is not None else int(cfg.feat_dim)
        if self.feat_dim < 1:
            raise DataError(
                f"data.feat_dim={self.feat_dim} must be positive",
                "set data.feat_dim=16 or give data.features=",
            )
        self._split = self._load_split() if cfg.split and cfg.use_source_split else None
        self.num_classes = None if self._label is not None else 0

    def _load_features(self) -> np.ndarray | None:
        if not self.cfg.features:
            return None
        feat = load_npy(self.cfg.features, "feature file", "data.features")
        if feat.ndim != 2 or feat.dtype.kind not in "fiub":
            raise DataError(
                f"features have shape {feat.shape} and dtype {feat.dtype}, expected a numeric [N, F] array",
                "save a 2-D float array with numpy.save",
            )
        if self._label is not None and len(feat) != len(self._label):
            raise DataError(
                f"the feature file has {len(feat)} rows but the label file has {len(self._label)} entries",
                "features and labels need one row per node, in the same order",
            )
        return feat

    def _count_nodes(self) -> int:
        """The per-node files fix N; data.num_nodes, when set, must agree with them. With neither a label
        nor a feature file: data.num_nodes, or one pass over the edges (largest id + 1)."""
        per_node = self._label if self._label is not None else self._feat
        what = "label file" if self._label is not None else "feature file"
        if per_node is None:
            if int(self.cfg.num_nodes) > 0:
                return int(self.cfg.num_nodes)
            top = -1
            for src, dst in self.edge_chunks():
                if len(src):
                    top = max(top, int(src.max()), int(dst.max()))
            return top + 1
        n = len(per_node)
        if int(self.cfg.num_nodes) > 0 and int(self.cfg.num_nodes) != n:
            raise DataError(
                f"data.num_nodes={self.cfg.num_nodes} but the {what} has {n} entries",
                f"drop data.num_nodes (it is taken from the {what}) or fix it",
            )
        return n

    def _count_degrees(self) -> np.ndarray:
        """Each node's degree (in + out over the file's lines), for data.features=none."""
        deg = np.zeros(self.num_nodes, dtype=np.int64)
        for src, dst in self.edge_chunks():
            if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= self.num_nodes):
                raise DataError(
                    f"an edge endpoint is outside [0, {self.num_nodes})",
                    "node ids must be 0..N-1; fix the edge file or data.num_nodes",
                )
            deg += np.bincount(src, minlength=self.num_nodes) + np.bincount(dst, minlength=self.num_nodes)
        return deg

    def _load_split(self) -> np.ndarray:
        raw = load_npy(self.cfg.split, "split file", "data.split")
        if raw.ndim != 1 or raw.dtype.kind not in "iu":
            raise DataError(
                f"the split file has shape {raw.shape} and dtype {raw.dtype}, expected integers [N]",
                "store 0 train / 1 val / 2 test / -1 none per node",
            )
        if len(raw) != self.num_nodes:
            raise DataError(
                f"the split file has {len(raw)} entries for {self.num_nodes} nodes",
                "the split needs one entry per node",
            )
        split = np.asarray(raw, dtype=np.int64)
        bad = ~np.isin(split, (-1, 0, 1, 2))
        if bad.any():
            raise DataError(
                f"the split file holds {int(split[bad][0])} (node {int(np.argmax(bad))})",
                "use 0 train / 1 val / 2 test / -1 none",
            )
        return split.astype(np.int8)

    def node_blocks(self) -> Iterator[NodeBlock]:
        for b, lo in enumerate(range(0, self.num_nodes, BLOCK_ROWS)):
            hi = min(lo + BLOCK_ROWS, self.num_nodes)
            if self._structural:
                feat = structural_features(self._degree[lo:hi])
            elif self._feat is not None:
                feat = np.asarray(self._feat[lo:hi], dtype=np.float32)
            else:
                # No feature file: seeded Gaussian features, one generator per block so they stream.
                feat = np.random.default_rng([int(self.cfg.feat_seed), b]).standard_normal(
                    (hi - lo, self.feat_dim), dtype=np.float32
                )
            split = None if self._split is None else self._split[lo:hi]
            label = self._label[lo:hi] if self._label is not None else np.full(hi - lo, -1, dtype=np.int64)
            yield NodeBlock(lo, feat, label, split)

    def _describe_features(self) -> str:
        if self._structural:
            return "structural: [1, log1p(degree)]"
        return str(self.cfg.features) if self.cfg.features else f"random (feat_seed={self.cfg.feat_seed})"

    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return read_edge_chunks(self.path, self.sep, self.header, self.chunk_edges)

    def describe(self) -> dict:
        return {
            "path": str(self.path),
            "header": self.header,
            "features": self._describe_features(),
            "labels": str(self.cfg.labels) if self.cfg.labels else "none",
            "split": str(self.cfg.split) if self._split is not None else "random",
        }
