"""EfficiencyReward: did the run stay within its budgets?

Reads, each against a configurable budget (a dimension is skipped when the trace does not record it):
- tool calls (`tool_calls` or the transcript's; `final_answer` not counted) vs `max_tool_calls`;
- model turns (assistant messages, else `llm_calls_count`) vs `max_turns`;
- tokens in + out (`total_tokens_in/out`; zero means "not recorded") vs `max_tokens`;
- output tokens (`total_tokens_out`, else estimated as characters / 4 of what the model wrote) vs
  `max_output_tokens`: this one also judges a fresh GRPO completion, where it acts as a length penalty;
- wall time (`execution_duration_ms`) vs `max_duration_ms`.

Each dimension scores 1 within budget and budget / used beyond it (twice the budget: 0.5). The value is
their mean, minus `repeat_penalty` for each repeated identical call (same tool, same arguments), at least 0.
None when no dimension is recorded (an empty trace).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.views import assistant_texts, assistant_turns, tool_calls
from flowrl.trace.schema import ExecutionTrace

CHARS_PER_TOKEN = 4


def within(used: float, budget: float) -> float:
    if budget <= 0:
        return 1.0 if used <= 0 else 0.0
    return 1.0 if used <= budget else budget / used


class EfficiencyReward(Reward):
    name = "efficiency"

    def __init__(
        self,
        max_tool_calls: int = 10,
        max_turns: int = 12,
        max_tokens: int = 32000,
        max_output_tokens: int = 2048,
        max_duration_ms: float = 120_000.0,
        repeat_penalty: float = 0.15,
    ) -> None:
        self.budgets = {
            "tool_calls": max_tool_calls,
            "turns": max_turns,
            "tokens": max_tokens,
            "output_tokens": max_output_tokens,
            "duration_ms": max_duration_ms,
        }
        self.repeat_penalty = repeat_penalty

    def measure(self, trace: ExecutionTrace) -> dict[str, float]:
        """What the trace used, per dimension it records."""
        used: dict[str, float] = {}
        calls = tool_calls(trace)
        turns = assistant_turns(trace)
        if calls or turns or trace.messages:
            used["tool_calls"] = len(calls)
        if turns:
            used["turns"] = turns
        tin, tout = trace.total_tokens_in or 0, trace.total_tokens_out or 0
        if tin + tout > 0:
            used["tokens"] = tin + tout
        if tout > 0:
            used["output_tokens"] = tout
        else:
            chars = sum(len(t) for t in assistant_texts(trace))
            if chars:
                used["output_tokens"] = max(1, chars // CHARS_PER_TOKEN)
        if trace.execution_duration_ms and trace.execution_duration_ms > 0:
            used["duration_ms"] = trace.execution_duration_ms
        return used

    def score(self, trace: ExecutionTrace) -> RewardResult:
        used = self.measure(trace)
        if not used:
            return RewardResult(None, {"reason": "no tool calls, turns, tokens, duration or output recorded"})
        parts = {k: round(within(v, self.budgets[k]), 4) for k, v in used.items()}
        sigs = Counter(v.signature() for v in tool_calls(trace))
        repeats = sum(n - 1 for n in sigs.values() if n > 1)
        value = sum(parts.values()) / len(parts) - self.repeat_penalty * repeats
        details: dict[str, Any] = {"used": used, "scores": parts, "repeated_calls": repeats}
        return RewardResult(max(0.0, value), details)
