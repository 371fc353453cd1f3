"""Advisory locks: one writer per graph_dir and per train run_dir at a time.

A lock is a file holding the owner's pid and stage, locked with fcntl.flock while the owner runs. The
kernel drops a flock when its process dies, so a lock left by a killed run is free: the next run takes
it over (and says whose it was). A second live process gets exit 2 naming the owner.

- graph_dir writers (shard, build-csr): <parent>/.<name>.lock, beside graph_dir (shard replaces the
  folder itself); readers (train, infer, partition, verify) refuse to start while one is held.
- partition: graph_dir/partitions/.lock (it writes only there; readers of the graph may run meanwhile).
- train: <parent>/.<run_dir name>.lock, for a run_dir given (run_dir= / resume=).
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gnnscale.errors import GnnscaleError
from gnnscale.utils.ui import info


class LockedError(GnnscaleError):
    """Another live gnnscale process owns the folder."""


def lock_beside(folder: str | Path) -> Path:
    """<parent>/.<name>.lock: a folder's lock, outside it (a writer may replace the folder itself)."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


def graph_lock_path(graph_dir: str | Path) -> Path:
    return lock_beside(graph_dir)


def _owner(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").split()
    except OSError:
        return "another process"
    return f"pid {text[0]} (gnnscale {text[1]})" if len(text) >= 2 else "another process"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _open_locked(lock_file: Path, what: str) -> int | None:
    """An fd holding the exclusive flock of lock_file (the file the path names now, not one a releasing
    owner just unlinked); None when the lock file cannot be created (a read-only parent)."""
    while True:
        try:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise LockedError(
                f"{what} is in use by {owner}", "wait for it to finish (or stop it), or choose another folder"
            ) from None
        try:
            same = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # unlinked by its owner between our open and flock: take the new one


@contextmanager
def hold(lock_file: str | Path, what: str, stage: str) -> Iterator[None]:
    """Own lock_file for the block; exit 2 if a live process owns it. what: the folder, for messages.
    A lock file that cannot be created (a read-only parent) is skipped: such a folder cannot be written."""
    lock_file = Path(lock_file)
    fd = _open_locked(lock_file, what)
    if fd is None:
        yield
        return
    try:
        previous = os.pread(fd, 256, 0).decode(errors="replace").split()
        if previous and previous[0].isdigit() and int(previous[0]) != os.getpid():
            dead = not _pid_alive(int(previous[0]))
            info(
                f"taking over the lock of {what} left by pid {previous[0]} (gnnscale "
                f"{previous[1] if len(previous) > 1 else '?'}"
                + (", no longer running)" if dead else ", which no longer holds it)")
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {stage}\n".encode(), 0)
        try:
            yield
        finally:
            lock_file.unlink(missing_ok=True)  # released: no file left behind (only a killed run leaves one)
    finally:
        os.close(fd)  # drops the flock


@contextmanager
def run_dir_lock(run_dir: str | Path | None, stage: str, enabled: bool = True) -> Iterator[None]:
    """A train run_dir's lock, <parent>/.<name>.lock (beside it: the run_dir itself is not created
    before the run decides to keep it). Nothing to lock for a run that has not named its folder yet."""
    if not run_dir or not enabled:
        yield
        return
    with hold(lock_beside(run_dir), f"run_dir '{run_dir}'", stage):
        yield


def check_not_written(graph_dir: str | Path) -> None:
    """Refuse to read a graph_dir while shard or build-csr is writing it (exit 2, naming the writer)."""
    path = graph_lock_path(graph_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody has written it through a lock, or nobody can
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(
                f"graph_dir '{graph_dir}' is being written by {_owner(fd)}",
                "wait for it to finish, then run this again",
            ) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
