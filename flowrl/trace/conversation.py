"""A trace as a chat: the messages TRL trains on, where the prompt ends, and the tool schemas.

A dataset is built from `trace.messages` (OpenAI chat format: system, user, assistant with
`tool_calls`, tool results) and `trace.tools`. A trace without messages (a toolboxv2 rl_traces
import, say) gets a minimal conversation synthesised from `user_query`, `tool_calls` and
`final_response`: the user turn, then one assistant message per logged tool call followed by its
result, then the final answer.

Messages are normalised to the shape Hugging Face chat templates expect (`flowrl.trace.transcript`, which
owns the chat format: synthesis, argument parsing and this normalisation live there):
- `content` is always a string (`None` becomes `""`; a list of text parts is joined);
- a tool call is `{"id", "type": "function", "function": {"name", "arguments"}}` with `arguments`
  parsed into a dict (OpenAI sends a JSON string; templates `tojson` a dict). Arguments that are not a
  JSON object stay a string. `arguments_as="string"` keeps OpenAI's JSON strings instead;
- only `role`, `content`, `tool_calls`, `tool_call_id` and `name` are kept.

A trace whose stored messages flowrl synthesised (`metadata.transcript == "synthesized"`, as the schema
upgrade does for older files without a transcript) counts as synthesised here too.

The prompt of a run ends at its user turn: the last user message that is followed by an assistant
message and matches `user_query` (else the last user message followed by an assistant message).
Everything before it (system prompts, earlier turns) is context; the assistant messages after it are
what the agent did in this run, and the only messages ever trained on. Trailing non-assistant
messages (a tool result nobody answered, an internal follow-up prompt) are dropped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from flowrl.trace.facts import query_key
from flowrl.trace.schema import ExecutionTrace
from flowrl.trace.transcript import (
    ArgumentsAs,
    is_synthesized,
    normalize_message,
    normalize_tool_call,
    synthesize_tools,
)
from flowrl.trace.transcript import synthesize_messages as _synthesize

__all__ = [
    "ArgumentsAs",
    "Conversation",
    "conversation_key",
    "find_prompt_end",
    "fit_trajectory",
    "message_chars",
    "normalize_message",
    "normalize_query",
    "normalize_tool_call",
    "synthesize_messages",
    "synthesize_tools",
    "trace_conversation",
]


@dataclass
class Conversation:
    """One run as chat messages.

    `messages[:prompt_end]` is the prompt (system, history, this run's user turn); `messages[prompt_end:]`
    is what the agent did, ending on an assistant message. `synthesized` says the messages were built
    from `tool_calls`/`final_response` because the trace had none.
    """

    messages: list[dict[str, Any]]
    prompt_end: int
    tools: list[dict[str, Any]] | None
    synthesized: bool = False

    @property
    def prompt(self) -> list[dict[str, Any]]:
        return self.messages[: self.prompt_end]

    @property
    def trajectory(self) -> list[dict[str, Any]]:
        return self.messages[self.prompt_end :]

    def assistant_indices(self) -> list[int]:
        """Indices (into `messages`) of this run's assistant messages: the trainable steps."""
        return [i for i in range(self.prompt_end, len(self.messages)) if self.messages[i]["role"] == "assistant"]

    @property
    def has_tool_calls(self) -> bool:
        return any(m.get("tool_calls") for m in self.trajectory)

    def head(self, end: int) -> list[Any]:
        """`messages[:end]`, as a row holds them."""
        return self.messages[:end]

    def chars(self, start: int, end: int) -> int:
        """`message_chars` of `messages[start:end]`."""
        return message_chars(self.messages[start:end])

    def key(self) -> bytes:
        """`conversation_key`: what a dataset build dedupes on."""
        return conversation_key(self)


def synthesize_messages(trace: ExecutionTrace, arguments_as: ArgumentsAs = "dict") -> list[dict[str, Any]]:
    """The minimal conversation of a trace that has no `messages` (`flowrl.trace.transcript.synthesize_messages`)."""
    messages = (
        normalize_message(m, arguments_as)
        for m in _synthesize(trace.user_query, trace.tool_calls, trace.final_response)
    )
    return [m for m in messages if m is not None]


def normalize_query(text: str) -> str:
    """Case-, space- and trailing-punctuation-insensitive form of a user turn (`flowrl.trace.facts.query_key`, the
    rule the task key uses too)."""
    return query_key(text)


def find_prompt_end(messages: list[dict[str, Any]], user_query: str = "") -> int:
    """Index just past this run's user turn (0 when there is no user turn before an assistant)."""
    answered = []
    seen_assistant = False
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i]["role"]
        if role == "assistant":
            seen_assistant = True
        elif role == "user" and seen_assistant:
            answered.append(i)
    if not answered:
        return 0
    wanted = normalize_query(user_query)
    if wanted:
        for i in answered:  # latest first
            if normalize_query(messages[i]["content"]) == wanted:
                return i + 1
    return answered[0] + 1


def trace_conversation(trace: ExecutionTrace, arguments_as: ArgumentsAs = "dict") -> Conversation:
    """The trace's chat: normalised messages, the prompt boundary and the tool schemas offered."""
    raw = trace.messages
    synthesized = not raw or is_synthesized(trace.metadata)
    if not raw:
        messages = synthesize_messages(trace, arguments_as)
    else:
        messages = [m for m in (normalize_message(m, arguments_as) for m in raw) if m is not None]
    end = find_prompt_end(messages, trace.user_query)
    last = len(messages)
    while last > end and messages[last - 1]["role"] != "assistant":
        last -= 1
    messages = messages[:last]
    if end == 0 and trace.user_query and not synthesized:  # a transcript without its user turn
        end = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        messages.insert(end, {"role": "user", "content": trace.user_query})
        end += 1
    tools = [t for t in trace.tools if isinstance(t, dict)] or synthesize_tools(messages)
    return Conversation(messages=messages, prompt_end=end, tools=tools, synthesized=synthesized)


def conversation_key(conv: Conversation) -> bytes:
    """The 16-byte identity of a conversation (its messages and tools): what a dataset build dedupes on."""
    data = orjson.dumps([conv.messages, conv.tools], option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(data, digest_size=16).digest()


def message_chars(messages: list[dict[str, Any]]) -> int:
    """Length of messages in characters: contents plus tool-call names and arguments."""
    total = 0
    for m in messages:
        total += len(m.get("content") or "")
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            args = fn.get("arguments")
            total += len(fn.get("name") or "") + (len(args) if isinstance(args, str) else len(orjson.dumps(args)))
    return total


def fit_trajectory(trajectory: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The longest head of `trajectory` that ends on an assistant message and fits in `budget`
    characters (empty when not even the first assistant message fits)."""
    used = 0
    keep = 0
    for i, m in enumerate(trajectory):
        used += message_chars([m])
        if used > budget:
            break
        if m["role"] == "assistant":
            keep = i + 1
    return trajectory[:keep]
