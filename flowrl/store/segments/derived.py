"""What a segment precomputes for dataset builds when it is written: the trace as a chat, and the few fields a
build reads besides the filter columns. A columnar build (`flowrl.data.columnar`) reads these columns and
never parses a trace's JSON; a row without them (a segment-v1 file, a trace whose chat could not be derived)
is built from its trace as before.

Columns, all from `flowrl.trace.conversation.trace_conversation(trace)` with tool-call arguments as dicts (what every
builder but an `arguments_as="string"` one trains on):

    conv_messages   list<string>  each message as compact JSON (orjson), as a dataset row holds it
    conv_chars      list<int32>   `message_chars` of each message
    conv_steps      list<int32>   `Conversation.assistant_indices()`
    conv_prompt_end int32         where the prompt ends
    conv_tools      string        the tool schemas as JSON
    conv_key        binary        `conversation_key` (what a build dedupes on)
    conv_synthesized, conv_tool_calls   bool
    query_key       string        `flowrl.trace.facts.query_key(user_query)` (the dataset builder's task key)
    group_key       string        the trace's own group key
    manual_review   bool
    rewards         string        the rewards as JSON (`flowrl.trace.facts.label_for` reads the correctness ones)
    llm_calls       int32         how many LLM calls with ids the trace holds (a build reads those from the trace)
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from flowrl.trace.conversation import conversation_key, message_chars, trace_conversation
from flowrl.trace.facts import query_key
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

COLUMNS: dict[str, str] = {
    "conv_messages": "list<string>",
    "conv_chars": "list<int32>",
    "conv_steps": "list<int32>",
    "conv_prompt_end": "int32",
    "conv_tools": "string",
    "conv_key": "binary",
    "conv_synthesized": "bool",
    "conv_tool_calls": "bool",
    "query_key": "string",
    "group_key": "string",
    "manual_review": "bool",
    "rewards": "string",
    "llm_calls": "int32",
}
_EMPTY: dict[str, Any] = dict.fromkeys(COLUMNS)
_failed = False


def dumps(value: Any) -> str:
    """JSON text of a value as a dataset row serialises it (orjson, compact)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def derive(trace: ExecutionTrace) -> dict[str, Any]:
    """The derived columns of one trace; all null when its chat cannot be derived (said once, the row is then
    built from its trace)."""
    global _failed
    try:
        conv = trace_conversation(trace, "dict")
        return {
            "conv_messages": [dumps(m) for m in conv.messages],
            "conv_chars": [message_chars([m]) for m in conv.messages],
            "conv_steps": conv.assistant_indices(),
            "conv_prompt_end": conv.prompt_end,
            "conv_tools": dumps(conv.tools),
            "conv_key": conversation_key(conv),
            "conv_synthesized": conv.synthesized,
            "conv_tool_calls": conv.has_tool_calls,
            "query_key": query_key(trace.user_query),
            "group_key": trace.group_key,
            "manual_review": trace.manual_review,
            "rewards": dumps(trace.rewards),
            "llm_calls": len(trace.llm_calls),
        }
    except Exception as exc:  # a chat no builder could read either: the build reads the trace and says why
        if not _failed:
            log.warning(
                "flowrl: trace %s: its chat could not be precomputed (%s); builds read it whole", trace.trace_id, exc
            )
            _failed = True
        return _EMPTY
