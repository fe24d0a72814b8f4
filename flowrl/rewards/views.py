"""Read-only views of a trace that several rewards share.

A trace may carry its tool calls in `tool_calls` (capture, ingest, toolboxv2 rl files), in `messages`
(OpenAI-format transcript; what a fresh GRPO completion gives), or in both. These helpers give one answer
either way, so each reward reads the same facts: the tool calls with their results, the final answer and
its success flag, the code the agent wrote. The tool calls, their failure, the answer, the task key and
manual labels are decided by `flowrl.trace.facts` (re-exported here); the transcript is read by
`flowrl.trace.transcript`; a
transcript that flowrl synthesised (`metadata.transcript == "synthesized"`) is not what the model wrote and
is not read here as if it were.
"""

from __future__ import annotations

import re
from typing import Any

from flowrl.trace.facts import (
    CONTROL_TOOLS,
    ToolCallView,
    answer_text,
    final_answer_call,
    is_manual_label,
    recorded_transcript,
    task_key,
    tool_calls,
)
from flowrl.trace.schema import ExecutionTrace
from flowrl.trace.transcript import TranscriptCall, transcript_calls

__all__ = [
    "CONTROL_TOOLS",
    "ToolCallView",
    "answer_text",
    "assistant_texts",
    "assistant_turns",
    "code_blocks",
    "final_answer_call",
    "group_key",
    "is_manual_label",
    "message_tool_calls",
    "recorded_transcript",
    "strip_code",
    "tool_calls",
]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.\-]*)[^\n]*\n(.*?)```", re.DOTALL)


def _spoken_calls(trace: ExecutionTrace) -> list[TranscriptCall]:
    return transcript_calls(recorded_transcript(trace))


def message_tool_calls(trace: ExecutionTrace) -> list[tuple[dict[str, Any], str | None]]:
    """({"name", "arguments"}, call id) for every tool call asked for in assistant messages, in order;
    `arguments` raw, as the model wrote them."""
    return [({"name": c.name, "arguments": c.arguments}, c.call_id) for c in _spoken_calls(trace)]


def assistant_texts(trace: ExecutionTrace) -> list[str]:
    """Everything the model wrote as text: assistant message contents, else the final response."""
    texts = [
        m["content"]
        for m in trace.messages
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]
    ]
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
    """Traces of the same task (`flowrl.trace.facts.task_key`: `group_key` when set, else the user turn as a task)."""
    return task_key(trace)
