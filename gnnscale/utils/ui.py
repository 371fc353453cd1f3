"""Rank-zero console output and progress: rich bars on a terminal; off a terminal (a log file, a batch
job) one plain line at a fixed interval with done / total, rate and ETA (`ui.log_every_s`)."""

from __future__ import annotations

import os
import time
from typing import Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

T = TypeVar("T")

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def info(message: str) -> None:
    if is_rank_zero():
        console.print(message)


def progress_enabled() -> bool:
    if os.environ.get("GNNSCALE_PROGRESS") == "1":
        return True
    return is_rank_zero() and err_console.is_terminal


_log_every_s = 30.0


def set_log_interval(seconds: float) -> None:
    """How often a progress line is printed off a terminal (the stage config's ui.log_every_s)."""
    global _log_every_s
    _log_every_s = max(0.0, float(seconds))


class LogProgress:
    """The rich Progress calls gnnscale makes, as plain lines: at most one per interval."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._tasks: dict[int, dict] = {}
        self._last = time.monotonic()

    def __enter__(self) -> "LogProgress":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def add_task(self, description: str, total: float | None = None, extra: str = "", **_) -> int:
        k = len(self._tasks)
        self._tasks[k] = {
            "description": description,
            "total": total,
            "completed": 0,
            "extra": extra,
            "t0": time.monotonic(),
        }
        return k

    def update(self, task: int, completed=None, advance=None, total=None, extra=None, **_) -> None:
        t = self._tasks[task]
        if total is not None:
            t["total"] = total
        if completed is not None:
            t["completed"] = completed
        if advance is not None:
            t["completed"] += advance
        if extra is not None:
            t["extra"] = extra
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            console.print(self.line(t, now), markup=False, highlight=False, soft_wrap=True)

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def remove_task(self, task: int) -> None:
        self._tasks.pop(task, None)

    @staticmethod
    def line(t: dict, now: float) -> str:
        done, total = t["completed"], t["total"]
        elapsed = max(now - t["t0"], 1e-9)
        rate = done / elapsed
        parts = [
            f"{t['description']}: {done:,.0f}/{total:,.0f}" if total else f"{t['description']}: {done:,.0f}"
        ]
        parts.append(f"{rate:,.1f}/s")
        if total and rate > 0:
            parts.append(f"ETA {_clock(max(total - done, 0) / rate)}")
        parts.append(f"elapsed {_clock(elapsed)}")
        if t["extra"]:
            parts.append(str(t["extra"]))
        return " · ".join(parts)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def make_progress(transient: bool = False):
    """rich bars on a terminal; a LogProgress on rank zero elsewhere; nothing on other ranks."""
    if is_rank_zero() and not progress_enabled():
        return LogProgress(_log_every_s)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[extra]}"),
        console=err_console,
        disable=not progress_enabled(),
        transient=transient,
    )


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar (rank zero, on a terminal)."""
    with make_progress() as progress:
        task = progress.add_task(description, total=total, extra="")
        for item in items:
            yield item
            progress.advance(task)


def summary_table(title: str, rows: dict) -> None:
    """A two-column table of a stage's headline numbers."""
    if not is_rank_zero():
        return
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")  # a long path wraps instead of losing its end to "…"
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
        elif isinstance(value, int):
            value = f"{value:,}"
        table.add_row(str(key), str(value))
    console.print(table)


def grid_table(title: str, header: list[str], rows: list[list]) -> None:
    """A table with a header row (one line per item compared); floats to 4 significant digits."""
    if not is_rank_zero():
        return
    table = Table(title=title, title_justify="left")
    for name in header:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)
