"""The memory a run may use, read where the kernel enforces it, and the budget a stage plans within.

A container's limit is a cgroup's (Docker, Kubernetes and Slurm set one): cgroup v2 `memory.max`,
cgroup v1 `memory.limit_in_bytes`, the smallest along the process's path up the hierarchy. Outside
one (or above it), what the machine has free: MemAvailable, plus what this process already holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gnnscale.errors import ConfigError
from gnnscale.utils.memory import status_kb

_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge page-aligned number
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
AUTO_FRACTION = 0.9  # `auto` leaves a tenth for the kernel's own use, other processes and estimate error


@dataclass(frozen=True)
class MemoryLimit:
    bytes: int
    source: (
        str  # where it was read: "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes", "MemAvailable"
    )


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_paths(proc: Path) -> dict[str, str]:
    """{'v2': path} and/or {'v1': path of the memory controller} from /proc/self/cgroup."""
    out = {}
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out["v2"] = path
        elif "memory" in controllers.split(","):
            out["v1"] = path
    return out


def _smallest_up(root: Path, rel: str, name: str) -> int | None:
    """The smallest limit file `name` from root/rel up to root (a parent's limit binds its children)."""
    limits = []
    here = Path(rel.lstrip("/"))
    while True:
        value = _read_int(root / here / name)
        if value is not None and value < _UNLIMITED:
            limits.append(value)
        if here == Path("."):
            break
        here = here.parent
    return min(limits) if limits else None


def cgroup_limit(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> MemoryLimit | None:
    paths = _cgroup_paths(proc)
    found = []
    if "v2" in paths:
        # v2 alone is mounted at the root; beside v1 (hybrid) it is under unified/.
        for base in (cgroup, cgroup / "unified"):
            value = _smallest_up(base, paths["v2"], "memory.max")
            if value is not None:
                found.append(MemoryLimit(value, "cgroup v2 memory.max"))
                break
    if "v1" in paths:
        value = _smallest_up(cgroup / "memory", paths["v1"], "memory.limit_in_bytes")
        if value is not None:
            found.append(MemoryLimit(value, "cgroup v1 memory.limit_in_bytes"))
    return min(found, key=lambda m: m.bytes) if found else None


def _meminfo_kb(proc: Path, field: str) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> MemoryLimit | None:
    """The memory this process may grow to: the tighter of its cgroup's limit and what the machine has
    free (MemAvailable + its own RSS). None when neither can be read."""
    candidates = []
    limit = cgroup_limit(proc, cgroup)
    if limit is not None:
        candidates.append(limit)
    avail = _meminfo_kb(proc, "MemAvailable")
    if avail is not None:
        own = status_kb("VmRSS", str(proc / "self" / "status")) or 0
        candidates.append(MemoryLimit((avail + own) * 1024, "MemAvailable"))
    return min(candidates, key=lambda m: m.bytes) if candidates else None


def parse_size(text: str, key: str) -> int:
    """'6GB', '1.5G', '800MiB', '2e9' -> bytes (decimal units; KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(
            f"{key}={text!r} is not a memory size", f"use {key}=auto or a size such as {key}=6GB or 800MiB"
        )
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Budget:
    bytes: int
    why: str  # e.g. "90% of the cgroup v1 limit 1.5 GB", "train.memory_budget=6GB"


def resolve_budget(spec: str, key: str, limit: MemoryLimit | None = None) -> Budget:
    """`auto`: AUTO_FRACTION of the limit this process runs under; or a size the user gave."""
    if str(spec).lower() != "auto":
        return Budget(parse_size(spec, key), f"{key}={spec}")
    limit = limit if limit is not None else memory_limit()
    if limit is None:
        raise ConfigError(
            "cannot read this machine's memory limit (no cgroup limit, no /proc/meminfo)",
            f"set {key}=SIZE, e.g. {key}=8GB",
        )
    return Budget(
        int(limit.bytes * AUTO_FRACTION), f"{AUTO_FRACTION:.0%} of {gb(limit.bytes)}, {limit.source}"
    )


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n < 1e10 else f"{n / 1e9:.0f} GB"
