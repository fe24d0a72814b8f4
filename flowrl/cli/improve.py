"""`flowrl improve` (the collect -> train -> eval rounds) and `flowrl eval-agent` (the agent loop on held-out
tasks, with statistics): thin over flowrl.improve and flowrl.evaluate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from flowrl.cli.common import (
    AgentPythonOption,
    GradeOption,
    example_agent,
    on_ctrl_c,
    output_folder,
    progress_bar,
    user_agent,
)
from flowrl.cli.options import config_options
from flowrl.improve.config import ImproveConfig


def _progress_ui():
    from rich.console import Console

    progress = progress_bar(Console(file=sys.stdout, soft_wrap=True))
    bars: dict[str, int] = {}

    def on_progress(stage: str, done: int, total: int) -> None:
        if stage not in bars:
            bars[stage] = progress.add_task(stage, total=total)
        progress.update(bars[stage], completed=done, total=total)
        if done >= total:
            progress.remove_task(bars.pop(stage))

    def on_stage(stage: str, summary: str) -> None:
        progress.console.print(f"[green]✓[/green] [bold]{stage:<8}[/bold] {summary}", highlight=False)

    return progress, on_progress, on_stage


@config_options(ImproveConfig)
def improve_cmd(
    out: Path = typer.Option(Path("improve-out"), "--out", "-o", help="Folder for every round (resumable)."),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="Your agent: MODULE:FACTORY (or file.py:FACTORY); FACTORY(policy) returns an agent with "
        "async a_run(query, session_id=...) or run(query) that talks to policy.base_url. Default: the example agent.",
    ),
    agent_python: Path | None = AgentPythonOption,
    tasks: Path | None = typer.Option(
        None,
        "--tasks",
        help="With --agent: JSONL of {task_id, query, answer[, family]}, split into train and held-out.",
    ),
    grade: str | None = GradeOption,
    train_tasks: int | None = typer.Option(
        None, "--train-tasks", min=1, help="Train tasks each round (default: 200; with --tasks, the rest)."
    ),
    eval_tasks: int | None = typer.Option(
        None, "--eval-tasks", min=1, help="Held-out tasks (default: 150; with --tasks, a third of them)."
    ),
    **fields: Any,
) -> None:
    """Make an agent better, round by round, and prove it on held-out tasks (eval.json per round). Every agent
    runs on the round's policy, served as an OpenAI-compatible endpoint."""
    import contextlib

    from flowrl.improve.loop import improve  # lazy: keeps `flowrl --help` fast

    progress, on_progress, on_stage = _progress_ui()
    with contextlib.ExitStack() as stack:
        cfg = ImproveConfig(out=out, **fields)  # it checks the values and names the allowed ones
        output_folder(out, "--out")
        make_agent, train, held_out, grader = _agent_and_tasks(
            stack, agent, agent_python, tasks, grade, train_tasks, eval_tasks, cfg
        )
        if cfg.from_store is not None:  # nothing is collected: no train task; with --tasks, every task is held-out
            train, held_out = [], held_out if agent is None else (held_out + train)[: eval_tasks or None]
        stack.enter_context(on_ctrl_c(f"every finished stage is kept in {out}; run the same command again to go on"))
        stack.enter_context(progress)
        results = improve(make_agent, train, held_out, grader, cfg, on_stage=on_stage, on_progress=on_progress)
    last = results[-1]
    arm = last.arms.get(f"round-{last.round}", {})
    base = last.arms.get("base", {})
    typer.echo(
        f"round {last.round}: held-out success {base.get('rate', 0):.1%} (base) -> {arm.get('rate', 0):.1%}; "
        f"eval: {last.eval_path}"
    )


def _agent_and_tasks(
    stack: Any,
    agent: str | None,
    agent_python: Path | None,
    tasks: Path | None,
    grade: str | None,
    train_tasks: int | None,
    eval_tasks: int | None,
    cfg: ImproveConfig,
) -> tuple[Any, list[Any], list[Any], Any]:
    """(factory, train tasks, held-out tasks, grade): the user's, or the example agent's."""
    from flowrl.errors import ConfigError  # lazy: keeps `flowrl --help` fast

    if agent is None:
        if tasks is not None or grade is not None or agent_python is not None:
            raise ConfigError(
                "--tasks, --grade and --agent-python go with --agent MODULE:FACTORY (the example agent has its own)"
            )
        example = example_agent()
        train, held_out = example.example_tasks(
            train_tasks or 200, eval_tasks or 150, seed=cfg.seed, hold_out=cfg.unseen_families, unseen=cfg.unseen_tasks
        )
        return stack.enter_context(example.ExampleAgents()), train, held_out, example.example_grade
    from flowrl.improve.user import load_tasks, split_tasks  # lazy: keeps `flowrl --help` fast

    if tasks is None:
        raise ConfigError("--agent needs --tasks FILE: JSONL of {task_id, query, answer}")
    train, held_out = split_tasks(
        load_tasks(tasks), train_tasks, eval_tasks, seed=cfg.seed, hold_out=cfg.unseen_families, unseen=cfg.unseen_tasks
    )
    make_agent, grader = user_agent(agent, agent_python, grade)
    return make_agent, train, held_out, grader


def register(app: typer.Typer) -> None:
    app.command("improve")(improve_cmd)
