"""One LLM span as chat messages, whichever convention it carries (the table in `flowrl.ingest.otlp`): the current
OTel GenAI attributes and span events, the older flattened `gen_ai.prompt.{i}.*`, OpenInference and Langfuse.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from flowrl.ingest import langfuse
from flowrl.ingest.langfuse import json_value
from flowrl.ingest.otlp_spans import Span
from flowrl.trace.schema import LLMCall
from flowrl.trace.transcript import arguments_json, content_text

# ---------------------------------------------------------------------------------------------
# one LLM span -> messages


def _parts_message(msg: dict[str, Any]) -> list[dict[str, Any]]:
    """An OTel GenAI message (`role`, `parts`) as OpenAI messages (a tool message per tool_call_response)."""
    role = str(msg.get("role") or "user")
    parts = msg.get("parts")
    if not isinstance(parts, list):
        return [{"role": role, "content": content_text(msg.get("content"))}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for p in parts:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "text":
            texts.append(str(p.get("content") or ""))
        elif kind == "tool_call":
            calls.append(
                {
                    "id": p.get("id"),
                    "type": "function",
                    "function": {"name": str(p.get("name") or ""), "arguments": arguments_json(p.get("arguments"))},
                }
            )
        elif kind == "tool_call_response":
            resp = p.get("response", p.get("result"))
            text = resp if isinstance(resp, str) else json.dumps(resp, ensure_ascii=False, default=str)
            results.append({"role": "tool", "tool_call_id": p.get("id"), "content": text})
    if results:
        return results
    out: dict[str, Any] = {"role": role, "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    return [out]


def _parts_messages(value: Any) -> list[dict[str, Any]] | None:
    value = json_value(value)
    if not isinstance(value, list):
        return None
    out: list[dict[str, Any]] = []
    for msg in value:
        if isinstance(msg, dict):
            out += _parts_message(msg)
    return out


def _indexed(attrs: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """`prefix.{i}.rest` attributes as {i: {rest: value}}, in index order."""
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    for key, value in attrs.items():
        if key.startswith(prefix):
            head, _, rest = key[len(prefix) :].partition(".")
            if head.isdigit():
                out[int(head)][rest] = value
    return dict(sorted(out.items()))


def _flat_message(fields: dict[str, Any], *, call_prefix: str, call_keys: tuple[str, str, str]) -> dict[str, Any]:
    """One flattened message (`role`, `content`, `tool_call_id`, tool calls under `call_prefix{j}.`)."""
    id_key, name_key, args_key = call_keys
    msg: dict[str, Any] = {"role": str(fields.get("role") or "user")}
    content = fields.get("content")
    if content is None:  # OpenInference content parts
        texts = [v for k, v in sorted(fields.items()) if k.endswith("message_content.text")]
        content = "".join(map(str, texts)) if texts else None
    calls = []
    for _, c in _indexed(fields, call_prefix).items():
        calls.append(
            {
                "id": c.get(id_key),
                "type": "function",
                "function": {"name": str(c.get(name_key) or ""), "arguments": arguments_json(c.get(args_key))},
            }
        )
    fn = fields.get("function_call.name")
    if fn and not calls:  # the legacy `function_call`
        calls.append(
            {
                "type": "function",
                "function": {"name": fn, "arguments": arguments_json(fields.get("function_call.arguments"))},
            }
        )
    msg["content"] = content if content is not None or calls else ""
    if calls:
        msg["tool_calls"] = calls
    if fields.get("tool_call_id") is not None:
        msg["tool_call_id"] = fields["tool_call_id"]
    if fields.get("name"):
        msg["name"] = fields["name"]
    return msg


_TRACELOOP = ("tool_calls.", ("id", "name", "arguments"))
_OPENINFERENCE = ("tool_calls.", ("tool_call.id", "tool_call.function.name", "tool_call.function.arguments"))


def _flat_messages(attrs: dict[str, Any], prefix: str, openinference: bool) -> list[dict[str, Any]]:
    call_prefix, keys = _OPENINFERENCE if openinference else _TRACELOOP
    out = []
    for fields in _indexed(attrs, prefix).values():
        if openinference:
            fields = {k.removeprefix("message."): v for k, v in fields.items()}
        out.append(_flat_message(fields, call_prefix=call_prefix, call_keys=keys))
    return out


_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def _event_messages(span: Span) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(input, output) from GenAI span events (the event attributes carry the body's fields)."""
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for name, attrs in span.events:
        body = json_value(attrs.get("body") or attrs.get("gen_ai.event.content")) or attrs
        body = body if isinstance(body, dict) else {"content": body}
        if name in _EVENT_ROLES:
            content = content_text(json_value(body.get("content")))
            msg = {"role": body.get("role") or _EVENT_ROLES[name], "content": content}
            calls = json_value(body.get("tool_calls"))
            if isinstance(calls, list) and calls:
                msg["tool_calls"] = calls
            if body.get("id") is not None and msg["role"] == "tool":
                msg["tool_call_id"] = body["id"]
            inputs.append(msg)
        elif name == "gen_ai.choice" and not outputs:
            message = json_value(body.get("message")) or body
            if isinstance(message, dict):
                msg = {"role": message.get("role") or "assistant", "content": json_value(message.get("content"))}
                calls = json_value(message.get("tool_calls"))
                if isinstance(calls, list) and calls:
                    msg["tool_calls"] = calls
                outputs.append(msg)
    return inputs, outputs


@dataclass
class LLMSpan:
    span: Span
    convention: str
    inputs: list[dict[str, Any]]
    output: dict[str, Any] | None
    tools: list[dict[str, Any]]
    call: LLMCall


def _tools(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    defs = json_value(attrs.get("gen_ai.tool.definitions"))
    out: list[dict[str, Any]] = []
    if isinstance(defs, list):
        for d in defs:
            if isinstance(d, dict):
                if "function" in d or d.get("type") not in (None, "function"):
                    out.append(d)
                else:  # the GenAI flat form: {type, name, description, parameters}
                    flat = {k: d[k] for k in ("name", "description", "parameters", "strict") if k in d}
                    out.append({"type": "function", "function": flat})
    for fields in _indexed(attrs, "llm.tools.").values():
        schema = json_value(fields.get("tool.json_schema"))
        if isinstance(schema, dict):
            out.append(schema if "function" in schema or "type" in schema else {"type": "function", "function": schema})
    for fields in _indexed(attrs, "llm.request.functions.").values():
        fn: dict[str, Any] = {"name": str(fields.get("name") or "")}
        if fields.get("description"):
            fn["description"] = fields["description"]
        params = json_value(fields.get("parameters"))
        if params is not None:
            fn["parameters"] = params
        out.append({"type": "function", "function": fn})
    return out


def llm_span(span: Span) -> LLMSpan | None:
    """The LLM call a span records, or None when it is no LLM span."""
    a = span.attrs
    inputs: list[dict[str, Any]] | None = None
    outputs: list[dict[str, Any]] | None = None
    if "gen_ai.input.messages" in a or "gen_ai.output.messages" in a:
        convention = "gen_ai"
        inputs = _parts_messages(a.get("gen_ai.input.messages")) or []
        outputs = _parts_messages(a.get("gen_ai.output.messages")) or []
        system = _parts_messages([{"role": "system", "parts": json_value(a.get("gen_ai.system_instructions"))}])
        if a.get("gen_ai.system_instructions") and system and not any(m["role"] == "system" for m in inputs):
            inputs = system + inputs
    elif any(k.startswith("llm.input_messages.") or k.startswith("llm.output_messages.") for k in a):
        convention = "openinference"
        inputs = _flat_messages(a, "llm.input_messages.", True)
        outputs = _flat_messages(a, "llm.output_messages.", True)
    elif any(k.startswith("gen_ai.prompt.") or k.startswith("gen_ai.completion.") for k in a):
        convention = "gen_ai-flat"
        inputs = _flat_messages(a, "gen_ai.prompt.", False)
        outputs = _flat_messages(a, "gen_ai.completion.", False)
    elif span.lf_kind == "generation":
        convention = "langfuse"
        inputs, outputs, lf_tools = langfuse.generation(a)
    elif any(name in _EVENT_ROLES or name == "gen_ai.choice" for name, _ in span.events):
        convention = "gen_ai-events"
        inputs, outputs = _event_messages(span)
    elif span.op in ("chat", "text_completion", "generate_content") or span.oi_kind == "LLM":
        convention = "no-content"
        inputs, outputs = [], []
    else:
        return None
    output = outputs[0] if outputs else None
    model = (
        a.get("gen_ai.response.model")
        or a.get("gen_ai.request.model")
        or a.get("llm.model_name")
        or a.get("langfuse.observation.model.name")
    )
    lf_in, lf_out = langfuse.usage(a)
    tokens_in = _int(a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
    tokens_out = _int(a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
    call = LLMCall(
        model=str(model) if model else None,
        tokens_in=tokens_in if tokens_in is not None else lf_in,
        tokens_out=tokens_out if tokens_out is not None else lf_out,
        latency_ms=span.duration_ms,
        output=(content_text(output.get("content")) or None) if output else None,
    )
    tools = _tools(a)
    if convention == "langfuse" and not tools:
        tools = lf_tools
    return LLMSpan(span, convention, inputs, output, tools, call)


def _int(attrs: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                return int(value)
            except ValueError:
                continue
    return None
