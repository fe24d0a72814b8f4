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

from flowrl.trace.conversation import message_chars, trace_conversation
from flowrl.trace.row import DecisionRow, decision_row
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
        row = decision_row(trace, conv)
        return {
            "conv_messages": [dumps(m) for m in conv.messages],
            "conv_chars": [message_chars([m]) for m in conv.messages],
            "conv_steps": conv.assistant_indices(),
            "conv_prompt_end": row.prompt_end,
            "conv_tools": dumps(conv.tools),
            "conv_key": row.key,
            "conv_synthesized": row.synthesized,
            "conv_tool_calls": row.tool_calls,
            "query_key": row.query_key,
            "group_key": row.group_key,
            "manual_review": row.manual_review,
            "rewards": dumps(row.rewards),
            "llm_calls": len(trace.llm_calls),
        }
    except Exception as exc:  # a chat no builder could read either: the build reads the trace and says why
        if not _failed:
            log.warning(
                "flowrl: trace %s: its chat could not be precomputed (%s); builds read it whole", trace.trace_id, exc
            )
            _failed = True
        return _EMPTY


# the columns `decision_rows` reads: the derived ones above and the segment's scalar ones (`format.SCALARS`)
ROW_COLUMNS = [
    "trace_id",
    "label",
    "label_source",
    "reward_score",
    "manual_review",
    "rewards",
    "conv_prompt_end",
    "conv_key",
    "conv_synthesized",
    "conv_tool_calls",
    "query_key",
    "group_key",
]


def decision_rows(cols: dict[str, list[Any]], steps: list[int]) -> list[DecisionRow]:
    """The `DecisionRow`s of a segment's rows from their columns `ROW_COLUMNS` (as Python lists; `rewards` JSON text,
    or a mapping where a patch set it) and each row's number of assistant steps (`conv_steps`' lengths), without
    parsing a trace. `host_success` is None: a row with host outcomes is read whole."""
    loads = orjson.loads
    return [
        DecisionRow(
            trace_id,
            prompt_end,
            n,
            key,
            synthesized,
            tool_calls,
            group_key,
            query,
            label,
            label_source,
            manual_review,
            None,
            score,
            loads(rewards) if isinstance(rewards, str) else rewards,
        )
        for (
            trace_id,
            label,
            label_source,
            score,
            manual_review,
            rewards,
            prompt_end,
            key,
            synthesized,
            tool_calls,
            query,
            group_key,
        ), n in zip(zip(*(cols[name] for name in ROW_COLUMNS), strict=True), steps, strict=True)
    ]
