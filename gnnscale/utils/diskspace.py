"""A full disk is a user's problem with a fix: exit 2 naming the folder and about how much is needed.

Memory-mapped outputs (the shard staging arrays, the CSC) are checked before they are created: writing a
mapped page on a full disk kills the process with SIGBUS instead of raising ENOSPC.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gnnscale.errors import GnnscaleError


class DiskFullError(GnnscaleError):
    """No space left where a stage writes."""


def human(num_bytes: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if num_bytes >= 0.1 * scale or unit == "KB":
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path if path.is_dir() else path.parent


def free_bytes(path: str | os.PathLike) -> int:
    return shutil.disk_usage(_existing(Path(path))).free


def disk_full(path: str | os.PathLike, need_bytes: int | None) -> DiskFullError:
    folder = _existing(Path(path))
    need = f", need about {human(need_bytes)}" if need_bytes else ""
    return DiskFullError(
        f"no space left on {folder}{need} ({human(free_bytes(folder))} free)",
        "free some space there, or point the output at a bigger disk",
    )


def ensure_space(path: str | os.PathLike, need_bytes: int) -> None:
    """Refuse before writing need_bytes under path when the file system has less free."""
    if free_bytes(path) < need_bytes:
        raise disk_full(path, need_bytes)
