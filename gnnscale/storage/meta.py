"""meta.json: the index of a graph_dir (DESIGN §4). Written last, so its presence means complete."""

from __future__ import annotations

import json
from pathlib import Path

from gnnscale.errors import GraphDirError
from gnnscale.storage.node_order import order_files
from gnnscale.utils.atomic import write_json

META_FILE = "meta.json"
FORMAT_VERSION = 1
REQUIRED_KEYS = (
    "format_version",
    "name",
    "num_nodes",
    "num_edges",
    "feat_dim",
    "feat_dtype",
    "num_classes",
    "directed",
    "splits",
    "shards",
)


def shard_file_name(index: int) -> str:
    return f"part_{index:05d}.pt"


def read_meta(graph_dir: str | Path) -> dict:
    graph_dir = Path(graph_dir)
    path = graph_dir / META_FILE
    if not graph_dir.is_dir():
        raise GraphDirError(
            f"graph_dir '{graph_dir}' does not exist",
            "run `gnnscale shard graph_dir=...` first or fix graph_dir=",
        )
    if not path.is_file():
        raise GraphDirError(
            f"'{graph_dir}' has no {META_FILE} (not a graph_dir, or an interrupted shard run)",
            "run `gnnscale shard` again with overwrite=true",
        )
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GraphDirError(
            f"cannot read {path}: {exc}", "re-run `gnnscale shard` with overwrite=true"
        ) from None
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise GraphDirError(
            f"{path} lacks {', '.join(missing)}", "re-run `gnnscale shard` with overwrite=true"
        )
    if meta["format_version"] != FORMAT_VERSION:
        raise GraphDirError(
            f"{path} has format_version {meta['format_version']}, this gnnscale reads {FORMAT_VERSION}",
            "re-shard the graph with this version",
        )
    return meta


def write_meta(graph_dir: str | Path, meta: dict) -> None:
    write_json(Path(graph_dir) / META_FILE, meta)


CSC_FILES = ("indptr.npy", "indices.npy")


def recorded_files(
    meta: dict, parts: tuple[str, ...] = ("shards", "csc")
) -> list[tuple[str, str | None, str]]:
    """(path inside graph_dir, its recorded sha256 or None, the command that writes it) of every data file
    meta.json describes: the shards (`shard`) and, once built, the CSC (`build-csr`; a CSC built before
    its checksums were recorded has None)."""
    files = []
    if "shards" in parts:
        files += [(s["file"], s["sha256"], "shard") for s in meta["shards"]]
        files += [(rel, sha, "shard") for rel, sha in order_files(meta)]  # the map to the user's IDs
    csc = meta.get("csc")
    if "csc" in parts and csc:
        sums = csc.get("sha256") or {}
        files += [(f"{csc.get('dir', 'csc')}/{name}", sums.get(name), "build-csr") for name in CSC_FILES]
    return files


def record_edge_split(graph_dir: str | Path, name: str, info: dict) -> dict:
    """Add (or replace) one edge split's entry under meta.json's `edge_splits` (storage/edge_split.py)."""
    meta = read_meta(graph_dir)
    meta.setdefault("edge_splits", {})[name] = info
    write_meta(graph_dir, meta)
    return meta
