"""A trace as a chat: the messages TRL trains on, where the prompt ends, and the tool schemas.

Datasets are built from `trace.messages` (OpenAI chat format: system, user, assistant with
`tool_calls`, tool results) and `trace.tools`. A trace without messages (a toolboxv2 rl_traces
import, say) gets a minimal conversation synthesised from `user_query`, `tool_calls` and
`final_response`: the user turn, then one assistant message per logged tool call followed by its
result, then the final answer.

Messages are normalised to the shape Hugging Face chat templates expect:
- `content` is always a string (`None` becomes `""`; a list of text parts is joined);
- a tool call is `{"id", "type": "function", "function": {"name", "arguments"}}` with `arguments`
  parsed into a dict (OpenAI sends a JSON string; templates `tojson` a dict). Arguments that are not a
  JSON object stay a string. `arguments_as="string"` keeps OpenAI's JSON strings instead;
- only `role`, `content`, `tool_calls`, `tool_call_id` and `name` are kept.

The prompt of a run ends at its user turn: the last user message that is followed by an assistant
message and matches `user_query` (else the last user message followed by an assistant message).
Everything before it (system prompts, earlier turns) is context; the assistant messages after it are
what the agent did in this run, and the only messages ever trained on. Trailing non-assistant
messages (a tool result nobody answered, an internal follow-up prompt) are dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from flowrl.schema import ExecutionTrace

ArgumentsAs = Literal["dict", "string"]
_KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")
_WS = re.compile(r"\s+")


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


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or ""))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def _arguments(value: Any, arguments_as: ArgumentsAs) -> Any:
    if arguments_as == "string":
        if isinstance(value, str):
            return value
        return orjson.dumps(value if value is not None else {}).decode()
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value) if value.strip() else {}
        except orjson.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def normalize_tool_call(call: Any, index: int, arguments_as: ArgumentsAs = "dict") -> dict[str, Any]:
    """An OpenAI or flat (`{"name", "arguments"}`) tool call in the nested OpenAI shape."""
    if not isinstance(call, dict):
        call = {"function": {"name": str(call)}}
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    out: dict[str, Any] = {
        "id": str(call.get("id") or f"call_{index}"),
        "type": "function",
        "function": {"name": str(fn.get("name") or ""), "arguments": _arguments(fn.get("arguments"), arguments_as)},
    }
    return out


def normalize_message(message: dict[str, Any], arguments_as: ArgumentsAs = "dict") -> dict[str, Any] | None:
    """A message in the shape chat templates expect, or None when it is not a chat message at all."""
    if not isinstance(message, dict) or not message.get("role"):
        return None
    role = str(message["role"])
    if role == "function":  # legacy OpenAI name for a tool result
        role = "tool"
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        out["tool_calls"] = [normalize_tool_call(c, i, arguments_as) for i, c in enumerate(calls)]
    if role == "tool":
        if message.get("tool_call_id"):
            out["tool_call_id"] = str(message["tool_call_id"])
        if message.get("name"):
            out["name"] = str(message["name"])
    return out


def synthesize_messages(trace: ExecutionTrace, arguments_as: ArgumentsAs = "dict") -> list[dict[str, Any]]:
    """The minimal conversation of a trace that has no `messages`."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": trace.user_query}]
    for i, call in enumerate(trace.tool_calls):
        call_id = call.call_id or f"call_{i}"
        messages.append({
            "role": "assistant",
            "content": "",
            "tool_calls": [normalize_tool_call(
                {"id": call_id, "function": {"name": call.tool_name, "arguments": call.arguments}}, i, arguments_as)],
        })
        messages.append({"role": "tool", "content": _text(call.result), "tool_call_id": call_id, "name": call.tool_name})
    if trace.final_response or not trace.tool_calls:
        messages.append({"role": "assistant", "content": trace.final_response})
    return messages


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def synthesize_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Minimal OpenAI tool schemas for the tools a transcript calls (names and argument types only)."""
    tools: dict[str, dict[str, Any]] = {}
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = orjson.loads(args)
                except orjson.JSONDecodeError:
                    args = {}
            schema = tools.setdefault(fn["name"], {
                "type": "function",
                "function": {"name": fn["name"], "description": "",
                             "parameters": {"type": "object", "properties": {}}},
            })
            if isinstance(args, dict):
                props = schema["function"]["parameters"]["properties"]
                for key, value in args.items():
                    props.setdefault(str(key), {"type": _json_type(value)})
    return list(tools.values()) or None


def normalize_query(text: str) -> str:
    """Case-, space- and trailing-punctuation-insensitive form of a user turn."""
    return _WS.sub(" ", (text or "").casefold()).strip().rstrip(".?!").strip()


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
    synthesized = not raw
    if synthesized:
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
