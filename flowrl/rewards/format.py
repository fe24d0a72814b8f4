"""FormatComplianceReward: is the answer clean, and is the tool-call JSON valid?

Checks (each passes or fails; the value is the share that pass):
- `non_empty`: the answer (`final_response`, else the `final_answer` call's answer, else the last assistant
  text) is not blank. A blank answer scores 0 whatever else passes;
- `no_leaked_tags`: no reasoning or chat-template markup in the answer outside code: `<think>`,
  `<thinking>`, `<reasoning>`, `<|im_start|>`-style special tokens, `[INST]`;
- `no_raw_tool_markup`: no tool-call syntax in the answer (`<tool_call>`, `<function=…>`, `[TOOL_CALLS]`,
  `<|python_tag|>`, `{"name": …, "arguments": …}`), which means the model wrote a call as text instead of
  making it;
- `json_arguments`: the share of tool calls in the transcript whose arguments are a JSON object.

None when there is neither an answer nor a tool call to look at, e.g. a completion turn that only made tool
calls is judged on its JSON alone, and an empty trace is not judged.
"""

from __future__ import annotations

import re
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.syntax import check_json_object
from flowrl.rewards.views import answer_text, message_tool_calls, strip_code, tool_calls
from flowrl.schema import ExecutionTrace

LEAK_TAGS = ("think", "thinking", "reasoning", "reflection", "scratchpad", "analysis")
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]{2,40}\|>|\[/?INST\]|<<SYS>>|</?s>")
_TOOL_MARKUP = re.compile(
    r"</?tool_call>|</?tool_calls>|</?function_calls?>|<function=[\w.\-]+>|</?tool_response>|\[TOOL_CALLS\]"
    r"|<\|python_tag\|>|<\|tool_call[a-z_]*\|>"
    r"""|\{\s*"name"\s*:\s*"[\w.\-]+"\s*,\s*"(arguments|parameters)"\s*:""",
    re.IGNORECASE,
)


def _ends_with_tool_call(trace: ExecutionTrace) -> bool:
    """The transcript's last word is the model asking for a tool: that turn has no answer to judge."""
    for msg in reversed(trace.messages):
        if isinstance(msg, dict) and msg.get("role") in ("assistant", "tool"):
            calls = (msg.get("tool_calls") or []) if msg.get("role") == "assistant" else []
            names = {(c.get("function") or {}).get("name") for c in calls if isinstance(c, dict)}
            return bool(calls) and "final_answer" not in names
    return False


class FormatComplianceReward(Reward):
    name = "format"

    def __init__(self, leak_tags: list[str] | tuple[str, ...] = LEAK_TAGS, allow_tags: list[str] | tuple[str, ...] = ()) -> None:
        tags = [t for t in leak_tags if t not in set(allow_tags)]
        alternatives = "|".join(map(re.escape, tags))
        self._leak = re.compile(rf"</?({alternatives})\b[^>]*>", re.IGNORECASE) if tags else None

    def score(self, trace: ExecutionTrace) -> RewardResult:
        answer = answer_text(trace)
        calls = tool_calls(trace)
        raw_args = [fn.get("arguments") for fn, _ in message_tool_calls(trace)]
        raw_args = [a for a in raw_args if isinstance(a, str)]
        if not answer.strip() and not calls and not raw_args:
            return RewardResult(None, {"reason": "no answer and no tool calls to check"})

        checks: dict[str, float] = {}
        found: dict[str, Any] = {}
        only_calls = not answer.strip() and _ends_with_tool_call(trace)
        if not only_calls:
            checks["non_empty"] = 1.0 if answer.strip() else 0.0
            prose = strip_code(answer)
            markup = sorted({m.group(0) for m in _TOOL_MARKUP.finditer(prose)})
            leaks = sorted(({m.group(0) for m in (self._leak.finditer(prose) if self._leak else ())}
                            | {m.group(0) for m in _SPECIAL_TOKEN.finditer(prose)}) - set(markup))
            checks["no_leaked_tags"] = 0.0 if leaks else 1.0
            checks["no_raw_tool_markup"] = 0.0 if markup else 1.0
            if leaks:
                found["leaked_tags"] = leaks[:10]
            if markup:
                found["raw_tool_markup"] = markup[:10]
        if raw_args:
            bad = [a[:80] for a in raw_args if check_json_object(a) is not None]
            checks["json_arguments"] = 1 - len(bad) / len(raw_args)
            if bad:
                found["invalid_arguments"] = bad[:5]
        elif any(isinstance(c.arguments, str) and c.arguments.strip() for c in calls):
            strs = [c.arguments for c in calls if isinstance(c.arguments, str)]
            bad = [a[:80] for a in strs if check_json_object(a) is not None]
            checks["json_arguments"] = 1 - len(bad) / len(strs)
            if bad:
                found["invalid_arguments"] = bad[:5]

        details: dict[str, Any] = {"checks": checks, **found}
        if checks.get("non_empty") == 0.0:
            return RewardResult(0.0, details)
        return RewardResult(sum(checks.values()) / len(checks), details)
