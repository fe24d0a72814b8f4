"""Helpers shared by the CLI's command modules: store resolution, console, summaries."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import typer
from rich.console import Console

from flowrl.store import ReadProblem, TraceStore

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

StoreOption = typer.Option(
    None,
    "--store",
    help=(
        "Trace store folder (default: $FLOWRL_HOME/traces, else toolboxv2's rl_traces, "
        "else ~/.local/share/flowrl/traces)."
    ),
)


def open_store(store: Path | None) -> TraceStore:
    return TraceStore(store) if store is not None else TraceStore.default()


def report_problems(source: TraceStore | Iterable[ReadProblem]) -> None:
    """Name every unreadable file one operation skipped, one line each, on stderr: those of a
    `store.operation()` record, or, given the store, of its latest operation."""
    for problem in source.problems if isinstance(source, TraceStore) else source:
        err_console.print(f"[yellow]skipped[/yellow] {problem.message}", markup=True, highlight=False)
