"""Planetoid raw files (`ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}`) with the public split.

Reproduces the reference loaders (Kipf's `gcn/utils.py`, PyG's `read_planetoid_data`):
`allx`/`ally` hold nodes 0..len(allx)-1, row i of `tx`/`ty` belongs to node `test.index[i]`
(test ids are not contiguous and not sorted), and CiteSeer's isolated nodes that appear in
neither get zero features and no label. Public split: train = first len(y) nodes, val = the
next 500, test = the test.index nodes.

The files are Python 2 pickles; unpickling can run code, so they are read with an unpickler
that admits only the numpy / scipy.sparse / builtin classes these files contain.
"""

from __future__ import annotations

import importlib
import pickle
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import scipy.sparse as sp

from gnnscale.datasets.base import NodeBlock, Source, blocks_from_arrays, chunks_from_arrays, require_file
from gnnscale.errors import DataError

PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph")
NUM_VAL = 500  # the public split's validation set: the 500 nodes after the training nodes


def _numpy_core(name: str):
    """numpy.core moved to numpy._core in numpy 2; the pickles name the old path."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError(name)


def _allowed() -> dict[tuple[str, str], object]:
    """(module, name) pairs a Planetoid pickle may reference, mapped to the object to use."""
    import builtins
    import codecs
    import collections

    allowed: dict[tuple[str, str], object] = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = _numpy_core("_reconstruct")
        allowed[(module, "scalar")] = _numpy_core("scalar")
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    # Old scipy pickles name the private modules (scipy.sparse.csr, ._csr, ...); map them to the
    # public classes so no deprecated module is imported.
    for fmt in ("csr", "csc", "coo", "lil"):
        cls = getattr(sp, f"{fmt}_matrix")
        for module in ("scipy.sparse", f"scipy.sparse.{fmt}", f"scipy.sparse._{fmt}"):
            allowed[(module, f"{fmt}_matrix")] = cls
    for module in ("builtins", "__builtin__"):
        for name in (
            "list",
            "dict",
            "set",
            "frozenset",
            "tuple",
            "int",
            "float",
            "bool",
            "complex",
            "bytes",
            "str",
        ):
            allowed[(module, name)] = getattr(builtins, name)
    allowed[("collections", "defaultdict")] = collections.defaultdict
    # Files re-pickled by Python 3 at protocol 2 rebuild bytes with _codecs.encode(str, "latin1"):
    # a pure text -> bytes conversion, it runs nothing.
    allowed[("_codecs", "encode")] = codecs.encode
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the classes Planetoid files need; any other global is refused, never imported."""

    _ALLOWED: dict | None = None

    def find_class(self, module: str, name: str):
        if RestrictedUnpickler._ALLOWED is None:
            RestrictedUnpickler._ALLOWED = _allowed()
        obj = RestrictedUnpickler._ALLOWED.get((module, name))
        if obj is None:
            raise DataError(
                f"pickle references '{module}.{name}', which a Planetoid file never needs",
                "the file is not a genuine Planetoid file (or was tampered with); refusing to load it",
            )
        return obj


def restricted_load(path: Path):
    try:
        with open(path, "rb") as fh:
            return RestrictedUnpickler(fh, encoding="latin1").load()
    except DataError as exc:
        raise DataError(f"{path.name}: {exc.message}", exc.hint) from None
    except Exception as exc:  # truncated / not a pickle / wrong protocol
        raise DataError(
            f"cannot read Planetoid file '{path}': {type(exc).__name__}: {exc}", "re-download the ind.* files"
        ) from None


def detect_name(folder: Path) -> str:
    names = sorted({m.group(1) for p in folder.iterdir() if (m := re.fullmatch(r"ind\.(.+)\.graph", p.name))})
    if not names:
        raise DataError(
            f"no ind.<name>.graph file in '{folder}'",
            "point data.path= at the folder holding the Planetoid ind.* files",
        )
    if len(names) > 1:
        raise DataError(
            f"'{folder}' holds several Planetoid datasets ({', '.join(names)})",
            f"set data.name= to one of {', '.join(names)}",
        )
    return names[0]


def _dense(a, what: str) -> np.ndarray:
    a = a.toarray() if sp.issparse(a) else np.asarray(a)
    if a.ndim != 2:
        raise DataError(
            f"Planetoid '{what}' has shape {a.shape}, expected a matrix", "re-download the ind.* files"
        )
    return a


def labels_from_onehot(y: np.ndarray) -> np.ndarray:
    """argmax per row; an all-zero row is an unlabelled node (-1)."""
    label = y.argmax(axis=1).astype(np.int64)
    label[~y.any(axis=1)] = -1
    return label


def read_test_index(path: Path) -> np.ndarray:
    try:
        idx = np.loadtxt(path, dtype=np.int64, ndmin=1)
    except ValueError as exc:
        raise DataError(
            f"'{path}' must hold one integer node id per line ({exc})", "re-download the ind.* files"
        ) from None
    if len(idx) and idx.min() < 0:
        raise DataError(f"'{path}' holds a negative node id", "re-download the ind.* files")
    if len(np.unique(idx)) != len(idx):
        raise DataError(f"'{path}' lists a node more than once", "re-download the ind.* files")
    return idx


def edges_from_dict(graph) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(graph, dict):
        raise DataError(
            f"the Planetoid graph file holds a {type(graph).__name__}, expected a dict of adjacency lists",
            "re-download the ind.* files",
        )
    try:
        src = np.concatenate(
            [np.full(len(nbrs), int(node), dtype=np.int64) for node, nbrs in graph.items()]
            or [np.empty(0, np.int64)]
        )
        dst = np.concatenate(
            [np.asarray(list(nbrs), dtype=np.int64) for nbrs in graph.values()] or [np.empty(0, np.int64)]
        )
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"the Planetoid graph holds a non-integer node id ({exc})", "re-download the ind.* files"
        ) from None
    return src, dst


class PlanetoidSource(Source):
    def __init__(self, cfg):
        self.cfg = cfg
        self.folder = require_file(cfg.path, "Planetoid folder")
        if not self.folder.is_dir():
            raise DataError(
                f"data.path='{self.folder}' is not a folder",
                "point data.path= at the folder holding the ind.<name>.* files",
            )
        self.name = detect_name(self.folder) if cfg.name in ("auto", "", None) else str(cfg.name)
        raw = {
            part: restricted_load(
                require_file(
                    self.folder / f"ind.{self.name}.{part}", f"Planetoid file ind.{self.name}.{part}"
                )
            )
            for part in PARTS
        }
        test_index = read_test_index(
            require_file(
                self.folder / f"ind.{self.name}.test.index", f"Planetoid file ind.{self.name}.test.index"
            )
        )
        self._assemble(raw, test_index)
        self.chunk_edges = int(cfg.chunk_edges)

    def _assemble(self, raw: dict, test_index: np.ndarray) -> None:
        x, tx, allx = (_dense(raw[k], k) for k in ("x", "tx", "allx"))
        y, ty, ally = (_dense(raw[k], k) for k in ("y", "ty", "ally"))
        if len(allx) != len(ally) or len(tx) != len(ty) or len(x) != len(y):
            raise DataError(
                f"Planetoid '{self.name}': feature and label row counts differ (x/y, tx/ty or allx/ally)",
                "re-download the ind.* files",
            )
        if len(tx) != len(test_index):
            raise DataError(
                f"ind.{self.name}.tx has {len(tx)} rows but test.index lists {len(test_index)} nodes",
                "re-download the ind.* files",
            )
        if len(test_index) and test_index.min() < len(allx):
            raise DataError(
                f"test.index names node {int(test_index.min())}, inside allx's {len(allx)} nodes",
                "re-download the ind.* files",
            )
        if len(y) + NUM_VAL > len(allx):
            raise DataError(
                f"allx has {len(allx)} rows, fewer than {len(y)} train + {NUM_VAL} val nodes",
                "re-download the ind.* files",
            )
        feat_dim = allx.shape[1]
        if tx.shape[1] != feat_dim or ty.shape[1] != ally.shape[1]:
            raise DataError(
                f"Planetoid '{self.name}': tx/ty widths differ from allx/ally", "re-download the ind.* files"
            )
        # Nodes in neither allx nor test.index (CiteSeer's isolated nodes) stay zero / unlabelled.
        n = max(len(allx), int(test_index.max()) + 1 if len(test_index) else 0)
        feat = np.zeros((n, feat_dim), dtype=np.float32)
        onehot = np.zeros((n, ally.shape[1]), dtype=ally.dtype)
        feat[: len(allx)], onehot[: len(allx)] = allx, ally
        feat[test_index], onehot[test_index] = tx, ty
        split = np.full(n, -1, dtype=np.int8)
        split[: len(y)] = 0
        split[len(y) : len(y) + NUM_VAL] = 1
        split[test_index] = 2
        self._feat, self._label, self._split = feat, labels_from_onehot(onehot), split
        self._src, self._dst = edges_from_dict(raw["graph"])
        self.num_nodes, self.feat_dim, self.num_classes = n, feat_dim, int(ally.shape[1])

    def node_blocks(self) -> Iterator[NodeBlock]:
        split = self._split if self.cfg.use_source_split else None
        return blocks_from_arrays(self._feat, self._label, split)

    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return chunks_from_arrays(self._src, self._dst, self.chunk_edges)

    def describe(self) -> dict:
        return {
            "path": str(self.folder),
            "name": self.name,
            "split": "public" if self.cfg.use_source_split else "random",
        }
