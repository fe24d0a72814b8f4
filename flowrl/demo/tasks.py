"""The example agent's tasks: each has a checkable answer, so good and bad traces can be told apart."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flowrl.rewards.reference import answer_matches
from flowrl.store.files import TraceStore
from flowrl.trace.facts import query_key

__all__ = ["BY_QUERY", "TASKS", "Task", "annotate", "answer_matches"]


@dataclass(frozen=True)
class Task:
    task_id: str
    query: str
    answer: str
    kind: str  # calc | lookup | weather


TASKS: tuple[Task, ...] = (
    Task("add-45-38", "What is 45 + 38?", "83", "calc"),
    Task("mul-12-7", "What is 12 * 7?", "84", "calc"),
    Task("sub-100-37", "What is 100 - 37?", "63", "calc"),
    Task("sq-9", "What is 9 squared?", "81", "calc"),
    Task("add-15-27", "What is 15 + 27?", "42", "calc"),
    Task("mul-6-8", "What is 6 * 8?", "48", "calc"),
    Task("cap-france", "What is the capital of France?", "Paris", "lookup"),
    Task("cap-japan", "What is the capital of Japan?", "Tokyo", "lookup"),
    Task("boil-water", "At what temperature in Celsius does water boil?", "100", "lookup"),
    Task("week-days", "How many days are in a week?", "7", "lookup"),
    Task("weather-berlin", "What is the weather in Berlin?", "sunny", "weather"),
    Task("weather-rome", "What is the weather in Rome?", "cloudy", "weather"),
)

BY_QUERY = {t.query: t for t in TASKS}


def annotate(store: TraceStore, tasks: Iterable[Task] | None = None, **filters: Any) -> int:
    """The host knows each task's answer: record it on its traces (`metadata.reference_answer`, which the
    reference_answer reward reads), group them by task, and clear old scores so they are scored again.
    `tasks`: the tasks to know (default: the hand-written `TASKS`; `annotate(store, suite())` for the generated
    suite of flowrl/demo/suite.py); a trace is a task's when its user turn is the task's query, as a task key
    (`flowrl.trace.facts.query_key`: case and trailing '?' ignored). Traces already annotated are left alone.
    Returns how many were updated."""
    by_key = {query_key(t.query): t for t in (TASKS if tasks is None else tasks)}
    n = 0
    for trace in store.iter_traces(**filters):
        task = by_key.get(query_key(trace.user_query))
        if task is None or trace.metadata.get("reference_answer") == task.answer:
            continue
        trace.metadata["reference_answer"] = task.answer
        trace.group_key = task.task_id
        trace.rewards, trace.reward_score = {}, None
        store.update(trace)
        n += 1
    return n
