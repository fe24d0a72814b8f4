"""`flowrl score`: run the reward engine over the store and write the rewards onto each trace."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from flowrl.cli.common import StoreOption, console, err_console, open_store
from flowrl.errors import ConfigError
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import ScoreSummary, score_store


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def print_summary(summary: ScoreSummary, root: Path) -> None:
    table = Table("reward", "weight", "mean", "scored", "None")
    for name, stats in summary.rewards.items():
        table.add_row(name, f"{summary.weights.get(name, 0):g}", _fmt(stats.mean), str(stats.values), str(stats.none))
    table.add_row("[bold]combined[/bold]", "", _fmt(summary.combined.mean), str(summary.combined.values),
                  str(summary.combined.none))
    if summary.scored:
        console.print(table)
    console.print(
        f"scored {summary.scored} of {summary.seen} traces under {root}"
        + (f", {summary.skipped} already scored (use --all to rescore)" if summary.skipped else "")
        + (f", {summary.failed} failed" if summary.failed else "")
    )
    if summary.scored:
        console.print(f"labels: {summary.good} good, {summary.bad} bad, {summary.unlabelled} unlabelled"
                      + (f" ({summary.manual_kept} manual labels kept)" if summary.manual_kept else ""))
    for name, report in summary.prepared.items():
        if report is not None and getattr(report, "trained", False):
            acc = report.heldout_accuracy
            console.print(f"{name}: trained on {report.n_labels} manual labels"
                          + (f", held-out accuracy {acc:.2f} on {report.heldout_n}" if acc is not None else ""))
        elif report is not None and getattr(report, "reason", ""):
            console.print(f"{name}: not trained: {report.reason}")
    for message in summary.problems + summary.errors:
        err_console.print(f"[yellow]skipped[/yellow] {message}", markup=True, highlight=False)


def score_cmd(
    store: Path | None = StoreOption,
    config: Path | None = typer.Option(None, "--config", "-c", help="Reward config (TOML or YAML): rewards and weights."),
    all_: bool = typer.Option(False, "--all", help="Rescore every trace, not only those without a score."),
    workers: int = typer.Option(4, "--workers", "-j", min=1, help="Batches scored in parallel."),
) -> None:
    """Score traces with the reward engine and write rewards, score and label onto each trace."""
    if config is not None and not config.is_file():
        raise ConfigError(f"{config}: no such reward config file")
    st = open_store(store)
    if not st.root.is_dir():
        raise ConfigError(f"no traces under {st.root}: run `flowrl ingest PATH` first, or pass --store")
    with RewardEngine.from_config(config) as engine:
        with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=console, transient=True) as bar:
            task = bar.add_task("score", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            summary = score_store(st, engine, rescore_all=all_, progress=progress, workers=workers)
    print_summary(summary, st.root)


def register(app: typer.Typer) -> None:
    app.command("score")(score_cmd)
