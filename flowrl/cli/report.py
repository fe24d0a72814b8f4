"""`flowrl report`: write the HTML report."""

from __future__ import annotations

from pathlib import Path

import typer

from flowrl.cli.common import StoreOption, console, open_store, output_folder, report_problems


def report(
    out: Path = typer.Option(..., "--out", help="Folder for index.html and the PNG charts."),
    store: Path | None = StoreOption,
    run: list[Path] = typer.Option(
        [],
        "--run",
        help="Output dir of `flowrl train`, `eval`, `improve` or `promote` (repeatable); its promotions.jsonl too.",
    ),
) -> None:
    """Write an HTML report: traces per day, rewards, labels, tools, training curves, before/after eval, and the
    promotion history (promotions.jsonl beside the store and in each --run)."""
    from flowrl.report import make_report  # lazy: keeps `flowrl --help` fast

    st = open_store(store, missing_ok=store is None and bool(run))  # runs alone make a report
    output_folder(out, "--out")
    result = make_report(st, out, run)
    report_problems(st)
    console.print(f"report: {result.html} ({result.metrics.traces} traces, {len(result.pngs)} charts)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
