"""Integrity where data is read: the shards and CSC a stage reads are the ones meta.json describes.

verify=stamp (default): a file whose stamp in graph_dir/.verified.json still matches (size, mtime_ns,
ctime_ns, inode, and the sha256 it was verified against = the one meta.json records) is taken as
verified; any other file is re-hashed, and its stamp renewed when the hash is right. A byte changed in
place moves mtime / ctime, a file replaced gets another inode: either means a re-hash. A stamp taken
within RACY_NS of the file's last change is not trusted (a write in the same clock tick keeps mtime).
verify=full re-hashes every file; verify=off checks nothing. A read-only graph_dir is verified without
recording stamps (so every run re-hashes what it reads), said once.
The CSC's .npy files are also checked against the dtypes meta.json records (an int64 indptr; indices of
csc.index_dtype), read from their headers every time: a checksum covers the bytes, not what meta.json says.
Checkpoints: checkpoints/sha256.json (models/checkpoint.py) works the same way for last.pt / best.pt.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gnnscale.errors import ConfigError, GraphDirError
from gnnscale.storage.csc import npy_dtype, recorded_index_dtype
from gnnscale.storage.lock import check_not_written
from gnnscale.storage.meta import read_meta, recorded_files
from gnnscale.storage.run_dir import read_json
from gnnscale.utils.atomic import sha256_file, write_json
from gnnscale.utils.ui import info

STAMP_FILE = ".verified.json"
MODES = ("stamp", "full", "off")
STATUS_OK = ("ok (stamp)", "ok (hashed)", "not recorded")
DTYPE_MISMATCH = "dtype MISMATCH"
# A stamp taken less than this after the file's last change is not trusted ("racy", as git calls it): a
# later write within the same timestamp tick (coarse clocks; 1-2 s on some filesystems) would keep mtime.
RACY_NS = 2_000_000_000


@dataclass
class FileCheck:
    file: str  # path inside graph_dir
    writer: str  # the command that writes it: shard | build-csr
    size: int | None
    recorded: str | None  # meta.json's sha256
    status: str  # ok (stamp) | ok (hashed) | not recorded | MISMATCH | dtype MISMATCH | missing
    seconds: float
    actual: str | None = None  # the file's sha256 when hashed
    dtype: str | None = None  # a CSC array's dtype, from its .npy header
    recorded_dtype: str | None = None  # the dtype meta.json says it holds

    @property
    def ok(self) -> bool:
        return self.status in STATUS_OK


def check_mode(mode: str, key: str = "verify") -> str:
    if mode not in MODES:
        raise ConfigError(f"{key}={mode} is not a verify mode", f"use one of {'|'.join(MODES)}")
    return mode


def _recorded_dtypes(meta: dict) -> dict:
    """path inside graph_dir -> the dtype meta.json says that CSC array holds."""
    csc = meta.get("csc")
    if not csc:
        return {}
    folder = csc.get("dir", "csc")
    return {f"{folder}/indptr.npy": "int64", f"{folder}/indices.npy": recorded_index_dtype(meta).name}


def _check_dtype(check: FileCheck, path: Path, recorded: str | None) -> FileCheck:
    """The file's dtype beside meta.json's; a file that passed its checksum fails on a different one."""
    if recorded is None or check.status not in STATUS_OK:
        return check
    try:
        check.dtype = npy_dtype(path).name
    except (OSError, ValueError):
        check.dtype = "unreadable"
    check.recorded_dtype = recorded
    if check.dtype != recorded:
        check.status = DTYPE_MISMATCH
    return check


def _signature(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def _stamp(signature: dict, sha256: str) -> dict:
    return {**signature, "sha256": sha256, "at_ns": time.time_ns()}


def _stamp_holds(stamp: dict | None, signature: dict, sha256: str) -> bool:
    if not stamp or stamp.get("sha256") != sha256 or any(stamp.get(k) != v for k, v in signature.items()):
        return False
    return max(signature["mtime_ns"], signature["ctime_ns"]) < int(stamp.get("at_ns", 0)) - RACY_NS


def _read_stamps(graph_dir: Path) -> dict:
    stamps = read_json(graph_dir / STAMP_FILE)
    return stamps.get("files", {}) if isinstance(stamps, dict) else {}


def _write_stamps(graph_dir: Path, stamps: dict) -> bool:
    """False when graph_dir cannot be written (read-only): the check still happened, only not recorded."""
    try:
        write_json(graph_dir / STAMP_FILE, {"format": 1, "files": stamps})
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return False
        raise
    return True


def check_files(
    graph_dir: str | Path,
    mode: str = "stamp",
    parts: tuple[str, ...] = ("shards", "csc"),
    meta=None,
    progress=None,
) -> list[FileCheck]:
    """One FileCheck per file meta.json records (in parts); stamps renewed for files hashed right."""
    graph_dir = Path(graph_dir)
    meta = meta if meta is not None else read_meta(graph_dir)
    stamps = _read_stamps(graph_dir)
    changed, results = False, []
    files = recorded_files(meta, parts)
    dtypes = _recorded_dtypes(meta)
    for k, (rel, recorded, writer) in enumerate(files):
        if progress is not None:
            progress(k, len(files))
        t0 = time.perf_counter()
        path = graph_dir / rel
        try:
            before = _signature(os.stat(path))
        except FileNotFoundError:
            results.append(FileCheck(rel, writer, None, recorded, "missing", 0.0))
            continue
        size = before["size"]
        if recorded is None:
            results.append(FileCheck(rel, writer, size, None, "not recorded", 0.0))
            continue
        if mode == "stamp" and _stamp_holds(stamps.get(rel), before, recorded):
            results.append(FileCheck(rel, writer, size, recorded, "ok (stamp)", time.perf_counter() - t0))
            continue
        actual = sha256_file(path)
        status = "ok (hashed)" if actual == recorded else "MISMATCH"
        if status == "ok (hashed)" and _signature(os.stat(path)) == before:  # unchanged while hashed
            stamps[rel], changed = _stamp(before, recorded), True
        elif status == "MISMATCH" and rel in stamps:
            del stamps[rel]
            changed = True
        results.append(FileCheck(rel, writer, size, recorded, status, time.perf_counter() - t0, actual))
    results = [_check_dtype(c, graph_dir / c.file, dtypes.get(c.file)) for c in results]
    if changed and not _write_stamps(graph_dir, stamps):
        info(f"graph_dir '{graph_dir}' is read-only: verified, but no stamps recorded (each run re-hashes)")
    return results


def problem(check: FileCheck, graph_dir: str | Path) -> GraphDirError:
    """The one-line error for a file that failed its check: which file, and the command that rewrites it."""
    path = Path(graph_dir) / check.file
    if check.writer == "shard":
        fix = f"re-run `gnnscale shard graph_dir={graph_dir} overwrite=true`, then `gnnscale build-csr graph_dir={graph_dir}`"
    else:
        fix = f"re-run `gnnscale build-csr graph_dir={graph_dir}`"
    if check.status == "missing":
        return GraphDirError(f"{path} is missing (meta.json lists it)", fix)
    if check.status == DTYPE_MISMATCH:
        return GraphDirError(f"{path} holds {check.dtype} but meta.json records {check.recorded_dtype}", fix)
    return GraphDirError(
        f"checksum mismatch for {path} (meta.json records sha256 {check.recorded[:12]}…, the file has "
        f"{check.actual[:12]}…): it is corrupt or was changed",
        fix,
    )


def verify_graph_dir(
    graph_dir: str | Path,
    mode: str = "stamp",
    parts: tuple[str, ...] = ("shards", "csc"),
    meta=None,
    progress=None,
    writer: bool = False,
) -> list[FileCheck]:
    """Raise GraphDirError (exit 2) for the first file that is missing or differs from meta.json; refuse
    a graph_dir that shard / build-csr is writing (writer: the caller holds that lock). mode=off: nothing."""
    if check_mode(mode) == "off":
        return []
    if not writer:
        check_not_written(graph_dir)
    results = check_files(graph_dir, mode, parts, meta, progress)
    bad = [c for c in results if not c.ok]
    if bad:
        raise problem(bad[0], graph_dir)
    unrecorded = [c.file for c in results if c.status == "not recorded"]
    if unrecorded:
        info(
            f"{', '.join(unrecorded)} in '{graph_dir}' have no recorded sha256 (built by an older gnnscale) "
            f"and were not checked; `gnnscale build-csr graph_dir={graph_dir}` records them"
        )
    return results


def stamp_written(graph_dir: str | Path, files: list[tuple[str, str]]) -> None:
    """A writer's own files, hashed as it wrote them: stamped now, so the first reader does not re-hash."""
    graph_dir = Path(graph_dir)
    stamps = _read_stamps(graph_dir)
    for rel, sha in files:
        stamps[rel] = _stamp(_signature(os.stat(graph_dir / rel)), sha)
    _write_stamps(graph_dir, stamps)
