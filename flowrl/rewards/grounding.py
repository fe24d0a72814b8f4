"""GroundingReward: does the answer carry what the agent's tools returned?

A reference-free check for tool-using agents. The agent called a tool to find or compute something; a right
answer usually says what the tool gave back. The value is judged on the last tool call (not `final_answer`)
that returned something without failing:
- its value is the result itself, or, for a result that is a dict (or a dict's text, as FlowAgent's `exec_code`
  returns it), its `output`, `result`, `value` or `answer` field;
- 1.0 when that value appears in the answer as a whole word or number (the `reference_answer` reward's own
  match: `flowrl.rewards.reference.answer_matches`), else 0.0.

None (cannot judge, never 0) when no tool call returned a value, the value is empty or longer than
`max_value_chars` (a document is not something an answer repeats), or there is no answer.

It says nothing about whether the tool was asked the right thing: a run that computed the wrong expression and
reported its result faithfully is grounded. It is no correctness reward, and is off in the default engine; the
learned reward reads it as a feature, and `flowrl improve --from-store` uses it to question a host's "right"
(docs/production.md).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.reference import answer_matches
from flowrl.rewards.views import answer_text, tool_calls
from flowrl.trace.schema import ExecutionTrace

VALUE_KEYS = ("output", "result", "value", "answer")
MAX_PARSED_CHARS = 20_000  # a longer dict text is not parsed (its value would be too long to repeat anyway)


def tool_value(result: str | None) -> str | None:
    """What a tool call returned, as an answer would repeat it: a dict result's value field, else the text."""
    if result is None:
        return None
    text = str(result).strip()
    if text.startswith("{") and text.endswith("}") and len(text) <= MAX_PARSED_CHARS:
        parsed: Any = None
        for parse in (json.loads, ast.literal_eval):
            try:
                parsed = parse(text)
                break
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
        if isinstance(parsed, dict):
            found = next((parsed[k] for k in VALUE_KEYS if parsed.get(k) not in (None, "")), None)
            return None if found is None else str(found).strip()
    return text


class GroundingReward(Reward):
    name = "grounding"

    def __init__(self, max_value_chars: int = 200) -> None:
        self.max_value_chars = max_value_chars

    def score(self, trace: ExecutionTrace) -> RewardResult:
        answer = answer_text(trace)
        if not answer.strip():
            return RewardResult(None, {"reason": "no answer"})
        returned = [v for v in tool_calls(trace) if v.failed is False]
        if not returned:
            return RewardResult(None, {"reason": "no tool call returned a value"})
        last = returned[-1]
        value = tool_value(last.result)
        if not value or len(value) > self.max_value_chars:
            reason = "the last tool's value is empty or too long to repeat"
            return RewardResult(None, {"reason": reason, "tool": last.name})
        grounded = answer_matches(value, answer)
        return RewardResult(1.0 if grounded else 0.0, {"tool": last.name, "value": value[:80]})
