"""TaskCompletionReward: did the run end normally, by its own account? Not whether the answer is right: a wrong
"12 * 7 = 94" that ends with a normal answer scores 1.0; correctness is `reference_answer` or `host_outcome`.

The run's outcome (`flowrl.trace.facts.run_outcome`, stored on the trace by capture and ingest), first match wins:
1. an error answer (`Error:`, `Error executing`, `System-Error`, after any leading `<think>` block; FlowAgent's
   `a_run` never raises, it returns that text) -> 0;
2. run `status` `max_iterations`, `cancelled`, `failed` or `error` -> 0; `running` / `paused` -> None (not finished);
3. the `final_answer` call's own `success` flag -> 1 or 0;
4. the trace's `success` (set by capture or ingest) -> 1 or 0;
5. toolboxv2 rl-module files: `tasks_completed` vs `tasks_failed` -> their share;
6. `status` `completed` with an answer -> 1.

None when none of these says anything: a plain answer with no run status (e.g. a fresh GRPO completion that
neither called `final_answer` nor returned an error). Other `error_prefixes` make a different rule for this
reward only: the outcome is then decided again with them.
"""

from __future__ import annotations

from flowrl.rewards.base import Reward, RewardResult
from flowrl.trace.facts import ERROR_PREFIXES, FAILED_STATUSES, UNFINISHED_STATUSES, compute_outcome, run_outcome
from flowrl.trace.schema import ExecutionTrace

__all__ = ["ERROR_PREFIXES", "FAILED_STATUSES", "UNFINISHED_STATUSES", "TaskCompletionReward"]


class TaskCompletionReward(Reward):
    name = "task_completion"

    def __init__(self, error_prefixes: list[str] | tuple[str, ...] = ERROR_PREFIXES) -> None:
        self.error_prefixes = tuple(error_prefixes)

    def score(self, trace: ExecutionTrace) -> RewardResult:
        if self.error_prefixes == ERROR_PREFIXES:
            outcome = run_outcome(trace)
        else:
            outcome = compute_outcome(trace, error_prefixes=self.error_prefixes)
        if outcome.source == "unfinished":
            return RewardResult(None, {"reason": f"run not finished (status {outcome.detail.get('status')})"})
        if outcome.value is None:
            return RewardResult(None, {"reason": "no success flag, run status or error answer to judge by"})
        return RewardResult(outcome.value, {"source": outcome.source, **outcome.detail})
