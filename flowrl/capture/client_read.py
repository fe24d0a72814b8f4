"""Client LLM calls read back on the writer thread: an `LLMEvent` the OpenAI SDK or LiteLLM patch recorded
(`openai_client.py`, `litellm_client.py`) as an `llm_calls` entry (`call_entry`, `merged_entry` for calls made
inside a hooked LLM method) and as what the model saw (`seen_messages`: a call's request messages plus its
response message, OpenAI chat format; a Responses call's items read by `flowrl.trace.transcript.responses_messages`).
Chat completions, their streams (the chunks the host read), Responses and their event streams.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flowrl.capture.events import LLMEvent
from flowrl.capture.tokens import stream_token_info, token_info
from flowrl.trace.transcript import content_text, field_of, responses_messages, tool_call_parts

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.values import Values

CHAT = "openai.chat"
RESPONSES = "openai.responses"


# -- the writer's side: reading the events back ---------------------------------------------------


def _plain_response(out: Any) -> Any:
    """The response a call returned: the SDK object, or the JSON body of a raw response
    (`with_raw_response`, LiteLLM's route into the SDK) when its body has been read."""
    if out is None or field_of(out, "choices") is not None or field_of(out, "output") is not None:
        return out
    http = getattr(out, "http_response", None)
    if http is None:
        return out
    try:
        body = http.content  # raises when the body was not read: then there is nothing to read
        return json.loads(body) if isinstance(body, (bytes, str)) else None
    except Exception:
        return None


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    tin = field_of(usage, "prompt_tokens")
    tout = field_of(usage, "completion_tokens")
    if tin is None and tout is None:  # the Responses API's names
        tin, tout = field_of(usage, "input_tokens"), field_of(usage, "output_tokens")
    return (
        tin if isinstance(tin, int) and not isinstance(tin, bool) else None,
        tout if isinstance(tout, int) and not isinstance(tout, bool) else None,
    )


def _call_dict(call: Any) -> dict[str, Any]:
    name, args, call_id = tool_call_parts(call)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _chat_message(out: Any) -> dict[str, Any] | None:
    choices = field_of(out, "choices")
    if not isinstance(choices, (list, tuple)) or not choices:
        return None
    msg = field_of(choices[0], "message")
    if msg is None:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": field_of(msg, "content")}
    calls = field_of(msg, "tool_calls")
    if calls:
        message["tool_calls"] = [_call_dict(c) for c in calls]
    return message


def _chat_stream(chunks: list[Any]) -> tuple[dict[str, Any] | None, Any, Any]:
    """(assistant message, usage, model) of a chat completion stream, from the chunks the host read."""
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = model = None
    for chunk in chunks:
        model = field_of(chunk, "model") or model
        usage = field_of(chunk, "usage") or usage
        choices = field_of(chunk, "choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            continue
        delta = field_of(choices[0], "delta")
        if delta is None:
            continue
        text = field_of(delta, "content")
        if isinstance(text, str):
            texts.append(text)
        for part in field_of(delta, "tool_calls") or ():
            index = field_of(part, "index")
            call = calls.setdefault(
                index if isinstance(index, int) else len(calls), {"id": None, "name": "", "args": []}
            )
            call["id"] = field_of(part, "id") or call["id"]
            fn = field_of(part, "function")
            if fn is not None:
                call["name"] += field_of(fn, "name") or ""
                piece = field_of(fn, "arguments")
                if isinstance(piece, str):
                    call["args"].append(piece)
    if not texts and not calls:
        return None, usage, model
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "".join(c["args"])}}
            for _, c in sorted(calls.items())
        ]
    return message, usage, model


def _responses_message(out: Any) -> dict[str, Any] | None:
    items = field_of(out, "output")
    if not isinstance(items, (list, tuple)) or not items:
        return None
    found = [m for m in responses_messages(None, items) if m.get("role") == "assistant"]
    if not found:
        return None
    message = found[0]
    for extra in found[1:]:
        message["content"] = content_text(message.get("content")) + content_text(extra.get("content")) or None
        message.setdefault("tool_calls", []).extend(extra.get("tool_calls") or [])
    return message


def _responses_stream(chunks: list[Any]) -> tuple[Any, str | None]:
    """(the final Response object, else None; the text deltas read) of a Responses stream."""
    final = None
    texts: list[str] = []
    for event in chunks:
        kind = field_of(event, "type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = field_of(event, "response")
        elif kind == "response.output_text.delta":
            delta = field_of(event, "delta")
            if isinstance(delta, str):
                texts.append(delta)
    return final, ("".join(texts) if texts else None)


def read_call(ev: LLMEvent) -> tuple[dict[str, Any] | None, Any, Any, Any]:
    """(response message, usage, served model, the response object to read token ids from) of a client event."""
    if ev.api == RESPONSES:
        out = ev.output
        if ev.chunks is not None:
            out, text = _responses_stream(list(ev.chunks))
            if out is None:
                return ({"role": "assistant", "content": text} if text else None), None, None, None
        out = _plain_response(out)
        return _responses_message(out), field_of(out, "usage"), field_of(out, "model"), None
    if ev.chunks is not None:
        message, usage, model = _chat_stream(list(ev.chunks))
        return message, usage, model, None  # a stream's chunks each hold only their own ids
    out = _plain_response(ev.output)
    if out is None:
        return None, None, None, None
    return _chat_message(out), field_of(out, "usage"), field_of(out, "model"), out


def request_messages(ev: LLMEvent) -> list[Any] | None:
    """What the call sent, as chat messages (None when the request was not a list the host handed over)."""
    request = ev.request
    if ev.api == RESPONSES:
        if request is None and not ev.kwargs.get("instructions"):
            return None
        return responses_messages(ev.kwargs.get("instructions"), request)
    return list(request) if isinstance(request, (list, tuple)) else None


def seen_messages(ev: LLMEvent, earlier: Sequence[LLMEvent] = ()) -> list[Any] | None:
    """What the model saw and said in this call: its request messages plus its response message. A Responses
    call that continues a conversation kept on the server (`previous_response_id`) is preceded by what that
    earlier response saw and said, when the earlier call is among `earlier` (the run's client calls before it);
    its own `instructions` replace the earlier ones, as the server does."""
    messages = request_messages(ev)
    if messages is None:
        return None
    previous = ev.kwargs.get("previous_response_id") if ev.api == RESPONSES else None
    if isinstance(previous, str) and previous:
        before = [e for e in earlier if e is not ev]
        found = next((e for e in reversed(before) if _response_id(e) == previous), None)
        if found is not None:
            chain = seen_messages(found, before[: before.index(found)]) or []
            if ev.kwargs.get("instructions"):
                chain = [m for m in chain if not (isinstance(m, dict) and m.get("role") == "system")]
                messages = [messages[0], *chain, *messages[1:]]
            else:
                messages = [*chain, *messages]
    message = read_call(ev)[0]
    return messages if message is None else [*messages, message]


def _response_id(ev: LLMEvent) -> str | None:
    """The id of the response a Responses call got (its streamed final response's, for a stream)."""
    if ev.api != RESPONSES:
        return None
    out = _responses_stream(list(ev.chunks))[0] if ev.chunks is not None else _plain_response(ev.output)
    rid = field_of(out, "id") if out is not None else None
    return rid if isinstance(rid, str) else None


def call_entry(ev: LLMEvent, v: Values) -> dict[str, Any]:
    """The `llm_calls` entry of a client event."""
    message, usage, served, out = read_call(ev)
    tokens_in, tokens_out = _usage(usage)
    model = served or ev.model
    entry: dict[str, Any] = {
        "model": None if model is None else v.text(model),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "latency_ms": None if ev.duration is None else round(ev.duration * 1000.0, 3),
        "output": None,
        "stream": bool(ev.stream),
        "api": ev.api,
    }
    if message is not None:
        content = message.get("content")
        entry["output"] = None if content is None else v.text(content_text(content))
        calls = message.get("tool_calls")
        if calls:
            entry["tool_calls"] = [
                {
                    "id": None if c["id"] is None else v.text(c["id"]),
                    "type": "function",
                    "function": {
                        "name": v.text(c["function"]["name"]),
                        "arguments": v.text(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
    request = ev.request
    if isinstance(request, (list, tuple)) and ev.api != RESPONSES:  # a chat request: the SDK's or LiteLLM's
        entry["prompt_messages"] = len(request)
    if ev.error:
        entry["error"] = v.text(ev.error)
    if out is not None:
        tokens = token_info(out)
    elif ev.chunks and ev.api != RESPONSES:  # a streamed chat completion: its chunks' ids, in order
        tokens = stream_token_info(list(ev.chunks))
    else:
        tokens = None
    if tokens is not None:
        entry.update(tokens.fields())
    return entry


def merged_entry(method_entry: dict[str, Any], inner: list[LLMEvent], v: Values) -> dict[str, Any]:
    """A hooked LLM method's entry with the client call(s) made inside it: the method's own figures stand
    (its latency covers the whole method; its token counts, cost and output where it has them); the client
    call (the last one that did not fail) adds what the method lacks, the token ids and its `api`."""
    ev = next((e for e in reversed(inner) if not e.error), inner[-1])
    client = call_entry(ev, v)
    out = dict(method_entry)
    for key, value in client.items():
        if key == "latency_ms" or value is None:
            continue
        if out.get(key) is None or key not in out:
            out[key] = value
    if len(inner) > 1:
        out["client_calls"] = len(inner)
    return out


def client_events(ev: LLMEvent) -> list[LLMEvent]:
    """The client events an LLM event stands for: itself when it is one, else the ones attached to it."""
    if ev.api is not None:
        return [ev]
    return list(ev.inner or ())


def tools_of(ev: LLMEvent) -> list[Any]:
    """The tools a client call offered, in the chat shape (a Responses function tool is flat)."""
    tools = ev.kwargs.get("tools") if isinstance(ev.kwargs, Mapping) else None
    if not isinstance(tools, (list, tuple)):
        return []
    out = []
    for tool in tools:
        if (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and "function" not in tool
            and isinstance(tool.get("name"), str)
        ):
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": fn})
        else:
            out.append(tool)
    return out
