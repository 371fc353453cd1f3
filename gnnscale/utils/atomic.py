"""Atomic writes: a temporary name in the same folder, fsync, rename — a crash never leaves half a file."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from gnnscale.utils.diskspace import disk_full
from gnnscale.utils.faults import fault_point


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, need_bytes: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it and rename it into place. A full disk
    (ENOSPC) is DiskFullError (exit 2) naming the folder and need_bytes (default: what was written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        fault_point(f"write:{path.name}")  # tests/test_faults.py: killed with the file written, not renamed
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        fsync_dir(path.parent)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        written = tmp_path.stat().st_size if tmp_path.exists() else 0
        raise disk_full(path.parent, need_bytes or written or None) from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def fsync_dir(folder: str | os.PathLike) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def append_jsonl(path: str | os.PathLike, obj: Any) -> None:
    """Append one JSON line and flush it to disk (a killed run keeps every finished line)."""
    line = json.dumps(obj) + "\n"
    with open(path, "a") as fh:
        size = fh.tell()
        try:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError as exc:
            fh.truncate(size)  # never half a line: the file stays readable (and resumable)
            if exc.errno == errno.ENOSPC:
                raise disk_full(Path(path).parent, len(line)) from None
            raise


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
