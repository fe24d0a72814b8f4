"""`flowrl traces ls|show|label`: look at the store and review traces by hand."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import typer
from rich.table import Table

from flowrl.cli.common import StoreOption, console, open_store, report_problems
from flowrl.errors import ConfigError
from flowrl.facts import is_manual_label, run_outcome
from flowrl.store import TraceFilter, dumps

traces_app = typer.Typer(help="List, show and label stored traces.", no_args_is_help=True)
_OUTCOME = {"succeeded": "yes", "failed": "no", "partial": "partly", "unknown": ""}  # flowrl.facts.run_outcome


def _date(value: str | None, name: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(f"--{name} {value!r} is not a date: use YYYY-MM-DD") from exc


def _label(value: str | None) -> bool | None:
    if value is None:
        return None
    table = {"good": True, "true": True, "1": True, "bad": False, "false": False, "0": False}
    if value.lower() not in table:
        raise ConfigError(f"--label {value!r}: use good or bad")
    return table[value.lower()]


@traces_app.command("ls")
def ls(
    store: Path | None = StoreOption,
    since: str | None = typer.Option(None, help="First day, YYYY-MM-DD."),
    until: str | None = typer.Option(None, help="Last day, YYYY-MM-DD."),
    agent: str | None = typer.Option(None, help="Only this agent."),
    session: str | None = typer.Option(None, help="Only this session."),
    source: str | None = typer.Option(None, help="live, checkpoint, obs, live-file or import."),
    label: str | None = typer.Option(None, help="good or bad."),
    limit: int = typer.Option(50, help="Show at most this many (0: all)."),
) -> None:
    """List traces, newest day last."""
    st = open_store(store)
    flt = TraceFilter(since=_date(since, "since"), until=_date(until, "until"), agent=agent, session=session,
                      source=source, label=_label(label))
    table = Table()
    table.add_column("trace_id", no_wrap=True, min_width=12)
    table.add_column("time", no_wrap=True, min_width=16)
    for name in ("agent", "session", "source", "tools", "ok", "reward", "label"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", min_width=len(name), max_width=14)
    table.add_column("query", no_wrap=True, overflow="ellipsis", min_width=20, ratio=1)
    shown = total = 0
    id_width = 12
    for t in st.iter_traces(flt):
        total += 1
        if limit and shown >= limit:
            continue
        shown += 1
        id_width = max(id_width, len(t.trace_id))
        table.add_row(
            t.trace_id, t.timestamp[:16].replace("T", " "), t.agent_name or "", t.session_id, t.source, str(len(t.tool_calls)),
            _OUTCOME[run_outcome(t).verdict],
            "" if t.reward_score is None else f"{t.reward_score:.2f}",
            "" if t.label is None else ("good" if t.label else "bad") + (" (manual)" if is_manual_label(t) else ""),
            (t.user_query[:50] + "…") if len(t.user_query) > 50 else t.user_query,
        )
    table.columns[0].min_width = id_width  # ids are typed back into `show` and `label`: never cut them
    console.print(table)
    console.print(f"{total} traces under {st.root}" + (f", {shown} shown" if shown < total else ""))
    report_problems(st)


@traces_app.command("show")
def show(trace_id: str, store: Path | None = StoreOption) -> None:
    """Print one trace as JSON."""
    typer.echo(dumps(open_store(store).get(trace_id)).decode())


@traces_app.command("label")
def label_cmd(
    trace_id: str,
    verdict: str = typer.Argument(..., help="good or bad."),
    notes: str = typer.Option("", help="Why."),
    store: Path | None = StoreOption,
) -> None:
    """Label a trace by hand (a manual label always wins over the reward engine's)."""
    value = _label(verdict)
    assert value is not None
    t = open_store(store).label(trace_id, value, notes)
    console.print(f"labelled {t.trace_id} {'good' if t.label else 'bad'}")


def register(app: typer.Typer) -> None:
    app.add_typer(traces_app, name="traces")
