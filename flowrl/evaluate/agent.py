"""Evaluate an agent the way it is used: its whole loop, tools executed, on held-out tasks, graded.

Any agent works: an arm is a factory that returns an agent (a fresh one per arm, with the model of that
arm behind it), `run(agent, task)` drives one task through the agent's loop and returns its answer text
(default: `await agent.a_run(task.query, session_id=...)`, FlowAgent's and the example agent's entry
point), and `grade(task, answer) -> bool` says whether the answer is right. Every arm runs the same tasks
in the same order; `concurrency` tasks run at a time (a batching backend turns that into batched
generation). Runs can be captured into a store per arm (`hook_into_agent`), so the traces of an eval are
there to read and score like any others.

The result is the eval JSON of `flowrl.evaluate.results` (per-task outcomes, per-arm rates with Wilson
intervals, paired comparisons against the base with McNemar's exact test and a bootstrap interval).

    outcomes = run_arms({"base": make_base_agent, "trained": make_trained_agent}, tasks, grade)
    data = summarize(outcomes, base="base")
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from flowrl.capture import hook_into_agent
from flowrl.store.files import TraceStore

log = logging.getLogger(__name__)


class TaskLike(Protocol):
    task_id: str
    query: str


AgentFactory = Callable[[], Any]
Runner = Callable[[Any, Any], Awaitable[str]]
Grader = Callable[[Any, str], bool]
Progress = Callable[[str, int, int], None]  # (arm, done, total)


async def default_run(agent: Any, task: TaskLike) -> str:
    """FlowAgent's entry point: `a_run(query, session_id=...)` returns the answer text."""
    result = await agent.a_run(task.query, session_id=f"eval-{task.task_id}")
    return result if isinstance(result, str) else str(result)


async def run_tasks(
    agent: Any,
    tasks: list[Any],
    grade: Grader,
    *,
    run: Runner = default_run,
    concurrency: int = 8,
    on_done: Callable[[int], None] | None = None,
) -> dict[str, bool]:
    """Every task through `agent`, `concurrency` at a time; task_id -> graded outcome. A task whose run
    raises counts as a failure (and is logged): an agent that crashes did not answer."""
    gate = asyncio.Semaphore(max(1, concurrency))
    # agents call their backends through asyncio.to_thread: the default pool (cores + 4 threads, shared with
    # tool calls) would cap how many runs reach a batching backend at once
    from concurrent.futures import ThreadPoolExecutor

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=max(4, 2 * concurrency)))
    outcomes: dict[str, bool] = {}
    done = 0

    async def one(task: Any) -> None:
        nonlocal done
        async with gate:
            try:
                answer = await run(agent, task)
                ok = bool(grade(task, answer))
            except Exception as exc:  # noqa: BLE001 - the agent's or the grader's failure is a failed task
                log.warning("flowrl eval: task %s failed to run: %s", task.task_id, exc)
                ok = False
        outcomes[task.task_id] = ok
        done += 1
        if on_done is not None:
            on_done(done)

    await asyncio.gather(*(one(t) for t in tasks))
    return {t.task_id: outcomes[t.task_id] for t in tasks}


def run_arms(
    arms: dict[str, AgentFactory],
    tasks: Iterable[Any],
    grade: Grader,
    *,
    run: Runner = default_run,
    concurrency: int = 8,
    store_root: Path | None = None,
    on_progress: Progress | None = None,
    hook_options: dict[str, Any] | None = None,
) -> dict[str, dict[str, bool]]:
    """Run every arm on the same tasks; task_id -> arm -> outcome (the input of `results.summarize`).

    With `store_root`, each arm's runs are captured into `store_root/<arm>` (one trace per run)."""
    tasks = list(tasks)
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids repeat: every task needs its own id")
    per_arm: dict[str, dict[str, bool]] = {}
    for name, factory in arms.items():
        agent = factory()
        hook = None
        if store_root is not None:
            hook = hook_into_agent(agent, store=TraceStore(Path(store_root) / name), **(hook_options or {}))
        try:
            progress = (lambda n, _name=name: on_progress(_name, n, len(tasks))) if on_progress else None
            per_arm[name] = asyncio.run(
                run_tasks(agent, tasks, grade, run=run, concurrency=concurrency, on_done=progress)
            )
        finally:
            if hook is not None:
                hook.flush()
                hook.unhook()
    return {tid: {arm: per_arm[arm][tid] for arm in arms} for tid in ids}
