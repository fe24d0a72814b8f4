"""OpenTelemetry traces of LLM agents (OTLP JSON, or OTLP protobuf) as flowrl traces.

Three modules: `otlp_spans` (an export -> spans), `genai_spans` (one LLM span -> messages, per convention) and this
one (spans -> agent runs -> traces).

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

from collections import defaultdict
from pathlib import Path
from typing import Any

from flowrl.errors import IngestError
from flowrl.ingest import langfuse
from flowrl.ingest.genai_spans import llm_span
from flowrl.ingest.openai_logs import Parsed, chat_trace, chat_trace_id
from flowrl.ingest.otlp_spans import Span, documents, spans_of
from flowrl.ingest.times import epoch_time
from flowrl.ingest.unpickler import read_bytes
from flowrl.trace.schema import ExecutionTrace

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
    docs, bad = documents(path, raw)
    spans = [s for doc in docs for s in spans_of(doc)]
    if not spans:
        raise IngestError(f"{path}: no OTLP spans in this file (expected TracesData JSON, one per line)")
    parsed = Parsed()
    if bad:
        parsed.notes.append("OTLP JSON line that could not be read (truncated or corrupt) was left out")
    traces_from_spans(spans, path.name, parsed)
    return parsed
