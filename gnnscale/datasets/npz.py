""".npz graphs in two published layouts.

- gnn-benchmark (Shchur et al.): CSR adjacency `adj_data/adj_indices/adj_indptr/adj_shape`, CSR
  features `attr_data/attr_indices/attr_indptr/attr_shape` (or dense `attr_matrix`), `labels`.
  No split is shipped, so the writer makes the seeded random split.
- heterophilous (Platonov et al.): `node_features` [N, F], `node_labels` [N], `edges` [E, 2],
  `train_masks`/`val_masks`/`test_masks` [num_splits, N]; `data.split_index` picks one split.

Loaded with allow_pickle=False: an .npz member holding Python objects is refused, never run.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import scipy.sparse as sp

from gnnscale.datasets.base import (
    NodeBlock,
    Source,
    blocks_from_arrays,
    chunks_from_arrays,
    require_file,
    split_from_masks,
)
from gnnscale.errors import DataError

CSR_ADJ = ("adj_data", "adj_indices", "adj_indptr", "adj_shape")
CSR_ATTR = ("attr_data", "attr_indices", "attr_indptr", "attr_shape")
HETERO = ("node_features", "node_labels", "edges")
MASKS = ("train_masks", "val_masks", "test_masks")
BLOCK_ROWS = 65536


def resolve_npz(path) -> Path:
    p = require_file(path, ".npz file")
    if p.is_dir():
        found = sorted(p.glob("*.npz"))
        if len(found) != 1:
            listed = ", ".join(f.name for f in found) or "none"
            raise DataError(
                f"folder '{p}' holds {len(found)} .npz files ({listed})",
                "set data.path= to the .npz file itself",
            )
        p = found[0]
    return p


def open_npz(path: Path):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(
            f"cannot read '{path}' as .npz: {exc}", "check data.path= points at an .npz file written by numpy"
        ) from None


class _Arrays:
    """Member access that turns numpy's errors (pickled objects, corrupt members) into DataError."""

    def __init__(self, npz, path: Path):
        self.npz, self.path = npz, path
        self.files = set(npz.files)

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.npz[key]
        except ValueError as exc:  # object arrays need allow_pickle, which we never grant
            raise DataError(
                f"'{self.path.name}' member '{key}' is unreadable: {exc}",
                "re-save it with plain numeric arrays",
            ) from None
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(
                f"'{self.path.name}' member '{key}' is corrupt: {exc}", "re-download the file"
            ) from None


def integer_array(a: np.ndarray, what: str) -> np.ndarray:
    if a.dtype.kind not in "iu":
        raise DataError(
            f"{what} has dtype {a.dtype}, expected integers", "store node ids / labels as integers"
        )
    return a.astype(np.int64, copy=False)


def check_labels(label: np.ndarray, n: int, what: str) -> np.ndarray:
    if label.ndim == 2 and label.shape[1] == 1:  # a column vector is still one label per node
        label = label[:, 0]
    label = integer_array(label, what)
    if label.ndim != 1 or len(label) != n:
        raise DataError(
            f"{what} has shape {label.shape}, expected ({n},) (one label per node)",
            "store one integer class per node",
        )
    if len(label) and label.min() < -1:
        raise DataError(
            f"{what} holds label {int(label.min())}", "use -1 for unlabelled nodes and 0..C-1 for classes"
        )
    return label


class NpzSource(Source):
    def __init__(self, cfg):
        self.cfg = cfg
        self.path = resolve_npz(cfg.path)
        self.name = self.path.stem if cfg.name in ("auto", "", None) else str(cfg.name)
        self.chunk_edges = int(cfg.chunk_edges)
        z = _Arrays(open_npz(self.path), self.path)
        if set(CSR_ADJ) <= z.files:
            self.layout = "gnn-benchmark"
            self._load_benchmark(z)
        elif set(HETERO) <= z.files:
            self.layout = "heterophilous"
            self._load_hetero(z)
        else:
            raise DataError(
                f"'{self.path.name}' has an unknown .npz layout (members: {', '.join(sorted(z.files)) or 'none'})",
                "expected gnn-benchmark (adj_data, adj_indices, adj_indptr, adj_shape, attr_*, labels) "
                "or heterophilous (node_features, node_labels, edges, *_masks) members",
            )

    # ------------------------------------------------------------------ gnn-benchmark
    def _load_benchmark(self, z: _Arrays) -> None:
        shape = integer_array(z["adj_shape"], "adj_shape")
        if shape.shape != (2,) or shape[0] != shape[1]:
            raise DataError(
                f"adj_shape is {shape.tolist()}, expected a square [N, N]",
                "the adjacency must be node x node",
            )
        n = int(shape[0])
        self._adj = self._csr(z, "adj", n, n)
        if "attr_matrix" in z.files:
            attr = z["attr_matrix"]
            if attr.ndim != 2 or len(attr) != n:
                raise DataError(
                    f"attr_matrix has shape {attr.shape}, expected ({n}, F)", "features need one row per node"
                )
            self._attr, self.feat_dim = attr, int(attr.shape[1])
        elif set(CSR_ATTR) <= z.files:
            ashape = integer_array(z["attr_shape"], "attr_shape")
            if ashape.shape != (2,) or ashape[0] != n:
                raise DataError(
                    f"attr_shape is {ashape.tolist()} for {n} nodes", "features need one row per node"
                )
            self._attr, self.feat_dim = self._csr(z, "attr", n, int(ashape[1])), int(ashape[1])
        else:
            raise DataError(
                f"'{self.path.name}' has no node features",
                "add attr_data/attr_indices/attr_indptr/attr_shape or attr_matrix",
            )
        if "labels" not in z.files:
            raise DataError(
                f"'{self.path.name}' has no 'labels' member", "add one integer label per node as 'labels'"
            )
        self._label = check_labels(z["labels"], n, "labels")
        self._split = None  # none shipped: the writer makes the seeded random split
        self.num_nodes, self.num_classes = n, None

    def _csr(
        self, z: _Arrays, prefix: str, rows: int, cols: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data, indices = z[f"{prefix}_data"], integer_array(z[f"{prefix}_indices"], f"{prefix}_indices")
        indptr = integer_array(z[f"{prefix}_indptr"], f"{prefix}_indptr")
        ok = (
            len(indptr) == rows + 1
            and indptr[0] == 0
            and indptr[-1] == len(indices) == len(data)
            and np.all(np.diff(indptr) >= 0)
        )
        if not ok:
            raise DataError(
                f"'{self.path.name}': {prefix}_indptr/_indices/_data do not form a CSR matrix with {rows} rows",
                "re-save the matrix with scipy.sparse.save_npz-style CSR arrays",
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= cols):
            raise DataError(
                f"'{self.path.name}': {prefix}_indices holds a column outside [0, {cols})",
                f"check {prefix}_shape",
            )
        return data, indices, indptr

    def _feature_block(self, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) densified on their own, so a large sparse feature matrix never goes dense whole."""
        if not isinstance(self._attr, tuple):
            return np.asarray(self._attr[lo:hi], dtype=np.float32)
        data, indices, indptr = self._attr
        a, b = int(indptr[lo]), int(indptr[hi])
        rows = sp.csr_matrix(
            (data[a:b], indices[a:b], indptr[lo : hi + 1] - a), shape=(hi - lo, self.feat_dim)
        )
        return rows.toarray().astype(np.float32, copy=False)

    # ------------------------------------------------------------------ heterophilous
    def _load_hetero(self, z: _Arrays) -> None:
        feat = z["node_features"]
        if feat.ndim != 2:
            raise DataError(
                f"node_features has shape {feat.shape}, expected [N, F]", "store one feature row per node"
            )
        n = len(feat)
        edges = integer_array(z["edges"], "edges")
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise DataError(
                f"edges has shape {edges.shape}, expected [E, 2]", "store one (src, dst) row per edge"
            )
        self._attr, self.feat_dim = feat, int(feat.shape[1])
        self._label = check_labels(z["node_labels"], n, "node_labels")
        self._edges = edges
        self._split = self._hetero_split(z, n) if self.cfg.use_source_split else None
        self.num_nodes, self.num_classes = n, None

    def _hetero_split(self, z: _Arrays, n: int) -> np.ndarray | None:
        present = [k for k in MASKS if k in z.files]
        if not present:
            return None  # no split shipped: the writer makes the seeded random split
        if len(present) != len(MASKS):
            missing = ", ".join(k for k in MASKS if k not in z.files)
            raise DataError(
                f"'{self.path.name}' ships {', '.join(present)} but not {missing}",
                "ship all three masks, or set data.use_source_split=false",
            )
        masks = [z[k] for k in MASKS]
        masks = [m[None, :] if m.ndim == 1 else m for m in masks]  # a single split may be stored 1-D
        if any(m.ndim != 2 or m.shape[1] != n for m in masks) or len({len(m) for m in masks}) != 1:
            shapes = ", ".join(str(m.shape) for m in masks)
            raise DataError(
                f"split masks have shapes {shapes}, expected [num_splits, {n}] each",
                "store one boolean row per split",
            )
        num_splits, k = len(masks[0]), int(self.cfg.split_index)
        if not 0 <= k < num_splits:
            raise DataError(
                f"data.split_index={k} is out of range: '{self.path.name}' ships {num_splits} splits",
                f"use data.split_index=0..{num_splits - 1}",
            )
        return split_from_masks(n, *(m[k] for m in masks))

    # ------------------------------------------------------------------ streaming
    def node_blocks(self) -> Iterator[NodeBlock]:
        if self.layout == "heterophilous":
            yield from blocks_from_arrays(self._attr, self._label, self._split, BLOCK_ROWS)
            return
        for lo in range(0, self.num_nodes, BLOCK_ROWS):
            hi = min(lo + BLOCK_ROWS, self.num_nodes)
            yield NodeBlock(lo, self._feature_block(lo, hi), self._label[lo:hi], None)

    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self.layout == "heterophilous":
            yield from chunks_from_arrays(self._edges[:, 0], self._edges[:, 1], self.chunk_edges)
            return
        data, indices, indptr = self._adj
        # Expand CSR row pointers a chunk of entries at a time: row of entry e = searchsorted(indptr, e).
        for a in range(0, len(indices), self.chunk_edges):
            b = min(a + self.chunk_edges, len(indices))
            rows = np.searchsorted(indptr, np.arange(a, b), side="right") - 1
            keep = data[a:b] != 0  # an explicitly stored zero weight is not an edge
            yield rows[keep].astype(np.int64), indices[a:b][keep].astype(np.int64)

    def describe(self) -> dict:
        out = {"path": str(self.path), "layout": self.layout}
        if self.layout == "heterophilous" and self.cfg.use_source_split:
            out["split_index"] = int(self.cfg.split_index)
        return out
