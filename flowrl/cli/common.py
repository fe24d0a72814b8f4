"""Helpers shared by the CLI's command modules: store resolution, console, summaries."""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import typer
from rich.console import Console

from flowrl.errors import ConfigError
from flowrl.store.files import ReadProblem, TraceStore
from flowrl.store.opener import open_store as open_any_store

if TYPE_CHECKING:
    from rich.progress import Progress

    from flowrl.store.segments.store import SegmentStore

# `--agent example` in `flowrl improve`, `train` and `eval`: the example agent is named, as a user's agent is,
# and imported when a command runs it. Only `flowrl demo` imports flowrl.demo (pyproject's import contracts).
EXAMPLE_AGENT = "flowrl.demo.example_agents"


def example_agent() -> ModuleType:
    """The example agent's module: `ExampleAgents`, `example_tasks`, `example_grade`, `example_adapter`."""
    return importlib.import_module(EXAMPLE_AGENT)


console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

StoreOption = typer.Option(
    None,
    "--store",
    help=(
        "Trace store: a folder, or a URL such as s3://bucket/prefix for columnar segments "
        "(default: $FLOWRL_HOME/traces, else toolboxv2's rl_traces, else ~/.local/share/flowrl/traces)."
    ),
)

GradeOption = typer.Option(
    None,
    "--grade",
    help="MODULE:FN, FN(task, answer) -> bool. Default: the answer occurs as a whole word or number, unhedged.",
)
AgentPythonOption = typer.Option(
    None,
    "--agent-python",
    help="With --agent: the Python of your agent's own venv (flowrl installed there, no extras); the agent is "
    "built, hooked and run there, the loop and training here. Default: this Python.",
)


def open_store(store: Path | str | None, *, missing_ok: bool = False) -> Any:
    """The store `--store` names (`flowrl.store.opener.open_store`): a `TraceStore` for a folder of per-trace JSON,
    a `SegmentStore` for a URL or a folder holding `segments/`. Typed `Any`: both have the API commands use.

    A local folder that does not exist is an error for a command that reads (it would look like an empty store),
    unless it may be missing (`missing_ok`: ingest, watch and the OTLP receiver create it)."""
    opened = open_any_store(store)
    root = getattr(opened, "root", None)
    if not missing_ok and isinstance(root, Path) and not root.exists():
        raise ConfigError(
            f"no trace store at {root}: check --store, or put traces there first "
            "(hook_into_agent, or `flowrl ingest PATH --store ...`)"
        )
    return opened


def output_folder(path: Path, flag: str, *, keep: bool = True) -> Path:
    """`path`, made as the folder a command writes into, before any work: a path through a file
    (`garbage.json/out`), or one that cannot be made (`/proc/nope`, no permission), stops in one line naming it.
    `keep=False` only tries: the folders it made are removed again (for a command that may still refuse)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: that is a file, not a folder: choose another path")
    missing = [p for p in [path, *path.parents] if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{flag} {path}: cannot make that folder ({reason}): choose a folder you can write") from exc
    if not keep:
        for made in missing:  # deepest first; each is still empty
            made.rmdir()
    return path


@contextlib.contextmanager
def on_ctrl_c(what_is_kept: str) -> Iterator[None]:
    """Ctrl-C inside: one line on stderr saying what was kept and how to go on, then exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        err_console.print(f"flowrl: interrupted: {what_is_kept}", highlight=False, markup=False)
        raise typer.Exit(130) from None


def report_problems(source: TraceStore | SegmentStore | Iterable[ReadProblem]) -> None:
    """Name every unreadable file one operation skipped, one line each, on stderr: those of a
    `store.operation()` record, or, given the store, of its latest operation."""
    problems = getattr(source, "problems", None)
    for problem in cast("Iterable[ReadProblem]", problems if problems is not None else source):
        err_console.print(f"[yellow]skipped[/yellow] {problem.message}", markup=True, highlight=False)


def progress_bar(console: Console, text: str = "[bold]{task.description}", *, remaining: bool = False) -> Progress:
    """The commands' transient progress bar: `text`, the bar, done/total and the time taken (and the time left,
    `remaining`), drawn on `console`."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn(text), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, transient=True)


def user_agent(agent: str, agent_python: Path | None, grade: str | None) -> tuple[Any, Any]:
    """(agent factory, grade) of `--agent MODULE:FACTORY [--agent-python PY] [--grade MODULE:FN]`, as `flowrl
    improve` and `flowrl promote` take them: FACTORY(policy) returns the agent; with `--agent-python` it is built and
    run in that Python; the grade defaults to the strict reference answer's."""
    from flowrl.improve.user import default_grade, load_object  # lazy: keeps `flowrl --help` fast

    grader = load_object(grade, "--grade") if grade else default_grade
    if agent_python is not None:
        from flowrl.improve.process import AgentProcess  # lazy: keeps `flowrl --help` fast

        return AgentProcess(agent, agent_python), grader
    return load_object(agent, "--agent"), grader


def agent_outcomes(
    make_agent: Any,
    grade: Any,
    tasks: list[Any],
    arms: dict[str, tuple[str, Path | None]],
    *,
    engine: str,
    store_root: Path,
    concurrency: int | None = None,
) -> dict[str, dict[str, bool]]:
    """task_id -> arm -> graded right, for each arm (name -> (base model, LoRA adapter or None)) run greedily by
    `make_agent(policy)` on `tasks` through a policy server (one per base model), the runs kept under `store_root`."""
    from flowrl.evaluate.agent import run_arms  # lazy: keeps `flowrl --help` fast
    from flowrl.serve.policies import PolicyServer  # lazy: keeps `flowrl --help` fast

    outcomes: dict[str, dict[str, bool]] = {}
    for base in dict.fromkeys(model for model, _ in arms.values()):
        with PolicyServer(str(base), engine=engine) as server:
            for name, (model, adapter) in arms.items():
                if model != base:
                    continue
                policy = server.policy(name, adapter, temperature=0.0, seed=0)
                got = run_arms(
                    {name: functools.partial(make_agent, policy)},
                    tasks,
                    grade,
                    concurrency=concurrency or server.slots,
                    store_root=store_root,
                )
                for task_id, arm in got.items():
                    outcomes.setdefault(task_id, {}).update(arm)
    return outcomes
