"""A graph file written by `dgl.save_graphs`: node data `data.feat_key` / `data.label_key` and,
when present, `train_mask` / `val_mask` / `test_mask`. Homogeneous graphs only.

DGL's binary format holds tensors, not pickles, so loading it runs no code from the file.
"""

from __future__ import annotations

import os
import re
from typing import Iterator

import numpy as np

from gnnscale.datasets.base import (
    NodeBlock,
    Source,
    blocks_from_arrays,
    chunks_from_arrays,
    require_file,
    split_from_masks,
)
from gnnscale.errors import DataError

MASK_KEYS = ("train_mask", "val_mask", "test_mask")


def _dgl_message(exc: Exception) -> str:
    """DGL's C++ errors carry a timestamp, a source location and a stack trace; keep the reason."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = re.sub(r"^\[[\d:]+\]\s*\S+:\d+:\s*", "", text)
    return re.sub(r"^Check failed:.*?:\s*", "", text).strip()


def load_graph(path, index: int):
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl

    if index < 0:
        raise DataError(
            f"data.graph_index={index} must be >= 0", "use data.graph_index=0 for the first graph"
        )
    try:
        graphs, _ = dgl.load_graphs(str(path), [index])
    except Exception as exc:  # DGLError for a bad file or an index past the end
        reason = _dgl_message(exc)
        if "out of bound" in reason:
            raise DataError(
                f"data.graph_index={index} is out of range for '{path}'",
                "pick an index of a graph the file holds (0 = first)",
            ) from None
        raise DataError(
            f"cannot read '{path}' as a dgl.save_graphs file: {reason}",
            "check data.path= points at a file written by dgl.save_graphs",
        ) from None
    return graphs[0]


def _tensor(g, key: str, what: str, cfg_key: str) -> np.ndarray:
    if key not in g.ndata:
        have = ", ".join(sorted(g.ndata.keys())) or "none"
        raise DataError(
            f"the DGL graph has no node data '{key}' ({what}); it has: {have}",
            f"set {cfg_key}= to one of them",
        )
    return g.ndata[key].detach().cpu().numpy()


def labels_of(raw: np.ndarray, n: int, key: str) -> np.ndarray:
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.ndim != 1:
        raise DataError(
            f"node data '{key}' has shape {raw.shape}, expected [N] class ids",
            "store one integer class per node (multi-label is not supported)",
        )
    if raw.dtype.kind == "f":
        nan = np.isnan(raw)
        if (raw[~nan] != np.round(raw[~nan])).any():
            raise DataError(
                f"node data '{key}' holds non-integer labels",
                "store integer class ids (-1 or NaN = unlabelled)",
            )
        raw = np.where(nan, -1, raw)
    elif raw.dtype.kind not in "iub":
        raise DataError(
            f"node data '{key}' has dtype {raw.dtype}, expected integers", "store integer class ids"
        )
    label = raw.astype(np.int64)
    if len(label) != n:
        raise DataError(
            f"node data '{key}' has {len(label)} entries for {n} nodes", "labels need one entry per node"
        )
    return label


class DglSource(Source):
    def __init__(self, cfg):
        self.cfg = cfg
        self.path = require_file(cfg.path, "DGL graph file")
        self.name = self.path.stem if cfg.name in ("auto", "", None) else str(cfg.name)
        self.chunk_edges = int(cfg.chunk_edges)
        g = load_graph(self.path, int(cfg.graph_index))
        if len(g.ntypes) != 1 or len(g.canonical_etypes) != 1:
            raise DataError(
                f"the DGL graph is heterogeneous ({len(g.ntypes)} node types, {len(g.canonical_etypes)} edge types)",
                "convert it with dgl.to_homogeneous(g, ndata=[...]) and save that",
            )
        n = int(g.num_nodes())
        feat = _tensor(g, cfg.feat_key, "features", "data.feat_key")
        if feat.ndim != 2 or feat.dtype.kind not in "fiub" or len(feat) != n:
            raise DataError(
                f"node data '{cfg.feat_key}' has shape {feat.shape} ({feat.dtype}) for {n} nodes",
                "features must be a numeric [N, F] tensor",
            )
        self._feat = feat
        self._label = labels_of(_tensor(g, cfg.label_key, "labels", "data.label_key"), n, cfg.label_key)
        self._split = self._masks(g, n) if cfg.use_source_split else None
        src, dst = g.edges()
        self._src, self._dst = src.numpy().astype(np.int64), dst.numpy().astype(np.int64)
        self.num_nodes, self.feat_dim, self.num_classes = n, int(feat.shape[1]), None

    @staticmethod
    def _masks(g, n: int) -> np.ndarray | None:
        present = [k for k in MASK_KEYS if k in g.ndata]
        if not present:
            return None  # none shipped: the writer makes the seeded random split
        # A graph may ship only some masks (e.g. no val): the missing ones are empty.
        masks = [
            g.ndata[k].numpy().astype(bool).reshape(-1) if k in present else np.zeros(n, dtype=bool)
            for k in MASK_KEYS
        ]
        return split_from_masks(n, *masks)

    def node_blocks(self) -> Iterator[NodeBlock]:
        return blocks_from_arrays(self._feat, self._label, self._split)

    def edge_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return chunks_from_arrays(self._src, self._dst, self.chunk_edges)

    def describe(self) -> dict:
        return {
            "path": str(self.path),
            "graph_index": int(self.cfg.graph_index),
            "feat_key": self.cfg.feat_key,
            "label_key": self.cfg.label_key,
        }
