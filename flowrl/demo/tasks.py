"""The example agent's tasks: each has a checkable answer, so good and bad traces can be told apart."""

from __future__ import annotations

import re
from dataclasses import dataclass


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


def answer_matches(expected: str, answer: str) -> bool:
    """The expected answer appears in the answer as a whole word or number (case-insensitive)."""
    pattern = r"(?<![\w.])" + re.escape(expected.lower()) + r"(?![\w])"
    return re.search(pattern, (answer or "").lower()) is not None
