"""GroundingReward: does the run use only what it was given or found, and does its answer say what its tools found?

A reference-free check for tool-using agents, on where the run's values came from. Known before a tool call: the
numbers in the user's query and in every earlier tool result. The run is judged 0.0 when
- `unfounded_input`: a number written inside a tool call's text arguments (code, an expression, a search string;
  `final_answer` is the answer, not a tool) is in neither, e.g. a copied example's `print(2 + 3)` for "the atomic
  number of thallium";
- `unfounded_answer`: the run had tools (offered, as capture records them in `tools`, or called) and a number in
  the answer is in neither: the agent stated a number it never computed or looked up ("7936 - 2133 = 1188" with
  a calculator at hand and no call to it). A run without tools is not questioned on its numbers;
- `ignores_tool`: a tool call worked and returned a value (the result itself, or a dict result's `output`,
  `result`, `value` or `answer` field, as FlowAgent's `exec_code` gives it), and the answer does not carry that
  value of the last such call as a whole word or number (the `reference_answer` reward's own match,
  `flowrl.rewards.reference.answer_matches`).

1.0 when at least one of these could be checked and none failed. None (cannot judge, never 0) when there is no
answer, or no tool value, number in the answer, or number in a tool's text arguments to check. Numbers are
compared as values ("5.0" is 5; "1,024" is 1024); numeric-typed arguments (`{"top_k": 5}`) are settings, not data,
and are not checked.

It says nothing about whether the tool was asked the right thing: a run that computed the wrong expression from
the query's numbers and reported the result faithfully is grounded; and an answer that states a number the model
knew by heart (7 days in a week) is not. It is no correctness reward, and is off in the default engine: the
learned reward reads it as a feature, and `flowrl improve --from-store` uses it to question a host's "right"
(docs/training.md, "Host outcomes are checked against the run").
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.reference import THOUSANDS, answer_matches
from flowrl.rewards.views import answer_text, tool_calls
from flowrl.trace.schema import ExecutionTrace

VALUE_KEYS = ("output", "result", "value", "answer")
MAX_PARSED_CHARS = 20_000  # a longer dict text is not parsed (its value would be too long to repeat anyway)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")  # unsigned: "5 - 3" and "-3" both read 3


def numbers(text: Any) -> set[float]:
    """The numbers written in `text`, as values (thousands separators dropped; digits inside words ignored)."""
    clean = THOUSANDS.sub("", str(text or ""))
    return {float(n) for n in _NUMBER.findall(clean)}


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


def _texts(arguments: Any) -> Iterator[str]:
    """The text values inside a tool call's arguments (a raw argument string is one text)."""
    if isinstance(arguments, str):
        yield arguments
    elif isinstance(arguments, dict):
        for value in arguments.values():
            yield from _texts(value)
    elif isinstance(arguments, list | tuple):
        for value in arguments:
            yield from _texts(value)


class GroundingReward(Reward):
    name = "grounding"

    def __init__(self, max_value_chars: int = 200) -> None:
        self.max_value_chars = max_value_chars

    def score(self, trace: ExecutionTrace) -> RewardResult:
        answer = answer_text(trace)
        if not answer.strip():
            return RewardResult(None, {"reason": "no answer"})
        known = numbers(trace.user_query)
        checked = 0
        last_value: str | None = None
        for call in tool_calls(trace):
            used = set().union(*(numbers(t) for t in _texts(call.arguments)))
            if used - known:
                return self._failed("unfounded_input", tool=call.name, number=min(used - known))
            checked += bool(used)
            if call.failed is False:
                known |= numbers(call.result)
                value = tool_value(call.result)  # an empty or long value (a document) is not one to repeat
                last_value = value if value and len(value) <= self.max_value_chars else None
        # an agent that had tools and states a number it was neither given nor found is guessing; an agent without
        # tools (a plain chat model) can only answer from what it knows, so its numbers are not questioned
        stated = numbers(answer) if (trace.tools or trace.tool_calls) else set()
        if stated - known:
            return self._failed("unfounded_answer", number=min(stated - known))
        checked += bool(stated)
        if last_value is not None:
            if not answer_matches(last_value, answer):
                return self._failed("ignores_tool", value=last_value[:80])
            checked += 1
        if not checked:
            return RewardResult(None, {"reason": "no tool value or number to check"})
        return RewardResult(1.0, {"checked": checked})

    @staticmethod
    def _failed(failure: str, **details: Any) -> RewardResult:
        return RewardResult(0.0, {"failed": failure, **details})
