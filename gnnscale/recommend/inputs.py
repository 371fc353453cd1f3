"""What recommend reads: the embeddings (mmap'd, validated against the graph), query node ids, options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import ListConfig

from gnnscale.errors import ConfigError, DataError

METRICS = ("ip", "cosine")
INDEXES = ("auto", "exact", "ivf", "hnsw")
FORMATS = ("npy", "csv")


def check_options(opts) -> None:
    """Option values the schema's types cannot check (ranges and choices), before anything is read."""
    for key, value, allowed in (
        ("metric", opts.metric, METRICS),
        ("index", opts.index, INDEXES),
        ("format", opts.format, FORMATS),
    ):
        if value not in allowed:
            raise ConfigError(
                f"recommend.{key}={value} is not one of {', '.join(allowed)}",
                f"choose recommend.{key}={'|'.join(allowed)}",
            )
    for key in ("chunk_size", "hnsw_m", "ef_construction"):
        if int(opts[key]) < 1:
            raise ConfigError(f"recommend.{key}={opts[key]} must be at least 1", f"set recommend.{key}>=1")
    for key in ("nlist", "nprobe", "ef_search", "recall_sample", "exact_below"):
        if int(opts[key]) < 0:
            raise ConfigError(
                f"recommend.{key}={opts[key]} is negative", f"set recommend.{key}>=0 (0 = automatic)"
            )
    if not 0.0 < float(opts.target_recall) <= 1.0:
        raise ConfigError(f"recommend.target_recall={opts.target_recall} is outside (0, 1]", "use e.g. 0.95")
    for key in ("candidates", "fof_candidates"):
        if int(opts[key]) < 0:
            raise ConfigError(f"recommend.{key}={opts[key]} is negative", f"set recommend.{key}>=0")


def check_k(k: int, num_nodes: int) -> None:
    if not 1 <= int(k) < num_nodes:
        raise ConfigError(
            f"recommend.k={k} must be between 1 and num_nodes - 1 = {num_nodes - 1}",
            "a node cannot be recommended itself; choose a smaller recommend.k",
        )


def open_embeddings(path: Path, info: dict | None, num_nodes: int) -> np.ndarray:
    """The [num_nodes, dim] float embeddings as a read-only memory map (nothing is loaded yet)."""
    try:
        emb = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot read embeddings {path}: {str(exc).splitlines()[0]}",
            "pass emb= the embeddings.npy of a finished `gnnscale infer` run",
        ) from None
    if emb.ndim != 2 or emb.dtype.kind != "f" or emb.shape[1] < 1:
        raise DataError(
            f"embeddings {path} are {emb.dtype} {list(emb.shape)}, not a 2-D float matrix",
            "pass emb= the embeddings.npy of a `gnnscale infer` run",
        )
    if emb.shape[0] != num_nodes:
        subset = " (a --sampled run embeds only some nodes)" if (info or {}).get("mode") == "sampled" else ""
        raise DataError(
            f"embeddings {path} have {emb.shape[0]:,} rows but the graph has {num_nodes:,} nodes{subset}",
            "pass graph_dir= the graph they were computed on, or embeddings of every node "
            "(`gnnscale infer --layerwise`)",
        )
    return emb


def graph_dir_of(spec: str | None, info: dict | None, emb_path: Path) -> str:
    if spec:
        return str(spec)
    if info and info.get("graph_dir"):
        return str(info["graph_dir"])
    raise ConfigError(
        f"embeddings {emb_path} come without an emb_info.json naming their graph",
        "pass graph_dir= the graph the embeddings were computed on",
    )


def query_nodes(spec, num_nodes: int) -> np.ndarray | None:
    """recommend.nodes: None (every node), a list of ids, or a .npy / .txt file of ids (or a bool mask)."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "all")):
        return None
    if isinstance(spec, (list, tuple, ListConfig)):
        ids, where = np.asarray(list(spec)), "recommend.nodes"
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        ids, where = np.asarray([spec]), "recommend.nodes"
    else:
        ids, where = _read_ids(Path(str(spec))), f"recommend.nodes file {spec}"
    if ids.dtype == bool and ids.ndim == 1 and len(ids) == num_nodes:
        ids = np.flatnonzero(ids)
    if ids.ndim != 1 or len(ids) == 0 or ids.dtype.kind not in "iu":
        raise DataError(
            f"{where} is {ids.dtype} {list(ids.shape)}, not a non-empty 1-D list of integer node ids",
            "pass a list (recommend.nodes=[0,5]) or a .npy / .txt file of integer ids",
        )
    ids = ids.astype(np.int64)
    bad = ids[(ids < 0) | (ids >= num_nodes)]
    if len(bad):
        raise DataError(
            f"{where} holds {len(bad):,} node id(s) outside [0, {num_nodes}), e.g. {int(bad[0])}",
            f"use ids between 0 and {num_nodes - 1} (the graph's num_nodes is {num_nodes:,})",
        )
    return ids


def _read_ids(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(
            f"recommend.nodes file {path} does not exist", "pass a .npy or .txt file of node ids, or a list"
        )
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=1, delimiter=None if path.suffix != ".csv" else ",")
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot read node ids from {path}: {str(exc).splitlines()[0]}",
            "write one integer id per line (.txt) or save a 1-D integer array (.npy)",
        ) from None
