"""What `flowrl improve --agent MODULE:FACTORY --tasks FILE [--grade MODULE:FN]` reads: the user's own agent.

* `FILE`: JSONL, one task a line, `{"task_id": ..., "query": ..., "answer": ...}` (ids unique, strings).
* `split_tasks`: held-out and train tasks with no overlap, by a seeded hash of each task id, so the split does
  not depend on the file's order and a task never moves between them when others are added.
* `default_grade`: the `reference_answer` reward's strict rule (`flowrl.rewards.reference.answer_matches`).
* `load_object("pkg.module:name")` or `"path/to/file.py:name"`: the factory (`factory(policy) -> agent`, the agent
  with `async a_run(query, session_id=...)` or `run(query)`) and the grade (`grade(task, answer) -> bool`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.improve.config import UNSEEN_TASKS
from flowrl.rewards.reference import answer_matches


@dataclass(frozen=True)
class Task:
    task_id: str
    query: str
    answer: str
    family: str = ""  # the kind of task ("mulsub", "capital"): eval reports each apart; --hold-out-families


def load_tasks(path: str | Path) -> list[Task]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--tasks {path}: cannot be read ({exc})") from exc
    tasks: list[Task] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc}): one task a line, {{task_id, query, answer}}") from exc
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("task_id", "query", "answer")):
            raise ConfigError(f"{path}:{n}: a task needs task_id, query and answer, each a string")
        if not isinstance(row.get("family", ""), str):
            raise ConfigError(f"{path}:{n}: family must be a string (the kind of task), got {row['family']!r}")
        if row["task_id"] in seen:
            raise ConfigError(f"{path}:{n}: task_id {row['task_id']!r} repeats: every task needs its own id")
        seen.add(row["task_id"])
        tasks.append(Task(row["task_id"], row["query"], row["answer"], row.get("family", "")))
    if not tasks:
        raise ConfigError(f"--tasks {path}: no tasks in it")
    return tasks


def split_tasks(
    tasks: list[Task],
    train: int | None,
    held_out: int | None,
    seed: int = 0,
    *,
    hold_out: Collection[str] = (),
    unseen: int = UNSEEN_TASKS,
) -> tuple[list[Task], list[Task]]:
    """(train, held-out). `held_out` defaults to a third of the tasks, `train` to the rest; families in `hold_out`
    leave training (`hold_out_families`)."""
    ordered = sorted(tasks, key=lambda t: hashlib.sha256(f"{seed}:{t.task_id}".encode()).hexdigest())
    n_eval = held_out if held_out is not None else max(1, len(tasks) // 3)
    rest, held = hold_out_families(ordered[n_eval:], ordered[:n_eval], hold_out, unseen)
    n_train = train if train is not None else len(rest)
    if n_eval < 1 or n_train < 1 or n_train > len(rest):
        raise ConfigError(
            f"--train-tasks {n_train} and --eval-tasks {n_eval}: the file has {len(tasks)} tasks"
            + (f" ({len(tasks) - n_eval - len(rest)} of held-out families)" if hold_out else "")
            + ", and each side needs at least one, with no task in both"
        )
    return rest[:n_train], held


def hold_out_families(
    train: list[Any], held_out: list[Any], families: Collection[str], unseen: int = UNSEEN_TASKS
) -> tuple[list[Any], list[Any]]:
    """(train, held-out) with every task of `families` out of training. Up to `unseen` of those tasks (in the order
    of `train`, taken from each family in turn) join the held-out set after the tasks it had, so eval reports the
    families never trained on apart (`Task.family`). An unknown family is refused with the known ones named."""
    wanted = {f.strip() for f in families if f.strip()}
    if not wanted:
        return list(train), list(held_out)
    known = {t.family for t in [*train, *held_out] if getattr(t, "family", "")}
    if wanted - known:
        raise ConfigError(
            f"--hold-out-families {','.join(sorted(wanted - known))}: no task has that family; the tasks have "
            + (", ".join(sorted(known)) if known else "none (give each task a family in the tasks file)")
        )
    kept = [t for t in train if t.family not in wanted]
    queues = {f: [t for t in train if t.family == f] for f in sorted(wanted)}
    extra: list[Any] = []
    while len(extra) < unseen and any(queues.values()):
        for f in sorted(wanted):
            if queues[f] and len(extra) < unseen:
                extra.append(queues[f].pop(0))
    return kept, list(held_out) + extra


def default_grade(task: Any, answer: str) -> bool:
    """The reference answer occurs in `answer` as a whole word or number, and the answer commits to it: the
    `reference_answer` reward's rule (`flowrl.rewards.reference.answer_matches`)."""
    return answer_matches(str(task.answer), str(answer))


def load_object(spec: str, what: str) -> Any:
    """`module:name` (a module importable from here or the current folder) or `file.py:name`."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"{what} {spec!r}: use MODULE:NAME (e.g. my_agent:make_agent) or path/to/file.py:NAME")
    try:
        if module_name.endswith(".py"):  # its folder goes on the path, so its own sibling imports work too
            path = Path(module_name).resolve()
            if not path.is_file():
                raise ConfigError(f"{what} {spec!r}: {path} is not a Python file")
            if str(path.parent) not in sys.path:
                sys.path.insert(0, str(path.parent))
            module_name = path.stem
            module = importlib.import_module(module_name)
            origin = Path(getattr(module, "__file__", None) or "<built in>")
            if origin.resolve() != path:  # imported by its bare name: another module of that name came first
                raise ConfigError(
                    f"{what} {spec!r}: the module {module_name} here is {origin}, not {path}: rename {path.name}, "
                    "or give it as MODULE:NAME from a package"
                )
        else:
            if str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} {spec!r}: cannot import {module_name} ({exc})") from exc
    found = getattr(module, name, None)
    if not callable(found):
        raise ConfigError(f"{what} {spec!r}: {module_name} has no callable {name!r}")
    return found
