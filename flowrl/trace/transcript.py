"""The chat transcript: the one reader and writer of the OpenAI chat format in flowrl.

Capture, ingest, rewards and the dataset builders all read `messages` through this module, so a trace
gives the same tool calls, results and answer whichever way it arrived. The rules, one each:

- **arguments** (`parse_arguments`): a dict or list is taken as it is; `None`, a blank string or JSON
  `null` is `{}`; a string is JSON when it parses, else a Python literal dict or list when it is one
  (FlowAgent's obs files write `think` arguments as a repr), else the raw string, kept so a reward can
  see that the model wrote something that is not JSON. Written back (`arguments_json`) as
  `json.dumps` text; a string is written as it is.
- **a tool call** (`tool_call_parts`) may come nested (`{"id", "function": {"name", "arguments"}}`),
  flat (`{"id", "name", "arguments"}`) or as an object with those attributes (an SDK message).
- **stored messages** (`canonical_messages`) are OpenAI chat format: each assistant tool call nested,
  `type: "function"`, arguments as a JSON string; other keys are kept as they are. Tool results are
  deduplicated (`dedup_tool_results`): of several results with the same `tool_call_id` the first is
  kept (FlowAgent appends each `think` result twice).
- **synthesis** (`synthesize_messages`) for a trace without a transcript: the user turn, then per
  logged tool call an assistant message asking for it and its result, then the final answer (when there
  is one, or when there were no calls). Calls without an id get `call_{n}`, n counting from 1
  (`fill_call_ids`). Such a trace is marked `metadata.transcript = "synthesized"` (`is_synthesized`):
  its messages are not what the model wrote, so rewards do not read them as such.
- **the final answer** (`final_answer`): the last `final_answer` call's `answer`, else
  `final_response`, else the last assistant text.
- **chat-template shape** (`normalize_message`): what datasets hand to Hugging Face templates; content
  always a string, arguments a dict (or kept as JSON text), only role/content/tool_calls/
  tool_call_id/name.

This module imports nothing of flowrl's at run time (the schema imports it inside its upgrade step).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

ArgumentsAs = Literal["dict", "string"]
FINAL_ANSWER = "final_answer"
SYNTHESIZED = "synthesized"
_TEMPLATE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """A key of a mapping or an attribute of an object (SDK messages and their dict forms read alike)."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def content_text(content: Any) -> str:
    """Message content as text: `None` is "", OpenAI content parts are joined, anything else is `str()`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


# ---------------------------------------------------------------------------------------------
# tool calls


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as a value (the rule is in the module docstring)."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = _python_literal(text)
        return raw if value is None else value
    return {} if value is None else value


def _python_literal(text: str) -> dict[str, Any] | list[Any] | None:
    if text[:1] not in ("{", "["):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, (dict, list)) else None


def arguments_json(value: Any) -> str:
    """Arguments as the JSON text an OpenAI tool call carries (a string is kept as it is)."""
    if isinstance(value, str):
        return value
    return json.dumps({} if value is None else value, ensure_ascii=False, default=repr)


def tool_call_parts(call: Any) -> tuple[str, Any, str | None]:
    """(name, raw arguments, id) of a tool call in any shape: nested OpenAI, flat, or an object."""
    fn = field_of(call, "function")
    source = fn if fn is not None and not isinstance(fn, str) else call
    call_id = field_of(call, "id")
    return (
        str(field_of(source, "name", "") or ""),
        field_of(source, "arguments"),
        (None if call_id is None else str(call_id)),
    )


def synthetic_call_id(n: int) -> str:
    """The id of the n-th (from 1) call of a run that has none of its own."""
    return f"call_{n}"


def openai_tool_call(call: Any, n: int | None = None, arguments_as: ArgumentsAs = "string") -> dict[str, Any]:
    """A tool call in the nested OpenAI shape. Without an id it gets `synthetic_call_id(n)` (none when
    `n` is None); arguments are JSON text, or with `arguments_as="dict"` a dict when they are a JSON object."""
    if not isinstance(call, Mapping) and field_of(call, "function") is None and field_of(call, "name") is None:
        call = {"name": str(call)}
    name, raw, call_id = tool_call_parts(call)
    if arguments_as == "dict":
        parsed = parse_arguments(raw)
        arguments: Any = parsed if isinstance(parsed, dict) else raw
    else:
        arguments = arguments_json(raw)
    out: dict[str, Any] = {}
    if call_id or n is not None:
        out["id"] = call_id or synthetic_call_id(n or 0)
    out["type"] = "function"
    out["function"] = {"name": name, "arguments": arguments}
    return out


@dataclass(slots=True)
class TranscriptCall:
    """One tool call asked for in a transcript, with its result when a `tool` message answers it."""

    name: str
    arguments: Any  # raw, as the message holds it (usually the JSON text the model wrote)
    call_id: str | None
    message_index: int
    result: str | None = None


def transcript_calls(messages: Iterable[Any]) -> list[TranscriptCall]:
    """Every tool call in assistant messages, in order. A result is matched by `tool_call_id` (the first
    result of an id wins); a result without an id (TRL's tool loop) goes to the earliest unanswered call
    of its name."""
    calls: list[TranscriptCall] = []
    by_id: dict[str, TranscriptCall] = {}
    for idx, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            continue
        if msg.get("role") == "assistant":
            for tc in msg.get("tool_calls") or ():
                name, raw, call_id = tool_call_parts(tc)
                call = TranscriptCall(name, raw, call_id or None, idx)
                calls.append(call)
                if call.call_id:
                    by_id.setdefault(call.call_id, call)
        elif msg.get("role") in ("tool", "function"):
            cid = msg.get("tool_call_id")
            target = by_id.get(str(cid)) if cid else None
            if target is None and not cid:
                wanted = msg.get("name")
                target = next((c for c in calls if c.result is None and (not wanted or c.name == wanted)), None)
            if target is not None and target.result is None:
                target.result = content_text(msg.get("content"))
    return calls


def fill_call_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each logged tool call (dicts with `call_id`) that has no id `synthetic_call_id(n)`; in place."""
    for n, call in enumerate(calls, 1):
        if isinstance(call, dict) and not call.get("call_id"):
            call["call_id"] = synthetic_call_id(n)
    return calls


# ---------------------------------------------------------------------------------------------
# messages


def dedup_tool_results(messages: list[Any]) -> list[Any]:
    """The messages without repeated tool results: of several with one `tool_call_id`, the first stays."""
    seen: set[str] = set()
    out = []
    for msg in messages:
        if isinstance(msg, Mapping) and msg.get("role") == "tool" and msg.get("tool_call_id"):
            key = str(msg["tool_call_id"])
            if key in seen:
                continue
            seen.add(key)
        out.append(msg)
    return out


def canonical_message(message: Any) -> Any:
    """A stored message: its tool calls in the nested OpenAI shape, arguments as JSON text (a copy)."""
    if not isinstance(message, Mapping):
        return message
    out = dict(message)
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [openai_tool_call(c) for c in calls]
    return out


def canonical_messages(messages: list[Any]) -> list[Any]:
    """Stored transcript: tool results deduplicated, tool calls in one shape."""
    return [canonical_message(m) for m in dedup_tool_results(messages)]


def synthesize_messages(query: Any, calls: Iterable[Any], final: Any) -> list[dict[str, Any]]:
    """The minimal transcript of a run known only by its query, logged tool calls and answer.

    `calls` are `ToolCallTrace`s or their dicts (`tool_name`, `arguments`, `result`, `call_id`, `error`); a
    failed call's tool message carries its error text ("Error: ..."), so the transcript shows why it failed."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": content_text(query)}]
    n = 0
    for n, call in enumerate(calls, 1):
        name = str(field_of(call, "tool_name") or "")
        call_id = field_of(call, "call_id") or synthetic_call_id(n)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    openai_tool_call({"id": call_id, "name": name, "arguments": field_of(call, "arguments")})
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": _tool_content(call)})
    final_text = content_text(final)
    if final_text or n == 0:
        messages.append({"role": "assistant", "content": final_text})
    return messages


def _tool_content(call: Any) -> str:
    """The tool message of a logged call: its result, with the error text of a failed call added."""
    result = content_text(field_of(call, "result"))
    error = content_text(field_of(call, "error")).strip()
    if not error or error in result:
        return result
    return f"{result}\nError: {error}" if result else f"Error: {error}"


def is_synthesized(metadata: Any) -> bool:
    """Were the trace's messages rebuilt by `synthesize_messages` rather than recorded?"""
    return isinstance(metadata, Mapping) and metadata.get("transcript") == SYNTHESIZED


def complete_messages(data: dict[str, Any]) -> dict[str, Any]:
    """Give a trace dict canonical `messages`: its own made canonical, else synthesised (and marked) from
    `user_query`, `tool_calls` and `final_response` when it has any of them. In place; returns `data`."""
    messages = data.get("messages")
    if isinstance(messages, list) and messages:
        data["messages"] = canonical_messages(messages)
        return data
    if messages not in (None, []):
        return data  # not a list: left for the schema to reject
    calls = data.get("tool_calls")
    if not (data.get("user_query") or calls or data.get("final_response")):
        data["messages"] = []
        return data
    if isinstance(calls, list):  # copies: the caller's dicts stay as they were
        calls = data["tool_calls"] = fill_call_ids([dict(c) if isinstance(c, dict) else c for c in calls])
    else:
        calls = []  # not a list: left for the schema to reject
    data["messages"] = synthesize_messages(
        data.get("user_query"), [c for c in calls if isinstance(c, dict)], data.get("final_response")
    )
    metadata = data.get("metadata")
    if metadata is None or isinstance(metadata, dict):
        data["metadata"] = {"transcript": SYNTHESIZED, **(metadata or {})}
    return data


def final_answer_args(messages: Iterable[Any]) -> dict[str, Any] | None:
    """The arguments of the last `final_answer` call ({"answer", "success"}); non-dict ones as {"answer"}."""
    for call in reversed(transcript_calls(messages)):
        if call.name == FINAL_ANSWER:
            args = parse_arguments(call.arguments)
            return args if isinstance(args, dict) else {"answer": str(args)}
    return None


def final_answer(messages: list[Any], final_response: str = "", *, call_args: dict[str, Any] | None = None) -> str:
    """The run's answer: the `final_answer` call's `answer` (`call_args`, else found in `messages`), else
    `final_response`, else the last assistant text."""
    args = call_args if call_args is not None else final_answer_args(messages)
    if args and isinstance(args.get("answer"), str) and args["answer"].strip():
        return args["answer"]
    if final_response and final_response.strip():
        return final_response
    for msg in reversed(messages):
        if isinstance(msg, Mapping) and msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
            if msg["content"].strip():
                return msg["content"]
    return final_response or ""


# ---------------------------------------------------------------------------------------------
# the shape chat templates expect (datasets)


def normalize_tool_call(call: Any, index: int, arguments_as: ArgumentsAs = "dict") -> dict[str, Any]:
    """A tool call of any shape in the nested OpenAI shape, for a chat template. Without an id it gets
    `synthetic_call_id(index + 1)`: `index` is its position in its message, from 0."""
    return openai_tool_call(call, index + 1, arguments_as)


def normalize_message(message: Any, arguments_as: ArgumentsAs = "dict") -> dict[str, Any] | None:
    """A message in the shape chat templates expect, or None when it is not a chat message at all."""
    if not isinstance(message, Mapping) or not message.get("role"):
        return None
    role = str(message["role"])
    if role == "function":  # legacy OpenAI name for a tool result
        role = "tool"
    out: dict[str, Any] = {"role": role, "content": content_text(message.get("content"))}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        out["tool_calls"] = [normalize_tool_call(c, i, arguments_as) for i, c in enumerate(calls)]
    if role == "tool":
        if message.get("tool_call_id"):
            out["tool_call_id"] = str(message["tool_call_id"])
        if message.get("name"):
            out["name"] = str(message["name"])
    return out


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


def synthesize_tools(messages: Iterable[Any]) -> list[dict[str, Any]] | None:
    """Minimal OpenAI tool schemas for the tools a transcript calls (names and argument types only)."""
    tools: dict[str, dict[str, Any]] = {}
    for call in transcript_calls(messages):
        args = parse_arguments(call.arguments)
        schema = tools.setdefault(
            call.name,
            {
                "type": "function",
                "function": {"name": call.name, "description": "", "parameters": {"type": "object", "properties": {}}},
            },
        )
        if isinstance(args, dict):
            props = schema["function"]["parameters"]["properties"]
            for key, value in args.items():
                props.setdefault(str(key), {"type": _json_type(value)})
    return list(tools.values()) or None


# ---------------------------------------------------------------------------------------------
# the OpenAI Responses API's items


def _part_text(content: Any) -> Any:
    """Responses content parts as chat content: their text joined when every part is text, else kept."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content:
            text = field_of(part, "text")
            if not isinstance(text, str):
                return [_as_dict(p) for p in content]
            texts.append(text)
        return "".join(texts)
    return content


def _as_dict(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json", exclude_none=True)
        except Exception:
            return value
    return value


def responses_messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """An OpenAI Responses API request (`instructions`, `input`) or response (`output` items) as chat messages:
    `instructions` a system message, `function_call` items an assistant's tool calls, `function_call_output` items
    tool messages, message items by their role; reasoning and built-in tool items are left out."""
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, (list, tuple)):
        return messages
    for item in items:
        kind = field_of(item, "type")
        if kind == "function_call":
            call = {
                "id": field_of(item, "call_id"),
                "type": "function",
                "function": {"name": field_of(item, "name"), "arguments": field_of(item, "arguments")},
            }
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = field_of(item, "output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": field_of(item, "call_id"),
                    "content": output if isinstance(output, str) else content_text(_part_text(output)),
                }
            )
        elif kind in (None, "message") and isinstance(field_of(item, "role"), str):
            role = field_of(item, "role")
            content = _part_text(field_of(item, "content"))
            last = messages[-1] if messages else None
            if role == "assistant" and last is not None and last.get("role") == "assistant" and kind == "message":
                last["content"] = content_text(last.get("content")) + content_text(content)  # one turn's parts
            else:
                messages.append({"role": role, "content": content})
        # reasoning items, built-in tool calls and other items are not chat messages: left out
    return messages


__all__ = [
    "responses_messages",
    "FINAL_ANSWER",
    "SYNTHESIZED",
    "ArgumentsAs",
    "TranscriptCall",
    "arguments_json",
    "canonical_message",
    "canonical_messages",
    "complete_messages",
    "content_text",
    "dedup_tool_results",
    "fill_call_ids",
    "final_answer",
    "final_answer_args",
    "is_synthesized",
    "normalize_message",
    "normalize_tool_call",
    "openai_tool_call",
    "parse_arguments",
    "synthesize_messages",
    "synthesize_tools",
    "synthetic_call_id",
    "tool_call_parts",
    "transcript_calls",
]


def completion_text(completion: Any) -> str:
    """TRL hands completions as strings (standard) or as lists of messages (conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        parts = [m.get("content") or "" for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        return "\n".join(p if isinstance(p, str) else str(p) for p in parts)
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return str(completion)
