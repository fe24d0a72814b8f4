"""What an eval graded, published: one JSON line per held-out run, gzip-compressed, so anyone can read what the
agent answered and which tools it called, beside the eval.json whose outcomes came from those answers.

`write_runs(path, store, tasks, outcomes, arm=, session=)` reads the arm's runs from its trace store (the run of
task t has the session id `session(t)`) and writes `path` (`.jsonl.gz`) atomically, one line per task in the
order given:

    {"arm": "round-1", "task_id": "...", "family": "mulsub", "query": "...", "reference": "84", "right": true,
     "answer": "12 * 7 = 84", "tool_calls": [{"name": "exec_code", "arguments": {...}, "result": "...",
     "failed": false}], "status": "completed"}

`answer` is the text the grade read (`flowrl.trace.facts.answer_text`); a tool result longer than
`RESULT_CHARS` is cut there. A task whose run left no trace (the hook dropped it) has `"answer": null` and no
calls; its outcome is what the grade said of the answer it was given. Traces are redacted as they are written,
so nothing here is more than the store holds. `read_runs(path)` reads a file back.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flowrl.store.files import TraceStore, atomic_write_bytes
from flowrl.trace.facts import answer_text, tool_calls

__all__ = ["RESULT_CHARS", "read_runs", "write_runs"]

RESULT_CHARS = 2000


def write_runs(
    path: Path,
    store: Path,
    tasks: list[Any],
    outcomes: dict[str, bool],
    *,
    arm: str,
    session: Callable[[Any], str],
) -> int:
    """One line per task of `tasks` (see the module doc); the number of lines with a run."""
    by_session: dict[str, Any] = {}  # session id -> its trace
    if Path(store).is_dir():
        for stored in TraceStore(store).iter_traces():
            by_session[stored.session_id] = stored
    buffer = io.BytesIO()
    found = 0
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as out:
        for task in tasks:
            trace = by_session.get(session(task))
            found += trace is not None
            line = {
                "arm": arm,
                "task_id": task.task_id,
                "family": getattr(task, "family", None) or None,
                "query": task.query,
                "reference": task.answer,
                "right": bool(outcomes.get(task.task_id, False)),
                "answer": None if trace is None else answer_text(trace),
                "tool_calls": [] if trace is None else [_call(c) for c in tool_calls(trace)],
                "status": None if trace is None else trace.status,
            }
            out.write((json.dumps(line, ensure_ascii=False, default=str) + "\n").encode("utf-8"))
    atomic_write_bytes(Path(path), buffer.getvalue())
    return found


def read_runs(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a file `write_runs` wrote."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _call(call: Any) -> dict[str, Any]:
    result = call.result
    if result is not None and len(result) > RESULT_CHARS:
        result = result[:RESULT_CHARS] + f"... [{len(result) - RESULT_CHARS} more characters]"
    return {"name": call.name, "arguments": call.arguments, "result": result, "failed": call.failed}
