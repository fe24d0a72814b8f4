"""OpenTelemetry traces of LLM agents (OTLP JSON, or OTLP protobuf) as flowrl traces.

Files: the OTel Collector file exporter's form (one `TracesData` JSON per line), one `TracesData` (or
`ExportTraceServiceRequest`) JSON document, or the same serialized as protobuf (`.pb`/`.binpb`, needs
`opentelemetry-proto`). Ids may be hex (the Collector) or base64 (protobuf's JSON mapping).

Span conventions read, per LLM span (whichever the span carries):

| convention | messages | tools | model, tokens |
|---|---|---|---|
| OTel GenAI (current) | `gen_ai.input.messages` / `gen_ai.output.messages` (JSON, `parts`: text, tool_call, \
tool_call_response), `gen_ai.system_instructions` | `gen_ai.tool.definitions` | `gen_ai.response.model` / \
`gen_ai.request.model`, `gen_ai.usage.input_tokens` / `output_tokens` |
| OTel GenAI span events | events `gen_ai.{system,user,assistant,tool}.message`, `gen_ai.choice` | - | as above |
| flattened (traceloop, older) | `gen_ai.prompt.{i}.*`, `gen_ai.completion.{i}.*` | `llm.request.functions.{i}.*` | \
`gen_ai.usage.prompt_tokens` / `completion_tokens` |
| OpenInference | `llm.input_messages.{i}.message.*`, `llm.output_messages.{i}.message.*` | \
`llm.tools.{i}.tool.json_schema` | `llm.model_name`, `llm.token_count.prompt` / `completion` |
| Langfuse (SDK v3) | `langfuse.observation.input` / `.output` of a `generation` observation | the input's \
`tools` | `langfuse.observation.model.name`, `langfuse.observation.usage_details` |

One trace per agent run: each `invoke_agent` span (or OpenInference AGENT span, or Langfuse `agent`
observation) that is not inside another one; without such a span, the whole OTel trace. Its LLM spans in time
order give `llm_calls`; the last one's input messages plus its output message are the trace's `messages` (what
the model saw); tool spans (`execute_tool`, OpenInference TOOL, Langfuse `tool`) add durations and errors to the
tool calls, joined by call id (else tool name). `gen_ai.evaluation.result` events (and `gen_ai.evaluation.*`
attributes) become `rewards`; Langfuse scores, which do not travel with the spans, become host outcomes
(`flowrl.ingest.langfuse`).
A trace whose root span is not in the file yet (a file still being written) is skipped; the next read
takes it. Trace ids: `sha256("otlp-run/1", otel trace id, run span id)`, so re-ingesting adds nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import IngestError
from flowrl.ingest import langfuse
from flowrl.ingest.openai_logs import Parsed, chat_trace, chat_trace_id
from flowrl.ingest.times import epoch_time
from flowrl.ingest.unpickler import read_bytes
from flowrl.schema import ExecutionTrace, LLMCall
from flowrl.transcript import arguments_json, content_text

_HEX = re.compile(r"^[0-9a-fA-F]+$")
_STATUS_ERROR = (2, "STATUS_CODE_ERROR")


# ---------------------------------------------------------------------------------------------
# OTLP JSON -> spans


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start: int  # unix nanoseconds
    end: int
    attrs: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    error: str | None  # the status message of a span with status ERROR
    resource: dict[str, Any]
    children: list[Span] = field(default_factory=list)

    @property
    def op(self) -> str:
        return str(self.attrs.get("gen_ai.operation.name") or "")

    @property
    def oi_kind(self) -> str:
        return str(self.attrs.get("openinference.span.kind") or "").upper()

    @property
    def lf_kind(self) -> str:
        return langfuse.kind(self.attrs)

    @property
    def duration_ms(self) -> float | None:
        return round((self.end - self.start) / 1e6, 3) if self.end >= self.start > 0 else None


def any_value(value: Any) -> Any:
    """An OTLP `AnyValue` (JSON mapping) as a Python value."""
    if not isinstance(value, dict):
        return value
    for key, conv in (("stringValue", str), ("boolValue", bool), ("doubleValue", float)):
        if key in value:
            return conv(value[key])
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return attributes((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    return {str(kv.get("key")): any_value(kv.get("value")) for kv in items if isinstance(kv, dict)}


def otel_id(value: Any) -> str:
    """A trace or span id as lowercase hex (the Collector writes hex, protobuf's JSON mapping base64)."""
    if not isinstance(value, str) or not value:
        return ""
    if _HEX.match(value) and len(value) in (16, 32):
        return value.lower()
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value


def spans_of(doc: Any) -> list[Span]:
    """The spans of one `TracesData` / `ExportTraceServiceRequest` JSON document."""
    out: list[Span] = []
    if not isinstance(doc, dict):
        return out
    for rs in doc.get("resourceSpans") or doc.get("resource_spans") or []:
        if not isinstance(rs, dict):
            continue
        resource = attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or rs.get("scope_spans") or []:
            for s in (ss or {}).get("spans") or []:
                if not isinstance(s, dict):
                    continue
                status = s.get("status") or {}
                attrs = attributes(s.get("attributes"))
                events = [
                    (str(e.get("name") or ""), attributes(e.get("attributes")))
                    for e in s.get("events") or []
                    if isinstance(e, dict)
                ]
                out.append(
                    Span(
                        trace_id=otel_id(s.get("traceId") or s.get("trace_id")),
                        span_id=otel_id(s.get("spanId") or s.get("span_id")),
                        parent_id=otel_id(s.get("parentSpanId") or s.get("parent_span_id")),
                        name=str(s.get("name") or ""),
                        start=int(s.get("startTimeUnixNano") or s.get("start_time_unix_nano") or 0),
                        end=int(s.get("endTimeUnixNano") or s.get("end_time_unix_nano") or 0),
                        attrs=attrs,
                        events=events,
                        error=(str(status.get("message") or "error") if status.get("code") in _STATUS_ERROR else None)
                        or langfuse.error(attrs),
                        resource=resource,
                    )
                )
    return out


def sniff(head: bytes) -> bool:
    return b'"resourceSpans"' in head or b'"resource_spans"' in head


def _docs(path: Path, raw: bytes) -> tuple[list[Any], int]:
    """The JSON documents of the file, and how many lines could not be read."""
    if path.suffix in (".pb", ".binpb", ".protobuf"):
        return [from_protobuf(path, raw)], 0
    try:
        return [orjson.loads(raw)], 0
    except orjson.JSONDecodeError:
        pass
    docs, bad = [], 0
    for line in raw.splitlines():
        if line.strip():
            try:
                docs.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                bad += 1
    return docs, bad


def from_protobuf(path: Path, raw: bytes) -> Any:
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError as exc:
        raise IngestError(
            f"{path}: OTLP protobuf needs the opentelemetry-proto package (pip install opentelemetry-proto)"
        ) from exc
    msg = ExportTraceServiceRequest()  # the same wire format as TracesData (field 1: resource_spans)
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise IngestError(f"{path}: not an OTLP protobuf trace export ({exc})") from exc
    return MessageToDict(msg)  # bytes ids come back base64: otel_id reads them


# ---------------------------------------------------------------------------------------------
# one LLM span -> messages


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


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
    value = _json(value)
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
        body = _json(attrs.get("body") or attrs.get("gen_ai.event.content")) or attrs
        body = body if isinstance(body, dict) else {"content": body}
        if name in _EVENT_ROLES:
            msg = {"role": body.get("role") or _EVENT_ROLES[name], "content": content_text(_json(body.get("content")))}
            calls = _json(body.get("tool_calls"))
            if isinstance(calls, list) and calls:
                msg["tool_calls"] = calls
            if body.get("id") is not None and msg["role"] == "tool":
                msg["tool_call_id"] = body["id"]
            inputs.append(msg)
        elif name == "gen_ai.choice" and not outputs:
            message = _json(body.get("message")) or body
            if isinstance(message, dict):
                msg = {"role": message.get("role") or "assistant", "content": _json(message.get("content"))}
                calls = _json(message.get("tool_calls"))
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
    defs = _json(attrs.get("gen_ai.tool.definitions"))
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
        schema = _json(fields.get("tool.json_schema"))
        if isinstance(schema, dict):
            out.append(schema if "function" in schema or "type" in schema else {"type": "function", "function": schema})
    for fields in _indexed(attrs, "llm.request.functions.").values():
        fn: dict[str, Any] = {"name": str(fields.get("name") or "")}
        if fields.get("description"):
            fn["description"] = fields["description"]
        params = _json(fields.get("parameters"))
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
        system = _parts_messages([{"role": "system", "parts": _json(a.get("gen_ai.system_instructions"))}])
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


# ---------------------------------------------------------------------------------------------
# spans -> runs -> traces


def _is_run(span: Span) -> bool:
    return span.op == "invoke_agent" or span.oi_kind == "AGENT" or span.lf_kind == "agent"


def _walk(span: Span) -> list[Span]:
    out, stack = [], [span]
    while stack:
        s = stack.pop()
        out.append(s)
        stack.extend(s.children)
    return out


def _rewards(spans: list[Span]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for s in spans:
        found = [attrs for name, attrs in s.events if name.startswith("gen_ai.evaluation")]
        if "gen_ai.evaluation.name" in s.attrs:
            found.append(s.attrs)
        for attrs in found:
            name = attrs.get("gen_ai.evaluation.name")
            score = attrs.get("gen_ai.evaluation.score.value", attrs.get("gen_ai.evaluation.score"))
            if name:
                out[str(name)] = (
                    float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None
                )
    return out


def _tool_spans(spans: list[Span]) -> dict[str, dict[str, Any]]:
    """What tool spans add to the tool calls, by call id and by tool name (the first span of a name)."""
    out: dict[str, dict[str, Any]] = {}
    for s in sorted(spans, key=lambda s: s.start):
        if s.op != "execute_tool" and s.oi_kind != "TOOL" and s.lf_kind != "tool":
            continue
        name = s.attrs.get("gen_ai.tool.name") or s.attrs.get("tool.name") or s.name
        info = {
            "duration_ms": s.duration_ms,
            "timestamp": epoch_time(s.start / 1e9) or "",
            "error": s.error,
            "result": s.attrs.get("gen_ai.tool.call.result")
            or s.attrs.get("output.value")
            or s.attrs.get(langfuse.OUTPUT),
        }
        call_id = s.attrs.get("gen_ai.tool.call.id") or s.attrs.get("tool_call.id")
        if call_id:
            out.setdefault(str(call_id), info)
        out.setdefault(str(name), info)
    return out


def _run_trace(run: Span, spans: list[Span], file: str) -> tuple[str, ExecutionTrace] | str:
    calls = [c for c in (llm_span(s) for s in sorted(spans, key=lambda s: (s.start, s.end))) if c is not None]
    if not calls:
        return "OTel trace with no LLM span"
    with_content = [c for c in calls if c.inputs or c.output]
    if not with_content:
        return (
            "OTel trace whose LLM spans carry no messages (content capture is off in the instrumentation, "
            "or it writes content as log events, not on spans)"
        )
    last = with_content[-1]
    messages = [*last.inputs, *([last.output] if last.output else [])]
    tools: dict[str, dict[str, Any]] = {}
    for c in calls:
        for t in c.tools:
            tools[str((t.get("function") or t).get("name"))] = t
    tid = chat_trace_id("otlp-run/1", run.trace_id, run.span_id)
    a = {**run.resource, **run.attrs}
    session = _first(a, spans, "gen_ai.conversation.id", "session.id", "langfuse.session.id")
    user = _first(a, spans, "user.id", "langfuse.user.id") if any(s.lf_kind for s in spans) else None
    agent = (
        a.get("gen_ai.agent.name")
        or (run.name if run.lf_kind == "agent" else None)
        or _first(a, spans, "langfuse.trace.name")
        or run.resource.get("service.name")
    )
    error = run.error or next((c.span.error for c in calls if c.span.error), None)
    trace = chat_trace(
        trace_id=tid,
        messages=messages,
        tools=list(tools.values()),
        llm_calls=[c.call for c in calls],
        timestamp=epoch_time(run.start / 1e9),
        duration_ms=run.duration_ms,
        session_id=str(session) if session else None,
        agent_name=str(agent) if agent else None,
        run_id=run.trace_id or None,
        success=False if error else None,
        status="error" if error else "completed",
        rewards=_rewards(spans),
        tool_spans=_tool_spans(spans),
        metadata={
            "otlp": {
                "file": file,
                "trace_id": run.trace_id,
                "span_id": run.span_id,
                "span": run.name,
                "convention": sorted({c.convention for c in calls}),
                **({"user_id": str(user)} if user else {}),
                **({"error": error} if error else {}),
            }
        },
    )
    return tid, trace


def _first(attrs: dict[str, Any], spans: list[Span], *keys: str) -> Any:
    """The first of `keys` set on the run span (`attrs`), else on any of its spans."""
    for where in (attrs, *(s.attrs for s in spans)):
        for key in keys:
            if where.get(key):
                return where[key]
    return None


def traces_from_spans(spans: list[Span], file: str, parsed: Parsed) -> None:
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
    for trace_spans in by_trace.values():
        by_id = {s.span_id: s for s in trace_spans}
        roots = []
        for s in trace_spans:
            parent = by_id.get(s.parent_id) if s.parent_id else None
            if parent is not None and parent is not s:
                parent.children.append(s)
            else:
                roots.append(s)
        runs: list[Span] = []
        stack = list(roots)
        while stack:  # the outermost run spans
            s = stack.pop()
            if _is_run(s):
                runs.append(s)
            else:
                stack.extend(s.children)
        if not runs:
            if any(r.parent_id for r in roots):
                parsed.skipped.append("OTel trace whose root span is not in the file (yet)")
                continue
            runs = sorted(roots, key=lambda s: s.start)[:1]
            if len(roots) > 1:  # several parentless spans: one trace from all of them
                runs[0].children.extend(r for r in roots if r is not runs[0])
        for run in sorted(runs, key=lambda s: s.start):
            got = _run_trace(run, _walk(run), file)
            if isinstance(got, str):
                parsed.skipped.append(got)
            else:
                parsed.traces.append(got)


def read_otlp(path: Path, raw: bytes | None = None) -> Parsed:
    """The agent runs of an OTLP trace file (IngestError when it holds no OTLP traces at all)."""
    raw = read_bytes(path) if raw is None else raw
    if not raw.strip():
        raise IngestError(f"{path}: empty file")
    docs, bad = _docs(path, raw)
    spans = [s for doc in docs for s in spans_of(doc)]
    if not spans:
        raise IngestError(f"{path}: no OTLP spans in this file (expected TracesData JSON, one per line)")
    parsed = Parsed()
    if bad:
        parsed.notes.append("OTLP JSON line that could not be read (truncated or corrupt) was left out")
    traces_from_spans(spans, path.name, parsed)
    return parsed
