"""`flowrl promote`: put a candidate adapter in front of users only when it is proven better than what is promoted
now; `--list` shows the history, `--rollback` undoes the last promotion. Thin over flowrl.promote."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import typer

from flowrl.cli.common import StoreOption, console, example_agent, on_ctrl_c, output_folder
from flowrl.errors import ConfigError


def promote_cmd(  # noqa: PLR0913  # a typer command: one parameter per option
    candidate: Path | None = typer.Argument(None, help="The adapter folder to promote (a round's adapter)."),
    against: str | None = typer.Option(
        None, "--against", help="The model to beat: an adapter folder, or `base` (default: what is promoted now)."
    ),
    eval_tasks: int = typer.Option(150, "--eval-tasks", min=1, help="Held-out tasks of the example agent's suite."),
    alpha: float = typer.Option(0.05, "--alpha", help="McNemar's level: promote only below it."),
    store: Path | None = StoreOption,
    history: Path | None = typer.Option(
        None, "--history", help="The promotions record (default: promotions.jsonl beside the store)."
    ),
    out: Path = typer.Option(Path("promote-out"), "--out", help="Folder for the eval and its runs."),
    engine: str = typer.Option("auto", "--engine", help="The policy server's engine."),
    list_: bool = typer.Option(False, "--list", help="Show the history with each entry's figures."),
    rollback: bool = typer.Option(False, "--rollback", help="Restore the model promoted before the current one."),
) -> None:
    """Promote CANDIDATE only if the example agent on it beats the model promoted now on held-out tasks (McNemar
    p < --alpha and the difference's 95% interval above 0); record every decision in promotions.jsonl."""
    from flowrl.promote import History  # lazy: keeps `flowrl --help` fast
    from flowrl.promote.history import FILE_NAME  # lazy: keeps `flowrl --help` fast
    from flowrl.store.files import default_root  # lazy: keeps `flowrl --help` fast

    record = History(history or (Path(store) if store is not None else default_root()).parent / FILE_NAME)
    if list_ or rollback:
        if candidate is not None:
            raise ConfigError("--list and --rollback take no CANDIDATE")
        if rollback:
            undone, restored = record.rollback()
            console.print(f"rolled back {undone}; promoted now: {restored or 'the base model'}", highlight=False)
            return
        for line in _history_lines(record):
            console.print(line, highlight=False, markup=False)
        return
    if candidate is None:
        raise ConfigError("give the CANDIDATE adapter folder (or --list, --rollback)")
    output_folder(out, "--out")
    from flowrl.promote.run import BASE, promote  # lazy: keeps `flowrl --help` fast

    example = example_agent()
    _, tasks = example.example_tasks(0, eval_tasks)
    current: Path | None | str = BASE if against is None else (None if against == "base" else Path(against))
    evaluate = functools.partial(_evaluate_example, candidate, tasks, out, engine)
    with on_ctrl_c(f"nothing was recorded in {record.path}; run it again"):
        result = promote(
            candidate, evaluate=evaluate, tasks=tasks, history=record, out=out, current=current, alpha=alpha
        )
    for line in result.lines():
        console.print(line, highlight=False, markup=False)
    console.print(f"eval: {result.eval_path}; history: {record.path}", highlight=False, markup=False)


def _evaluate_example(candidate: Path, tasks: list[Any], out: Path, engine: str, arms: dict[str, Path | None]) -> Any:
    """The example agent on each arm's adapter (None: the base model), greedy, through the policy server."""
    from flowrl.evaluate.agent import run_arms  # lazy: keeps `flowrl --help` fast
    from flowrl.models import resolve_model  # lazy: keeps `flowrl --help` fast
    from flowrl.serve.policies import PolicyServer  # lazy: keeps `flowrl --help` fast

    example = example_agent()
    base = resolve_model(str(candidate)).path
    outcomes: dict[str, dict[str, bool]] = {}
    with PolicyServer(str(base), engine=engine) as server, example.ExampleAgents() as agents:
        for name, adapter in arms.items():
            policy = server.policy(name, adapter, temperature=0.0, seed=0)
            got = run_arms(
                {name: functools.partial(agents, policy)},
                tasks,
                example.example_grade,
                concurrency=server.slots,
                store_root=out / "runs",
            )
            for task_id, arm in got.items():
                outcomes.setdefault(task_id, {}).update(arm)
    return outcomes


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
