"""TaskCompletionReward: did the run finish the task?

Reads, first match wins (reference §7):
1. an error answer (`final_response` starting with `Error:`, after any leading `<think>` block; FlowAgent's
   `a_run` never raises, it returns that text) -> 0;
2. run `status` `max_iterations` or `cancelled` -> 0; `running` / `paused` -> None (not finished);
3. the `final_answer` call's own `success` flag -> 1 or 0;
4. the trace's `success` (set by capture or ingest) -> 1 or 0;
5. toolboxv2 rl-module files: `tasks_completed` vs `tasks_failed` -> their share;
6. `status` `completed` with an answer -> 1.

None when none of these says anything: a plain answer with no run status (e.g. a fresh GRPO completion that
neither called `final_answer` nor returned an error).
"""

from __future__ import annotations

import re
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.views import answer_text, final_answer_call
from flowrl.schema import ExecutionTrace

ERROR_PREFIXES = ("Error:", "Error executing", "System-Error")
FAILED_STATUSES = frozenset({"max_iterations", "cancelled", "canceled", "failed", "error"})
UNFINISHED_STATUSES = frozenset({"running", "paused", "learning"})
_LEADING_REASONING = re.compile(r"^\s*<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


class TaskCompletionReward(Reward):
    name = "task_completion"

    def __init__(self, error_prefixes: list[str] | tuple[str, ...] = ERROR_PREFIXES) -> None:
        self.error_prefixes = tuple(error_prefixes)

    def score(self, trace: ExecutionTrace) -> RewardResult:
        answer = _LEADING_REASONING.sub("", answer_text(trace)).lstrip()
        status = (trace.status or "").lower() or None
        if answer.startswith(self.error_prefixes):
            return RewardResult(0.0, {"source": "error_answer", "answer_head": answer[:120]})
        if status in FAILED_STATUSES:
            return RewardResult(0.0, {"source": "status", "status": status})
        if status in UNFINISHED_STATUSES:
            return RewardResult(None, {"reason": f"run not finished (status {status})"})
        fa = final_answer_call(trace)
        if fa is not None and _flag(fa.get("success")) is not None:
            return RewardResult(1.0 if _flag(fa["success"]) else 0.0, {"source": "final_answer.success"})
        if trace.success is not None:
            return RewardResult(1.0 if trace.success else 0.0, {"source": "trace.success"})
        done, failed = len(trace.tasks_completed), len(trace.tasks_failed)
        if done or failed:
            return RewardResult(done / (done + failed), {"source": "tasks", "completed": done, "failed": failed})
        if status == "completed" and answer:
            return RewardResult(1.0, {"source": "status", "status": status})
        return RewardResult(None, {"reason": "no success flag, run status or error answer to judge by"})
