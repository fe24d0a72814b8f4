"""Read-only views of a trace that several rewards share.

A trace may carry its tool calls in `tool_calls` (capture, ingest, toolboxv2 rl files), in `messages`
(OpenAI-format transcript; what a fresh GRPO completion gives), or in both. These helpers give one answer
either way, so each reward reads the same facts: the tool calls with their results, the final answer and
its success flag, the code the agent wrote. The transcript itself is read by `flowrl.transcript`; a
transcript that flowrl synthesised (`metadata.transcript == "synthesized"`) is not what the model wrote and
is not read here as if it were.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flowrl.schema import ExecutionTrace, result_is_failure
from flowrl.transcript import (
    TranscriptCall,
    final_answer,
    is_synthesized,
    parse_arguments,
    transcript_calls,
)

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


def recorded_transcript(trace: ExecutionTrace) -> list[dict[str, Any]]:
    """The trace's messages when they are what the run said; [] when flowrl synthesised them."""
    return [] if is_synthesized(trace.metadata) else trace.messages


def _spoken_calls(trace: ExecutionTrace) -> list[TranscriptCall]:
    return transcript_calls(recorded_transcript(trace))


def message_tool_calls(trace: ExecutionTrace) -> list[tuple[dict[str, Any], str | None]]:
    """({"name", "arguments"}, call id) for every tool call asked for in assistant messages, in order;
    `arguments` raw, as the model wrote them."""
    return [({"name": c.name, "arguments": c.arguments}, c.call_id) for c in _spoken_calls(trace)]


def _view(call: TranscriptCall) -> ToolCallView:
    raw = call.arguments
    return ToolCallView(call.name, parse_arguments(raw), raw if isinstance(raw, str) else None, call.result,
                        None, None, call.call_id)


def _first_per_id(views: list[ToolCallView]) -> list[ToolCallView]:
    seen: set[str] = set()
    out = []
    for v in views:
        if v.call_id:
            if v.call_id in seen:
                continue
            seen.add(v.call_id)
        out.append(v)
    return out


def tool_calls(trace: ExecutionTrace, *, include_control: bool = False) -> list[ToolCallView]:
    """Every tool call of the trace, one per call id (FlowAgent records `think` twice).

    `tool_calls` when the trace has them (the framework's success flags and errors), plus the transcript's
    calls that no entry records (ingest keeps FlowAgent's `think` and `final_answer` out of `tool_calls`,
    capture keeps only `final_answer` out): matched by call id, else by name and arguments. When the
    transcript adds a call, the calls follow the transcript's order. Without `tool_calls`, the transcript's."""
    spoken = [_view(c) for c in _spoken_calls(trace)]
    if not trace.tool_calls:
        views = _first_per_id(spoken)
    else:
        raw_by_id = {v.call_id: v.raw_arguments for v in spoken if v.call_id}
        logged = _first_per_id([
            ToolCallView(tc.tool_name, parse_arguments(tc.arguments), raw_by_id.get(tc.call_id) if tc.call_id else None,
                         tc.result, tc.success, tc.error or None, tc.call_id) for tc in trace.tool_calls])
        views = _merge(logged, _first_per_id(spoken), include_control)
    if include_control:
        return views
    return [v for v in views if v.name not in CONTROL_TOOLS]


def _merge(logged: list[ToolCallView], spoken: list[ToolCallView], include_control: bool) -> list[ToolCallView]:
    ids = {v.call_id for v in logged if v.call_id}
    anonymous = [v for v in logged if not v.call_id]
    extra: list[ToolCallView] = []
    for v in spoken:
        if v.call_id and v.call_id in ids:
            continue
        twin = next((a for a in anonymous if a.name == v.name and a.signature() == v.signature()), None)
        if twin is not None:
            anonymous.remove(twin)
            continue
        extra.append(v)
    if not any(include_control or v.name not in CONTROL_TOOLS for v in extra):
        return logged
    by_id = {v.call_id: v for v in logged if v.call_id}
    extra_ids = {id(v) for v in extra}
    ordered: list[ToolCallView] = []
    for v in spoken:
        if v.call_id and v.call_id in by_id:
            ordered.append(by_id.pop(v.call_id))
        elif id(v) in extra_ids:
            ordered.append(v)
    placed = {id(v) for v in ordered}
    return ordered + [v for v in logged if id(v) not in placed]


def final_answer_call(trace: ExecutionTrace) -> dict[str, Any] | None:
    """The arguments of the last `final_answer` call ({"answer", "success"}), if the agent made one."""
    for view in reversed(tool_calls(trace, include_control=True)):
        if view.name == "final_answer":
            return view.arguments if isinstance(view.arguments, dict) else {"answer": str(view.arguments)}
    return None


def answer_text(trace: ExecutionTrace) -> str:
    """The agent's answer (`flowrl.transcript.final_answer`): the final_answer call's answer, else
    `final_response`, else the last assistant text."""
    return final_answer(trace.messages, trace.final_response, call_args=final_answer_call(trace) or {})


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
    """How many times the model spoke: assistant messages (of a recorded transcript), else the LLM call count."""
    n = sum(1 for m in recorded_transcript(trace) if isinstance(m, dict) and m.get("role") == "assistant")
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
