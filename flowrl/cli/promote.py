"""`flowrl promote`: put a candidate adapter in front of users only when it is proven better than what is promoted
now; `--list` shows the history, `--rollback` undoes the last promotion. Thin over flowrl.promote."""

from __future__ import annotations

import contextlib
import functools
import shutil
from pathlib import Path
from typing import Any

import typer

from flowrl.cli.common import (
    AgentPythonOption,
    GradeOption,
    StoreOption,
    agent_outcomes,
    console,
    example_agent,
    on_ctrl_c,
    output_folder,
    user_agent,
)
from flowrl.errors import ConfigError


def promote_cmd(  # noqa: PLR0913  # a typer command: one parameter per option
    candidate: Path | None = typer.Argument(None, help="The adapter folder to promote (a round's adapter)."),
    against: str | None = typer.Option(
        None, "--against", help="The model to beat: an adapter folder, or `base` (default: what is promoted now)."
    ),
    eval_tasks: int = typer.Option(150, "--eval-tasks", min=1, help="Held-out tasks of the example agent's suite."),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="Your agent: MODULE:FACTORY (or file.py:FACTORY), as flowrl improve --agent takes it. Default: the "
        "example agent.",
    ),
    agent_python: Path | None = AgentPythonOption,
    tasks: Path | None = typer.Option(
        None,
        "--tasks",
        help="With --agent: JSONL of {task_id, query, answer[, family]}, every one held out (never trained on).",
    ),
    grade: str | None = GradeOption,
    alpha: float = typer.Option(0.05, "--alpha", help="McNemar's level: promote only below it."),
    store: Path | None = StoreOption,
    history: Path | None = typer.Option(
        None, "--history", help="The promotions record (default: promotions.jsonl beside the store)."
    ),
    out: Path = typer.Option(Path("promote-out"), "--out", help="Folder for the eval and its runs."),
    engine: str = typer.Option("auto", "--engine", help="The policy server's engine."),
    list_: bool = typer.Option(False, "--list", help="Show the history with each entry's figures."),
    rollback: bool = typer.Option(False, "--rollback", help="Restore the model promoted before the current one."),
    export: Path | None = typer.Option(
        None,
        "--export",
        help="Then export the model promoted now into this folder (GGUF, verified, and an Ollama Modelfile).",
    ),
    ollama: str | None = typer.Option(
        None, "--ollama", help="With --export: register it with Ollama under this name (or print the command)."
    ),
) -> None:
    """Promote CANDIDATE only if the agent (yours with --agent, else the example agent) on it beats the model
    promoted now on held-out tasks (McNemar p < --alpha and the difference's 95% interval above 0); record every
    decision in promotions.jsonl. `flowrl serve BASE --promotions FILE` follows it."""
    from flowrl.promote import History  # lazy: keeps `flowrl --help` fast
    from flowrl.promote.history import FILE_NAME  # lazy: keeps `flowrl --help` fast
    from flowrl.store.files import default_root  # lazy: keeps `flowrl --help` fast

    record = History(history or (Path(store) if store is not None else default_root()).parent / FILE_NAME)
    if ollama is not None and export is None:
        raise ConfigError("--ollama goes with --export DIR: the folder the promoted model is exported into")
    if export is not None:
        output_folder(export, "--export", keep=False)  # before minutes of evaluation, not after
    if list_ or rollback:
        if candidate is not None:
            raise ConfigError("--list and --rollback take no CANDIDATE")
        if rollback:
            undone, restored = record.rollback()
            console.print(f"rolled back {undone}; promoted now: {restored or 'the base model'}", highlight=False)
            if restored is None and export is not None:
                console.print(
                    f"nothing exported: the base model serves now; {export} still holds {undone}'s export "
                    f"(flowrl export --model BASE --out {export} --overwrite replaces it)",
                    highlight=False,
                )
                return
            _export_promoted(record, export, ollama)
            return
        for line in _history_lines(record):
            console.print(line, highlight=False, markup=False)
        return
    if candidate is None:
        if export is not None:  # export what is promoted now, and nothing else
            _export_promoted(record, export, ollama)
            return
        raise ConfigError("give the CANDIDATE adapter folder (or --list, --rollback, --export)")
    output_folder(out, "--out")
    from flowrl.promote.run import BASE, promote  # lazy: keeps `flowrl --help` fast

    with contextlib.ExitStack() as stack:
        make_agent, held_out, grader = _agent_and_tasks(stack, agent, agent_python, tasks, grade, eval_tasks)
        current: Path | None | str = BASE if against is None else (None if against == "base" else Path(against))
        evaluate = functools.partial(_evaluate, make_agent, grader, candidate, held_out, out, engine)
        with on_ctrl_c(f"nothing was recorded in {record.path}; run it again"):
            result = promote(
                candidate, evaluate=evaluate, tasks=held_out, history=record, out=out, current=current, alpha=alpha
            )
    for line in result.lines():
        console.print(line, highlight=False, markup=False)
    console.print(f"eval: {result.eval_path}; history: {record.path}", highlight=False, markup=False)
    if result.decision.promote:
        _export_promoted(record, export, ollama)


def _export_promoted(record: Any, export: Path | None, ollama: str | None) -> None:
    """`--export`: the model promoted now, merged, written as GGUF, verified, with its Modelfile (flowrl export)."""
    if export is None:
        return
    from flowrl.export.pipeline import ExportPipeline  # lazy: keeps `flowrl --help` fast

    promoted = record.current()
    if promoted is None:
        raise ConfigError(
            f"nothing is promoted in {record.path}: the base model serves; export it with flowrl export --model BASE"
        )
    staged, old = export.parent / f".{export.name}.new", export.parent / f".{export.name}.old"
    for leftover in (staged, old):  # of an export that was stopped
        shutil.rmtree(leftover, ignore_errors=True)
    from flowrl.quiet import quiet_libraries  # lazy: keeps `flowrl --help` fast

    try:
        with console.status(f"exporting {promoted}"), quiet_libraries(bars=False):
            result = ExportPipeline(Path(promoted), staged, ollama_name=ollama).run()
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    # the deployed folder is replaced whole, never left half-written: a failed export above left it as it was
    if export.exists():
        export.rename(old)
    staged.rename(export)
    shutil.rmtree(old, ignore_errors=True)
    gguf = export / result.gguf_path.name if result.gguf_path else None
    console.print(f"exported {promoted}: {gguf}, Modelfile {export / 'Modelfile'}", highlight=False)
    if ollama:
        done = f"registered with Ollama as {ollama}" if result.ollama_created else f"register: {result.ollama_command}"
        console.print(done, highlight=False)


def _agent_and_tasks(
    stack: contextlib.ExitStack,
    agent: str | None,
    agent_python: Path | None,
    tasks: Path | None,
    grade: str | None,
    eval_tasks: int,
) -> tuple[Any, list[Any], Any]:
    """(agent factory, held-out tasks, grade): the user's agent on every task of --tasks, or the example agent on
    --eval-tasks of its suite's held-out part."""
    if agent is None:
        if tasks is not None or grade is not None or agent_python is not None:
            raise ConfigError("--tasks, --grade and --agent-python go with --agent MODULE:FACTORY")
        example = example_agent()
        _, held_out = example.example_tasks(0, eval_tasks)
        return stack.enter_context(example.ExampleAgents()), held_out, example.example_grade
    from flowrl.improve.user import load_tasks  # lazy: keeps `flowrl --help` fast

    if tasks is None:
        raise ConfigError("--agent needs --tasks FILE: JSONL of {task_id, query, answer}, the held-out tasks")
    make_agent, grader = user_agent(agent, agent_python, grade)
    return make_agent, load_tasks(tasks), grader


def _evaluate(
    make_agent: Any, grade: Any, candidate: Path, tasks: list[Any], out: Path, engine: str, arms: dict[str, Any]
) -> Any:
    """The agent on each arm's adapter (None: the base model), greedy, through the policy server."""
    from flowrl.models import resolve_model  # lazy: keeps `flowrl --help` fast

    base = str(resolve_model(str(candidate)).path)
    models = {name: (base, adapter) for name, adapter in arms.items()}
    return agent_outcomes(make_agent, grade, tasks, models, engine=engine, store_root=out / "runs")


def _history_lines(record: Any) -> list[str]:
    entries = record.entries()
    if not entries:
        return [f"no promotion recorded in {record.path}"]
    lines = []
    for e in entries:
        f = e.figures
        figures = (
            f" (n = {f['n']}, {f['rate_current']:.1%} -> {f['rate_candidate']:.1%}, p = {f['p']:.3g})" if f else ""
        )
        lines.append(
            f"{e.time}  {e.action:<8} {e.candidate or 'the base model'}  replacing {e.replaced or 'base'}{figures}"
        )
    lines.append(f"promoted now: {record.current() or 'the base model'}")
    return lines


def register(app: typer.Typer) -> None:
    app.command("promote")(promote_cmd)
