"""`flowrl traces ls|show|label|annotate`: look at the store, review traces by hand, record how a run went."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from flowrl.cli.common import StoreOption, console, open_store, report_problems
from flowrl.errors import ConfigError
from flowrl.store.files import TraceFilter, dumps
from flowrl.trace.facts import is_manual_label, run_outcome
from flowrl.trace.load import stored_dict
from flowrl.trace.outcomes import make_outcome, parse_reward
from flowrl.trace.redact import Redactor

traces_app = typer.Typer(help="List, show, label and annotate stored traces.", no_args_is_help=True)
_OUTCOME = {"succeeded": "yes", "failed": "no", "partial": "partly", "unknown": ""}  # flowrl.trace.facts.run_outcome


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


# `traces ls` columns: a reviewer's key columns are always shown in full (ids are typed back into `show` and
# `label`); the query is shortened to fit; the optional ones are shown, in this order, while there is room.
_KEY = ("trace_id", "time", "tools", "ok", "reward", "label")
_OPTIONAL = ("session", "agent", "source")
_ORDER = ("trace_id", "time", "agent", "session", "source", "tools", "ok", "reward", "label", "query")
_GAP = 2  # spaces between columns (the table's padding)
_OPTIONAL_MAX, _QUERY_ROOMY, _QUERY_MIN = 14, 20, 10


def _fit_columns(rows: list[dict[str, str]], width: int) -> tuple[dict[str, int], list[str]]:
    """Column widths for `width` terminal cells, and the optional columns left out for lack of room. The
    optional columns need the query to keep `_QUERY_ROOMY` cells; the query itself gets what is left, at least
    `_QUERY_MIN` (so the widths add up to more than `width` only when the key columns alone do not fit)."""
    natural = {name: max([cell_len(name), *(cell_len(r[name]) for r in rows)]) for name in _ORDER}
    chosen = {name: natural[name] for name in _KEY}
    used = sum(chosen.values()) + _GAP * len(chosen)  # the gaps before each column after the first, query's included
    hidden = []
    for name in _OPTIONAL:
        want = min(natural[name], _OPTIONAL_MAX)
        if used + want + _GAP + min(natural["query"], _QUERY_ROOMY) <= width:
            chosen[name] = want
            used += want + _GAP
        else:
            hidden.append(name)
    chosen["query"] = min(natural["query"], max(_QUERY_MIN, width - used))
    return {name: chosen[name] for name in _ORDER if name in chosen}, [n for n in _ORDER if n in hidden]


@traces_app.command("ls")
def ls(  # noqa: PLR0913  # a typer command: one parameter per option
    store: Path | None = StoreOption,
    since: str | None = typer.Option(None, help="First day, YYYY-MM-DD."),
    until: str | None = typer.Option(None, help="Last day, YYYY-MM-DD."),
    agent: str | None = typer.Option(None, help="Only this agent."),
    session: str | None = typer.Option(None, help="Only this session."),
    source: str | None = typer.Option(None, help="live, checkpoint, obs, live-file or import."),
    label: str | None = typer.Option(None, help="good or bad."),
    limit: int = typer.Option(50, help="Show at most this many (0: all)."),
    ids: bool = typer.Option(False, "--ids", help="Print only the trace ids, one per line (for scripts)."),
) -> None:
    """List traces, newest day last."""
    st = open_store(store)
    flt = TraceFilter(
        since=_date(since, "since"),
        until=_date(until, "until"),
        agent=agent,
        session=session,
        source=source,
        label=_label(label),
    )
    if ids:  # nothing but ids on stdout, so `$(flowrl traces ls --ids ...)` is a list of ids
        for shown, t in enumerate(st.iter_traces(flt)):
            if limit and shown >= limit:
                break
            typer.echo(t.trace_id)
        report_problems(st)
        return
    rows: list[dict[str, str]] = []
    total = 0
    for t in st.iter_traces(flt):
        total += 1
        if limit and len(rows) >= limit:
            continue
        rows.append(
            {
                "trace_id": t.trace_id,
                "time": t.timestamp[:16].replace("T", " "),
                "agent": t.agent_name or "",
                "session": t.session_id,
                "source": t.source,
                "tools": str(len(t.tool_calls)),
                "ok": _OUTCOME[run_outcome(t).verdict],
                "reward": "" if t.reward_score is None else f"{t.reward_score:.2f}",
                "label": ""
                if t.label is None
                else ("good" if t.label else "bad") + (" (manual)" if is_manual_label(t) else ""),
                "query": (t.user_query[:50] + "…") if len(t.user_query) > 50 else t.user_query,
            }
        )
    widths, hidden = _fit_columns(rows, console.size.width)
    table = Table(box=None, pad_edge=False)
    for name, width in widths.items():
        table.add_column(name, no_wrap=True, overflow="ellipsis", width=width)
    for row in rows:
        table.add_row(*(row[name] for name in widths))
    needed = sum(widths.values()) + _GAP * (len(widths) - 1)
    # never let rich squeeze a key column: lines longer than a very narrow terminal wrap instead
    out = console if needed <= console.size.width else Console(file=console.file, width=needed, soft_wrap=True)
    out.print(table)
    shown = len(rows)
    console.print(
        f"{total} traces under {st.root}"
        + (f", {shown} shown" if shown < total else "")
        + (f"; {', '.join(hidden)} hidden: widen the terminal to see them" if hidden and rows else ""),
        highlight=False,
    )
    report_problems(st)


@traces_app.command("show")
def show(trace_id: str, store: Path | None = StoreOption) -> None:
    """Print one trace as JSON, with the host's outcomes (`outcomes`) when it has any."""
    trace = open_store(store).get(trace_id)
    data = stored_dict(trace)
    if trace.outcomes:
        data["outcomes"] = [o.model_dump(mode="json", exclude_none=True) for o in trace.outcomes]
    typer.echo(dumps(data).decode())


@traces_app.command("annotate")
def annotate(
    trace_id: str,
    reference: str | None = typer.Option(None, help="The run's known right answer (what reference_answer reads)."),
    success: bool | None = typer.Option(None, "--success/--failure", help="Did the run do its task?"),
    reward: list[str] = typer.Option([], "--reward", help="name=value, a number from 0 to 1 (repeatable)."),
    feedback: str | None = typer.Option(None, help="Free text: what the user or a test said (kept, not scored)."),
    source: str = typer.Option("user", help="Who says it: user, test, app, or another short name."),
    store: Path | None = StoreOption,
) -> None:
    """Record how a run went: its reference answer, success, named rewards or feedback (docs/capture.md).

    Appended beside the trace; it survives `flowrl score --all`. A host success outranks every engine reward,
    and only a manual label outranks it. Run `flowrl score` afterwards to update the trace's scores."""
    s = open_store(store)
    if not s.exists(trace_id):
        raise ConfigError(f"no trace {trace_id!r} under {s.root}: list them with `flowrl traces ls`")
    rewards = dict(parse_reward(text) for text in reward)
    outcome = make_outcome(
        reference=_masked(reference), success=success, rewards=rewards, feedback=_masked(feedback), source=source
    )
    s.record_outcome(trace_id, outcome)
    said = [f"reference {outcome.reference!r}"] if outcome.reference is not None else []
    said += [] if outcome.success is None else ["success" if outcome.success else "failure"]
    said += [f"{name}={value:g}" for name, value in outcome.rewards.items()]
    said += ["feedback"] if outcome.feedback is not None else []
    console.print(f"annotated {trace_id} ({source}): {', '.join(said)}; run `flowrl score` to re-score it")


def _masked(text: str | None) -> str | None:
    """Secrets out of what is written to the store, as capture and ingest mask theirs."""
    return None if text is None else Redactor().redact_text(text)


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
