"""A memory cgroup a test or bench makes for its child processes and removes after (needs root): cgroup v1
memory.limit_in_bytes under this process's own memory cgroup (else the hierarchy's root), else v2
memory.max. Used by tests/test_outofcore_cgroup.py and scripts/bench_outofcore.py."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path


def _own_cgroup(controller: str | None) -> str:
    """This process's cgroup path for a v1 controller, or the v2 path (controller None)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (controller in controllers.split(",")):
            return path.lstrip("/")
    return ""


class MemoryCgroup:
    """`path` is None when none could be made, and `why_not` says why. limit: bytes, or set later."""

    def __init__(self, limit: int | None = None, name: str = "gnnscale-outofcore"):
        self.path, self.knob, self.kind, self.why_not, tried = None, None, None, None, []
        self.limit_bytes = limit
        if os.geteuid() != 0:
            self.why_not = "not root: making a memory cgroup needs root"
            return
        v1 = Path("/sys/fs/cgroup/memory")
        for parent in dict.fromkeys((v1 / _own_cgroup("memory"), v1)):
            if (parent / "cgroup.procs").is_file() and self._make(parent, "memory.limit_in_bytes", name):
                break
            tried.append(f"v1 {parent}")
        else:
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                parent = root / _own_cgroup(None)
                ctl = parent / "cgroup.subtree_control"
                if (
                    ctl.is_file()
                    and "memory" in ctl.read_text().split()
                    and self._make(parent, "memory.max", name)
                ):
                    break
                tried.append(f"v2 {parent}")
            else:
                self.why_not = "no writable memory cgroup controller (tried " + ", ".join(tried) + ")"
                return
        if limit is not None:
            self.limit(limit)

    def _make(self, parent: Path, knob: str, name: str) -> bool:
        path = parent / f"{name}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except OSError:
            return False
        if not (path / knob).is_file():
            path.rmdir()
            return False
        self.path, self.knob = path, knob
        self.kind = f"cgroup {'v1' if knob == 'memory.limit_in_bytes' else 'v2'} {knob}"
        # A process must be able to join it (v2 refuses a group whose parent holds processes, for one).
        try:
            subprocess.run(["true"], preexec_fn=self.join, check=True, timeout=30)
        except (subprocess.SubprocessError, OSError):
            self.remove()
            self.path = None
            return False
        return True

    def limit(self, nbytes: int) -> None:
        self.limit_bytes = int(nbytes)
        (self.path / self.knob).write_text(str(self.limit_bytes))

    def join(self) -> None:
        """In the child, before exec."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def read(self, *names: str) -> int | None:
        for name in names:
            try:
                return int((self.path / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return None

    def peak_bytes(self) -> int | None:
        return self.read("memory.max_usage_in_bytes", "memory.peak")

    def reset_peak(self) -> None:
        f = self.path / "memory.max_usage_in_bytes"
        if f.is_file():
            f.write_text("0")

    def remove(self) -> None:
        for _ in range(100):  # an exited child's pages are uncharged asynchronously
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
