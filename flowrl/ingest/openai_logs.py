"""OpenAI chat-completions logs: one request and its response per JSON line.

Two shapes are read, told apart per line:

* `{"request": {...}, "response": {...}}`: stored completions exports and request/response loggers.
  Request: `request.messages`, `request.tools`, `request.model`; response: `response.choices[0].message`,
  `response.usage`, `response.model`.
* `{"messages": [...], "response": {...}, "model": ...}`: LiteLLM's `StandardLoggingPayload` (custom
  loggers, the S3/GCS/file callbacks). Tools from `model_parameters.tools` (or `tools`), tokens from
  `prompt_tokens` / `completion_tokens` (else the response's usage), latency `endTime - startTime`.

One trace per line: its `messages` are the request messages plus the response message (what the model
saw and said), `tools` the request's tool definitions, one `llm_calls` entry with model, tokens and
latency. Tool calls are the assistant tool calls in the messages joined to their results by id. A line
that is not such a record (no messages, no response message) is skipped and counted, never fatal.

Trace ids come from content (`chat_trace_id`), so re-ingesting a file adds nothing.

`chat_trace` (a trace from an OpenAI-format transcript) is shared with the OTLP reader (`flowrl.ingest.otlp`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import IngestError
from flowrl.ingest.times import epoch_time, valid_time
from flowrl.ingest.unpickler import read_bytes
from flowrl.trace.facts import tool_failed
from flowrl.trace.schema import ExecutionTrace, LLMCall, ToolCallTrace
from flowrl.trace.transcript import canonical_messages, content_text, parse_arguments, tool_call_parts

SNIFF_BYTES = 65536


@dataclass
class Parsed:
    """What a reader found in one file: (trace id, trace) pairs and skip reasons (one per record not read)."""

    traces: list[tuple[str, ExecutionTrace]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def chat_trace_id(namespace: str, *parts: Any) -> str:
    """A content id: sha256 over the namespace and the parts' JSON, 16 hex digits."""
    h = hashlib.sha256(namespace.encode())
    for part in parts:
        h.update(b"\x1f")
        h.update(json.dumps(part, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    n = _num(value)
    return None if n is None else int(n)


def joined_tool_calls(
    messages: list[dict[str, Any]], spans: dict[str, dict[str, Any]] | None = None
) -> list[ToolCallTrace]:
    """The assistant tool calls of `messages`, each with its result (the tool message with its id).
    `spans`: per call id (or tool name), what a tool span adds: `duration_ms`, `timestamp`, `error`."""
    results: dict[str, str] = {}
    for m in messages:
        if m.get("role") == "tool" and m.get("tool_call_id") is not None:
            results.setdefault(str(m["tool_call_id"]), content_text(m.get("content")))
    spans = spans or {}
    out: list[ToolCallTrace] = []
    for m in messages:
        if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list):
            continue
        for call in m["tool_calls"]:
            name, raw, call_id = tool_call_parts(call)
            extra = spans.get(call_id or "") or spans.get(name) or {}
            result = results.get(call_id or "")
            if result is None:
                result = str(extra.get("result") or "")
            error = extra.get("error")
            failed = bool(error) or bool(tool_failed(result, success=None))
            out.append(
                ToolCallTrace(
                    tool_name=name,
                    arguments=parse_arguments(raw),
                    result=result,
                    success=not failed,
                    duration_ms=float(extra.get("duration_ms") or 0.0),
                    error=(str(error) if error else result[:500]) if failed else None,
                    timestamp=str(extra.get("timestamp") or ""),
                    call_id=call_id,
                )
            )
    return out


def chat_trace(  # noqa: PLR0913  # keyword-only: the fields of one logged chat call
    *,
    trace_id: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    llm_calls: list[LLMCall],
    timestamp: str | None,
    duration_ms: float | None = None,
    session_id: str | None = None,
    agent_name: str | None = None,
    run_id: str | None = None,
    success: bool | None = None,
    status: str = "completed",
    rewards: dict[str, float | None] | None = None,
    tool_spans: dict[str, dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
) -> ExecutionTrace:
    """A trace (`source="import"`) from an OpenAI-format transcript and what is known about its model calls."""
    messages = canonical_messages(messages)
    user = [m for m in messages if m.get("role") == "user"]
    last = messages[-1] if messages else {}
    final = content_text(last.get("content")) if last.get("role") == "assistant" else ""
    tokens_in = [c.tokens_in for c in llm_calls if c.tokens_in is not None]
    tokens_out = [c.tokens_out for c in llm_calls if c.tokens_out is not None]
    return ExecutionTrace(
        trace_id=trace_id,
        session_id=session_id or "default",
        timestamp=timestamp or "",
        user_query=content_text(user[-1].get("content")) if user else "",
        tool_calls=joined_tool_calls(messages, tool_spans),
        final_response=final,
        total_tokens_in=sum(tokens_in) if tokens_in else None,
        total_tokens_out=sum(tokens_out) if tokens_out else None,
        execution_duration_ms=duration_ms,
        llm_calls_count=len(llm_calls),
        agent_name=agent_name,
        run_id=run_id,
        source="import",
        success=success,
        status=status,
        messages=messages,
        tools=tools,
        llm_calls=llm_calls,
        rewards=rewards or {},
        metadata=metadata or {},
    )


# ---------------------------------------------------------------------------------------------
# the file


def looks_like_log(record: Any) -> bool:
    """A chat-completions log record: request messages and a response (either shape above)."""
    if not isinstance(record, dict):
        return False
    request = record.get("request")
    if isinstance(request, dict) and isinstance(request.get("messages"), list):
        return isinstance(record.get("response"), dict)
    return isinstance(record.get("messages"), list) and isinstance(record.get("response"), (dict, str))


def sniff(head: bytes) -> bool:
    """Whether the first bytes of a file look like an OpenAI-format log (its first JSON line is a record)."""
    line = head.lstrip().split(b"\n", 1)[0]
    try:
        return looks_like_log(orjson.loads(line))
    except orjson.JSONDecodeError:  # a first line longer than the head: judge by its keys
        return b'"messages"' in line and b'"response"' in line and (b'"choices"' in line or b'"request"' in line)


def _response_body(response: Any) -> dict[str, Any]:
    if isinstance(response, str):
        try:
            response = json.loads(response)
        except ValueError:
            return {}
    if isinstance(response, dict) and isinstance(response.get("body"), dict):  # batch output lines
        response = response["body"]
    return response if isinstance(response, dict) else {}


def _time(value: Any) -> str | None:
    n = _num(value)
    if n is not None:
        return epoch_time(n)
    return valid_time(value)


def from_record(record: dict[str, Any], *, file: str, line: int) -> tuple[str, ExecutionTrace] | str:
    """A trace from one log record, or the reason it is skipped."""
    request = record.get("request") if isinstance(record.get("request"), dict) else record
    assert isinstance(request, dict)
    messages = request.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "OpenAI log line without request messages"
    response = _response_body(record.get("response"))
    choices = response.get("choices")
    message = (
        choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    )
    if not isinstance(message, dict):
        return "OpenAI log line without a response message (a failed or streamed call?)"
    out_message = {k: v for k, v in message.items() if v is not None and k in ("role", "content", "tool_calls")}
    out_message.setdefault("role", "assistant")
    params: dict[str, Any] = record["model_parameters"] if isinstance(record.get("model_parameters"), dict) else {}
    tools = request.get("tools") or params.get("tools") or []
    tools = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    usage: dict[str, Any] = response["usage"] if isinstance(response.get("usage"), dict) else {}
    model = response.get("model") or request.get("model") or record.get("model")
    start, end = _num(record.get("startTime")), _num(record.get("endTime"))
    latency = (end - start) * 1000.0 if start is not None and end is not None and end >= start else None
    if latency is None and _num(record.get("response_time")) is not None:
        latency = (_num(record.get("response_time")) or 0.0) * 1000.0
    call = LLMCall(
        model=str(model) if model else None,
        tokens_in=_int(usage.get("prompt_tokens", record.get("prompt_tokens"))),
        tokens_out=_int(usage.get("completion_tokens", record.get("completion_tokens"))),
        latency_ms=None if latency is None else round(latency, 3),
        output=content_text(out_message.get("content")) or None,
    )
    transcript = [*messages, out_message]
    tid = chat_trace_id("openai-log/1", call.model, canonical_messages(transcript), tools)
    when = (
        _time(record.get("startTime"))
        or _time(record.get("created_at"))
        or _time(response.get("created"))
        or _time(record.get("timestamp"))
    )
    metadata: dict[str, Any] = record["metadata"] if isinstance(record.get("metadata"), dict) else {}
    session = record.get("session_id") or metadata.get("session_id") or record.get("trace_id")
    failed = record.get("status") == "failure"
    trace = chat_trace(
        trace_id=tid,
        messages=transcript,
        tools=tools,
        llm_calls=[call],
        timestamp=when,
        duration_ms=call.latency_ms,
        session_id=str(session) if session else None,
        run_id=str(record.get("id") or response.get("id") or "") or None,
        success=False if failed else None,
        status="error" if failed else "completed",
        metadata={
            "openai_log": {
                "file": file,
                "line": line,
                "shape": "request/response" if request is not record else "litellm",
            }
        },
    )
    return tid, trace


def read_openai_log(path: Path, raw: bytes | None = None) -> Parsed:
    """Every record of an OpenAI-format JSONL (or one JSON record, or a JSON list of them)."""
    raw = read_bytes(path) if raw is None else raw
    if not raw.strip():
        raise IngestError(f"{path}: empty file")
    parsed = Parsed()
    records: list[tuple[int, Any]] = []
    try:
        whole = orjson.loads(raw)
        records = list(enumerate(whole, 1)) if isinstance(whole, list) else [(1, whole)]
    except orjson.JSONDecodeError:
        records = list(_lines(raw, parsed))
    if not any(looks_like_log(r) for _, r in records):
        raise IngestError(f"{path}: not an OpenAI chat-completions log (no line holds request messages and a response)")
    for n, record in records:
        if not isinstance(record, dict):
            parsed.skipped.append("OpenAI log line that is not a JSON object")
            continue
        got = from_record(record, file=path.name, line=n)
        if isinstance(got, str):
            parsed.skipped.append(got)
        else:
            parsed.traces.append(got)
    return parsed


def _lines(raw: bytes, parsed: Parsed) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, orjson.loads(line)
        except orjson.JSONDecodeError:
            parsed.skipped.append("line that is not valid JSON (truncated or corrupt)")
