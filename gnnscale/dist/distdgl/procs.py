"""The processes of one machine's share of a DistDGL job: started, watched, and all ended together.

DistDGL itself never gives up: a server waits for its clients forever, a client retries its servers
for ~50 minutes, and a trainer whose peer died blocks in its next collective. So the launcher watches
every child: the first to fail (or a job that outlives its timeout once one finished) ends the rest,
and the job exits with one line naming the child. Each child leads its own process group (its DGL
sampler processes included), so ending it ends them too. DistDGL keeps the partition in POSIX shared
memory named after the graph and the data (not the job), so one machine runs one job at a time
(a lock says so) and the segments a job leaves are removed when it ends.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gnnscale.errors import ConfigError, GnnscaleError
from gnnscale.utils.ui import err_console

SHM = Path("/dev/shm")
LOCK_NAME = "gnnscale-distdgl.lock"
USER_ERROR = 2  # a child that exits 2 said `error: ...` about the user's input (the CLI's convention)
_ERROR_LINE = re.compile(r"^(error: |[\w.]*(Error|Exception)\b)|Check failed")


class ChildFailed(SystemExit):
    """A server or trainer died: the job exits 1 after one line naming it (its traceback is in its log)."""

    def __init__(self, line: str):
        super().__init__(1)
        self.line = line

    def __str__(self) -> str:
        return self.line


class ChildUserError(GnnscaleError):
    """A trainer refused the input (exit 2, `error: ...`): the job is a user error too (exit 2)."""


@dataclass
class Child:
    name: str  # "server 0", "trainer 1": what the one line says
    role: str  # server | trainer
    proc: subprocess.Popen
    log: Path
    handles: list[IO] = field(default_factory=list)

    def returncode(self) -> int | None:
        return self.proc.poll()


class ProcessGroup:
    def __init__(self, log_dir: Path, timeout_s: float):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s = float(timeout_s)
        self.children: list[Child] = []

    def start(self, name: str, role: str, argv: list[str], env: dict, console: bool = False) -> Child:
        """console: stdout goes to this terminal (the rank-0 trainer's progress); everything else to the log."""
        log = self.log_dir / f"{name.replace(' ', '_')}.log"
        err = open(log, "w")
        out = None if console else err
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
        )
        child = Child(name, role, proc, log, [err])
        self.children.append(child)
        return child

    def wait(self, poll_s: float = 0.2) -> None:
        """Until every trainer exited 0 and the servers shut down. Raises ChildFailed / ChildUserError."""
        ended_at = None  # when the first child ended well: the rest get timeout_s to follow
        while True:
            running = []
            for c in self.children:
                rc = c.returncode()
                if rc is None:
                    running.append(c)
                elif rc != 0:
                    self._fail(c, rc)
                elif ended_at is None:
                    ended_at = time.monotonic()
            if not any(c.role == "trainer" for c in running):
                break
            if ended_at is not None and time.monotonic() - ended_at > self.timeout_s:
                late = ", ".join(c.name for c in running)
                self._raise(
                    f"{late} still running {self.timeout_s:.0f} s after the first process ended (dist.timeout_s)"
                )
            time.sleep(poll_s)
        self._wait_servers()

    def _wait_servers(self) -> None:
        """Trainer rank 0 shuts the servers down on its way out; give them a moment, then end them."""
        deadline = time.monotonic() + min(self.timeout_s, 30.0)
        while time.monotonic() < deadline and any(c.returncode() is None for c in self.children):
            time.sleep(0.1)
        self.stop()

    def _fail(self, c: Child, rc: int) -> None:
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        last = last_line(c.log)
        line = (
            f"distdgl: {c.name} (pid {c.proc.pid}) {how}" + (f": {last}" if last else "") + f" (log: {c.log})"
        )
        if rc == USER_ERROR and last.startswith("error: "):
            self.stop()
            raise ChildUserError(last.removeprefix("error: "), f"log: {c.log}")
        self._raise(line)

    def _raise(self, line: str) -> None:
        self.stop()
        err_console.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
        raise ChildFailed(line)

    def stop(self, grace_s: float = 5.0) -> None:
        """End every child still running (its whole process group): SIGTERM, then SIGKILL after grace_s."""
        alive = [c for c in self.children if c.returncode() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for c in alive:
                _signal_group(c.proc.pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(c.returncode() is None for c in alive):
                time.sleep(0.05)
            alive = [c for c in alive if c.returncode() is None]
            if not alive:
                break
        for c in self.children:
            _signal_group(
                c.proc.pid, signal.SIGKILL
            )  # the group's leftovers (a sampler whose trainer exited)
            for h in c.handles:
                h.close()
            c.handles.clear()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def last_line(log: Path) -> str:
    """What a log says went wrong: its last exception or `error:` line (DGL's C++ errors end in a stack of
    frames), else its last line."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log) - 65536))
            lines = [x.strip() for x in fh.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line[:400]
    return lines[-1][:400] if lines else ""


class MachineLock:
    """One DistDGL job per machine: DistDGL's shared-memory names would collide. Held while it runs; on
    exit removes the DistDGL segments that appeared meanwhile (a killed server leaves its own behind)."""

    def __init__(self, graph_name: str):
        self.graph_name = graph_name
        self.folder = SHM if SHM.is_dir() else Path("/tmp")
        self._fh = None
        self._before: set[str] = set()

    def __enter__(self) -> "MachineLock":
        self._fh = open(self.folder / LOCK_NAME, "a+")
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "?"
            self._fh.close()
            raise ConfigError(
                f"another DistDGL job is running on this machine (pid {holder}); DistDGL's shared memory "
                "would collide with it",
                "wait for it to finish: DistDGL runs one job per machine",
            ) from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()
        self._before = set(_segments(self.folder, self.graph_name))
        return self

    def __exit__(self, *exc) -> None:
        for name in set(_segments(self.folder, self.graph_name)) - self._before:
            (self.folder / name).unlink(missing_ok=True)
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()


def _segments(folder: Path, graph_name: str) -> list[str]:
    """DistDGL's segments: the graph's (named after it) and the key-value store's (`...-kvdata-`)."""
    if folder != SHM:
        return []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [n for n in names if n.startswith(graph_name) or n.endswith("-kvdata-")]


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
