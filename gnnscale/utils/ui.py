"""Rank-zero console output and progress bars (rich); bars are hidden when stderr is not a terminal."""

from __future__ import annotations

import os
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


def make_progress(transient: bool = False) -> Progress:
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
