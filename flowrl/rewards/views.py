"""Read-only views of a trace that several rewards share.

A trace may carry its tool calls in `tool_calls` (capture, ingest, toolboxv2 rl files), in `messages`
(OpenAI-format transcript; what a fresh GRPO completion gives), or in both. These helpers give one answer
either way, so each reward reads the same facts: the tool calls with their results, the final answer and
its success flag, the code the agent wrote.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flowrl.schema import ExecutionTrace, result_is_failure

# Tools that steer the agent loop rather than act on the world: not "tool calls" for success or budgets.
CONTROL_TOOLS: frozenset[str] = frozenset({"final_answer"})

_DICT_FAILURE = re.compile(r"""["']success["']\s*:\s*(False|false)\b""")
_DICT_ERROR = re.compile(r"""^\{\s*["']error["']\s*:\s*["']""")  # TRL's tool loop: {'error': '...'}
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.\-]*)[^\n]*\n(.*?)```", re.DOTALL)


@dataclass
class ToolCallView:
    """One tool call as the rewards see it, whichever field of the trace it came from."""

    name: str
    arguments: Any  # a dict when parsed, the raw string otherwise
    raw_arguments: str | None  # the JSON text the model wrote, when the transcript has it
    result: str | None  # None: no result recorded (e.g. a fresh completion that only asked for the call)
    success: bool | None  # the framework's own flag, when there is one
    error: str | None
    call_id: str | None

    @property
    def failed(self) -> bool | None:
        """Honest failure: the framework's flag, an error, an `Error…` result or a traceback in a "success"."""
        if self.result is None and self.success is None and not self.error:
            return None
        if self.success is False or self.error:
            return True
        if self.result is not None and result_is_failure(self.result):
            return True
        if self.result is not None and self.result.lstrip().startswith("{"):
            head = self.result.lstrip()
            if _DICT_FAILURE.search(head) or _DICT_ERROR.match(head):
                return True  # exec_code's {'success': False, ...}; TRL's {'error': ...} for a tool that raised
        return False

    def signature(self) -> str:
        """Name plus canonical arguments: equal for repeated identical calls."""
        args = self.arguments
        try:
            canon = json.dumps(args, sort_keys=True, default=str) if not isinstance(args, str) else args.strip()
        except (TypeError, ValueError):
            canon = repr(args)
        return f"{self.name}\x00{canon}"


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as a value: a JSON string is parsed; one that does not parse stays a string."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (ValueError, TypeError):
            return raw
    return raw


def message_tool_calls(trace: ExecutionTrace) -> list[tuple[dict[str, Any], str | None]]:
    """(function dict, call id) for every tool call asked for in assistant messages, in order."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for msg in trace.messages:
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        for tc in msg.get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
            out.append((fn, tc.get("id")))
    return out


def _message_calls(trace: ExecutionTrace) -> list[tuple[dict[str, Any], str | None, str | None]]:
    """(function dict, call id, result) from the transcript. Results are matched by `tool_call_id`, or, when
    the transcript has no ids (TRL's tool loop), to the earlier unanswered call of the same name, in order."""
    calls: list[list[Any]] = []
    by_id: dict[str, list[Any]] = {}
    for msg in trace.messages:
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "assistant":
            for tc in msg.get("tool_calls") or []:
                if isinstance(tc, dict):
                    fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
                    entry = [fn, tc.get("id"), None]
                    calls.append(entry)
                    if tc.get("id"):
                        by_id.setdefault(str(tc["id"]), entry)
        elif msg.get("role") == "tool":
            content = msg.get("content")
            text = content if isinstance(content, str) else json.dumps(content, default=str)
            cid = msg.get("tool_call_id")
            entry = by_id.get(str(cid)) if cid else None
            if entry is None and not cid:
                name = msg.get("name")
                entry = next((c for c in calls if c[2] is None and (not name or c[0].get("name") == name)), None)
            if entry is not None and entry[2] is None:
                entry[2] = text
    return [(fn, cid, result) for fn, cid, result in calls]


def tool_calls(trace: ExecutionTrace, *, include_control: bool = False) -> list[ToolCallView]:
    """Every tool call of the trace, deduplicated by call id (FlowAgent records `think` twice)."""
    views: list[ToolCallView] = []
    seen: set[str] = set()
    raw_by_id = {cid: fn.get("arguments") for fn, cid in message_tool_calls(trace) if cid}
    if trace.tool_calls:
        for tc in trace.tool_calls:
            if tc.call_id:
                if tc.call_id in seen:
                    continue
                seen.add(tc.call_id)
            raw = raw_by_id.get(tc.call_id) if tc.call_id else None
            args = parse_arguments(tc.arguments)
            views.append(ToolCallView(tc.tool_name, args, raw if isinstance(raw, str) else None, tc.result,
                                      tc.success, tc.error or None, tc.call_id))
    else:
        for fn, cid, result in _message_calls(trace):
            if cid:
                if cid in seen:
                    continue
                seen.add(cid)
            raw = fn.get("arguments")
            args = parse_arguments(raw)
            views.append(ToolCallView(str(fn.get("name") or ""), args, raw if isinstance(raw, str) else None,
                                      result, None, None, cid))
    if include_control:
        return views
    return [v for v in views if v.name not in CONTROL_TOOLS]


def final_answer_call(trace: ExecutionTrace) -> dict[str, Any] | None:
    """The arguments of the last `final_answer` call ({"answer", "success"}), if the agent made one."""
    for view in reversed(tool_calls(trace, include_control=True)):
        if view.name == "final_answer":
            return view.arguments if isinstance(view.arguments, dict) else {"answer": str(view.arguments)}
    return None


def answer_text(trace: ExecutionTrace) -> str:
    """The agent's answer: `final_response`, else the final_answer call's answer, else the last assistant text."""
    if trace.final_response and trace.final_response.strip():
        return trace.final_response
    fa = final_answer_call(trace)
    if fa and isinstance(fa.get("answer"), str) and fa["answer"].strip():
        return fa["answer"]
    for msg in reversed(trace.messages):
        if isinstance(msg, dict) and msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
            if msg["content"].strip():
                return msg["content"]
    return trace.final_response or ""


def assistant_texts(trace: ExecutionTrace) -> list[str]:
    """Everything the model wrote as text: assistant message contents, else the final response."""
    texts = [m["content"] for m in trace.messages
             if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]]
    if trace.final_response and trace.final_response not in texts:
        texts.append(trace.final_response)
    return texts


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag lower-cased, code) for every fenced block in `text`."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text or "")]


def strip_code(text: str) -> str:
    """`text` without fenced blocks and inline code spans (markup inside code is not a leak)."""
    text = _FENCE.sub(" ", text or "")
    return re.sub(r"`[^`\n]*`", " ", text)


def assistant_turns(trace: ExecutionTrace) -> int | None:
    """How many times the model spoke: assistant messages, else the LLM call count."""
    n = sum(1 for m in trace.messages if isinstance(m, dict) and m.get("role") == "assistant")
    if n:
        return n
    if trace.llm_calls_count:
        return trace.llm_calls_count
    if trace.llm_calls:
        return len(trace.llm_calls)
    return None


def group_key(trace: ExecutionTrace) -> str:
    """Traces for the same task: `group_key` when set, else the normalised user query."""
    if trace.group_key:
        return trace.group_key
    return " ".join((trace.user_query or "").lower().split())


def is_manual_label(trace: ExecutionTrace) -> bool:
    """A label a person gave (`flowrl traces label`, or toolboxv2's `manual_review`): never overwritten."""
    if trace.label is None:
        return False
    return trace.label_source == "manual" or (trace.label_source is None and trace.manual_review)
