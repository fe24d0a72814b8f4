"""`flowrl score`: run the reward engine over the store and write the rewards onto each trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from typer.core import TyperCommand

from flowrl.cli.common import StoreOption, console, err_console, open_store, progress_bar
from flowrl.errors import ConfigError
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import DEFAULT_MAX_ERROR_RATE, ErrorBudgetExceeded, ScoreSummary, score_store

LOCAL_RAY = "local"  # what `--ray` alone stands for (flowrl.rewards.ray_scoring.LOCAL, not imported: no ray here)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def print_summary(summary: ScoreSummary, root: Path) -> None:
    table = Table("reward", "weight", "mean", "scored", "cannot judge", "errors")
    for name, stats in summary.rewards.items():
        table.add_row(
            name,
            f"{summary.weights.get(name, 0):g}",
            _fmt(stats.mean),
            str(stats.values),
            str(stats.none),
            f"[red]{stats.errors}[/red]" if stats.errors else "0",
        )
    if summary.scored:
        table.add_row(
            "[bold]combined[/bold]",
            "",
            _fmt(summary.combined.mean),
            str(summary.combined.values),
            str(summary.combined.none),
            str(summary.combined.errors),
        )
    if summary.computed:
        console.print(table)
    for name, stats in summary.rewards.items():
        if stats.errors:
            err_console.print(
                f"[red]error[/red] {name} crashed on {stats.errors} of {summary.computed} traces, "
                f"first: {stats.first_error}",
                markup=True,
                highlight=False,
            )
    if summary.over_budget():  # score_store wrote nothing
        console.print(
            f"computed {summary.computed} of {summary.todo} traces under {root}; nothing written: "
            f"{summary.error_results} of {summary.results} results are errors "
            f"({summary.error_rate:.1%}, budget {summary.max_error_rate * 100:g}%)"
        )
    else:
        console.print(
            f"scored {summary.scored} of {summary.seen} traces under {root}"
            + (f", {summary.skipped} already scored (use --all to rescore)" if summary.skipped else "")
            + (f", {summary.failed} failed" if summary.failed else "")
        )
    if summary.scored:
        console.print(
            f"labels: {summary.good} good, {summary.bad} bad, {summary.unlabelled} unlabelled"
            + (f" ({summary.manual_kept} manual labels kept)" if summary.manual_kept else "")
        )
    if summary.errored:
        console.print(
            f"errors: {summary.error_results} of {summary.results} results "
            f"({summary.error_rate:.1%}, budget {summary.max_error_rate * 100:g}%); {summary.errored} traces "
            "written without a combined score or engine label (fix the reward, then rescore with --all)"
        )
    for name, report in summary.prepared.items():
        if report is not None and getattr(report, "trained", False):
            acc = report.heldout_accuracy
            console.print(
                f"{name}: trained on {report.n_labels} manual labels"
                + (f", held-out accuracy {acc:.2f} on {report.heldout_n}" if acc is not None else "")
            )
        elif report is not None and getattr(report, "reason", None):
            console.print(f"{name}: not trained: {report.reason}")
    for message in summary.problems + summary.errors:
        err_console.print(f"[yellow]skipped[/yellow] {message}", markup=True, highlight=False)


def score_cmd(
    store: Path | None = StoreOption,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Reward config (TOML or YAML): rewards and weights."
    ),
    all_: bool = typer.Option(False, "--all", help="Rescore every trace, not only those without a score."),
    workers: int = typer.Option(4, "--workers", "-j", min=1, help="Batches scored in parallel."),
    max_error_rate: float | None = typer.Option(
        None,
        "--max-error-rate",
        min=0.0,
        max=1.0,
        help="Write nothing when more than this share of the (trace, reward) results are errors (a reward crashed). "
        f"Default: max_error_rate in the reward config, else {DEFAULT_MAX_ERROR_RATE:g}.",
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        metavar="[ADDRESS]",
        help="Compute the rewards on Ray Data workers (one engine and sandbox each); this process writes them. "
        "Alone: a Ray of its own on 127.0.0.1, stopped after. With an ADDRESS (ray://host:port or host:port): "
        "that cluster. Needs `pip install 'ray[data]'`.",
    ),
    ray_workers: int = typer.Option(2, "--ray-workers", min=1, help="Ray workers (actors) with --ray."),
) -> None:
    """Score traces with the reward engine and write rewards, score and label onto each trace.

    A reward that crashes is an error, not "cannot judge": past --max-error-rate nothing is written. With --ray the
    rewards are computed on Ray workers and written here, with the same records and rules."""
    if config is not None and not config.is_file():
        raise ConfigError(f"{config}: no such reward config file")
    st = open_store(store)
    if not st.root.is_dir():
        raise ConfigError(f"no traces under {st.root}: run `flowrl ingest PATH` first, or pass --store")
    with RewardEngine.from_config(config) as engine:
        if max_error_rate is None:  # the flag wins, then the config's key, then the default
            max_error_rate = DEFAULT_MAX_ERROR_RATE if engine.max_error_rate is None else engine.max_error_rate
        with progress_bar(console, "scoring", remaining=True) as bar:
            task = bar.add_task("score", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            try:
                if ray is None:
                    summary = score_store(
                        st, engine, rescore_all=all_, progress=progress, workers=workers, max_error_rate=max_error_rate
                    )
                else:  # imported here: without --ray, nothing imports ray
                    from flowrl.rewards.ray_scoring import score_store_ray  # lazy: keeps `flowrl --help` fast

                    summary = score_store_ray(
                        st,
                        engine,
                        address=ray,
                        ray_workers=ray_workers,
                        rescore_all=all_,
                        progress=progress,
                        workers=workers,
                        max_error_rate=max_error_rate,
                    )
            except ErrorBudgetExceeded as exc:
                bar.stop()
                print_summary(exc.summary, st.root)
                raise
    st.flush()  # a segment store buffers its side records: durable before the summary
    print_summary(summary, st.root)


class ScoreCommand(TyperCommand):
    """`flowrl score`, whose `--ray` takes an optional ADDRESS (typer has no such option): given alone, last or
    before another option, it means a local Ray."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given: list[str] = []
        for i, arg in enumerate(args):
            given.append(arg)
            if arg == "--":
                given.extend(args[i + 1 :])
                break
            if arg == "--ray" and (i + 1 == len(args) or args[i + 1].startswith("-")):
                given.append(LOCAL_RAY)
        return super().parse_args(ctx, given)


def register(app: typer.Typer) -> None:
    app.command("score", cls=ScoreCommand)(score_cmd)
