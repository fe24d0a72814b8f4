"""`flowrl ingest` of OTLP traces and OpenAI-format logs, with real producers.

The live tests run the real `openai` SDK against a fake OpenAI server on 127.0.0.1, instrumented by the real
instrumentation packages (traceloop's `opentelemetry-instrumentation-openai`, `openinference-instrumentation-openai`,
the OTel contrib `opentelemetry-instrumentation-openai-v2`), each in its own process
(`tests/fixtures/otlp/produce.py`), exporting OTLP JSON lines as the Collector's file exporter does. They skip
when a package is absent. The fixture tests read what those packages wrote when the fixtures were recorded
(the same script), so the readers stay tested without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flowrl.data import DatasetPipeline, KTODatasetBuilder, SFTDatasetBuilder
from flowrl.ingest import ingest_paths
from flowrl.ingest.discover import OPENAI_LOG, OTLP, classify, classify_explicit
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace

FIXTURES = Path(__file__).parent / "fixtures" / "otlp"
PRODUCE = FIXTURES / "produce.py"
SYSTEM = "You are a weather bot. Use tools."
QUERY = "What is the weather in Paris?"
ANSWER = "It is 18C and sunny in Paris."
MODEL = "gpt-test-mini-2026-01-01"

PRODUCERS = {  # producer -> (packages it needs, extra environment, fixture)
    "traceloop": (["opentelemetry.instrumentation.openai"], {}, "traceloop.jsonl"),
    "openinference": (["openinference.instrumentation.openai"], {}, "openinference.jsonl"),
    "genai-v2": (
        ["opentelemetry.instrumentation.openai_v2"],
        {
            "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
        },
        "openai_v2_span_only.jsonl",
    ),
}


def only_trace(store: TraceStore) -> ExecutionTrace:
    traces = list(store.iter_traces())
    assert len(traces) == 1, [t.trace_id for t in traces]
    return traces[0]


def check_weather_trace(t: ExecutionTrace, *, tools: bool = True) -> None:
    """Field by field: what the fake agent run did (`tools`: the producer records the tool definitions;
    opentelemetry-instrumentation-openai-v2 2.4b0 does not)."""
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert t.messages[0]["content"] == SYSTEM
    assert t.messages[1]["content"] == QUERY
    call = t.messages[2]["tool_calls"][0]
    assert call == {
        "id": "call_abc123",
        "type": "function",
        "function": {"name": "get_weather", "arguments": call["function"]["arguments"]},
    }
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert t.messages[3]["tool_call_id"] == "call_abc123" and t.messages[3]["content"] == "18C and sunny"
    assert t.messages[4]["content"] == ANSWER and not t.messages[4].get("tool_calls")
    assert t.user_query == QUERY and t.final_response == ANSWER
    assert t.tools == (
        []
        if not tools
        else [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            }
        ]
    )
    [tc] = t.tool_calls
    assert (tc.tool_name, tc.arguments, tc.result, tc.success, tc.call_id) == (
        "get_weather",
        {"city": "Paris"},
        "18C and sunny",
        True,
        "call_abc123",
    )
    assert tc.duration_ms > 0 and tc.timestamp  # from the execute_tool span
    assert [(c.model, c.tokens_in, c.tokens_out) for c in t.llm_calls] == [(MODEL, 40, 12), (MODEL, 70, 9)]
    assert all(c.latency_ms and c.latency_ms > 0 for c in t.llm_calls)
    assert t.llm_calls[1].output == ANSWER
    assert (t.total_tokens_in, t.total_tokens_out, t.llm_calls_count) == (110, 21, 2)
    assert t.execution_duration_ms and t.execution_duration_ms > 0
    assert t.agent_name == "weather-agent" and t.source == "import" and t.status == "completed"
    assert t.run_id and len(t.run_id) == 32 and t.metadata["otlp"]["span"] == "invoke_agent weather-agent"
    assert t.timestamp.startswith("20") and t.facts is not None


def check_rows(store: TraceStore, t: ExecutionTrace) -> None:
    """SFT and KTO rows built from the store hold the conversation."""
    store.label(t.trace_id, True)
    sft = DatasetPipeline(SFTDatasetBuilder(select="label"), val_fraction=0.0).to_dataset_dict(store)
    [row] = [dict(r) for split in sft.values() for r in split]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert row["messages"][-1]["content"] == ANSWER and row["tools"][0]["function"]["name"] == "get_weather"
    kto = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.0).to_dataset_dict(store)
    rows = [dict(r) for split in kto.values() for r in split]
    assert rows and all(r["label"] is True for r in rows)
    final = max(rows, key=lambda r: r["step"])  # the run's last step (the train split is shuffled)
    assert final["prompt"][0]["content"] == SYSTEM and final["prompt"][1]["content"] == QUERY
    assert final["completion"][-1]["content"] == ANSWER


def ingest_and_check(path: Path, tmp_path: Path, *, tools: bool = True) -> None:
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([path], store)
    assert (summary.new, summary.skipped, summary.rejected_count) == (1, 0, 0), summary.to_dict()
    t = only_trace(store)
    check_weather_trace(t, tools=tools)
    again = ingest_paths([path], store)  # idempotent
    assert (again.new, again.duplicate) == (0, 1)
    check_rows(store, t)


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_real_producer_round_trip(producer: str, tmp_path: Path) -> None:
    modules, env, _ = PRODUCERS[producer]
    for module in ["openai", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.common", *modules]:
        pytest.importorskip(module)
    out = tmp_path / "spans.jsonl"
    proc = subprocess.run(
        [sys.executable, str(PRODUCE), producer, str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert classify_explicit(out) == OTLP
    ingest_and_check(out, tmp_path, tools=producer != "genai-v2")


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_recorded_producer_output(producer: str, tmp_path: Path) -> None:
    ingest_and_check(FIXTURES / PRODUCERS[producer][2], tmp_path, tools=producer != "genai-v2")


def test_protobuf_file_gives_the_same_trace(tmp_path: Path) -> None:
    json_format = pytest.importorskip("google.protobuf.json_format")
    pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    request = pb2.ExportTraceServiceRequest()
    for line in (FIXTURES / "traceloop.jsonl").read_text().splitlines():
        part = pb2.ExportTraceServiceRequest()
        json_format.Parse(line, part)
        request.resource_spans.extend(part.resource_spans)
    pb = tmp_path / "spans.binpb"
    pb.write_bytes(request.SerializeToString())
    store = TraceStore(tmp_path / "store")
    assert ingest_paths([pb], store).new == 1
    check_weather_trace(only_trace(store))
    assert ingest_paths([FIXTURES / "traceloop.jsonl"], store).duplicate == 1  # same ids from JSON and protobuf


def test_walk_finds_otlp_and_logs_by_content(tmp_path: Path) -> None:
    (tmp_path / "export.json").write_bytes((FIXTURES / "openinference.jsonl").read_bytes())
    (tmp_path / "calls.ndjson").write_text(json.dumps(_request_response()) + "\n")
    (tmp_path / "other.jsonl").write_text('{"hello": 1}\n')
    assert classify(tmp_path / "export.json") == OTLP
    assert classify(tmp_path / "calls.ndjson") == OPENAI_LOG
    assert classify(tmp_path / "other.jsonl") is None
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([tmp_path], store)
    assert (summary.new, summary.rejected_count) == (2, 0)


# -- hand-written shapes (conventions no installed package writes any more) ------------------------


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _span(span_id: str, parent: str, name: str, t0: int, attrs: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "startTimeUnixNano": str(1767000000_000000000 + t0 * 1_000_000),
        "endTimeUnixNano": str(1767000000_000000000 + (t0 + 5) * 1_000_000),
        "attributes": [_kv(k, v) for k, v in attrs.items()],
        **kw,
    }


def _doc(*spans: dict[str, Any]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": list(spans)}]}]})


def test_flattened_gen_ai_prompt_convention_and_evaluation_rewards(tmp_path: Path) -> None:
    """traceloop before it moved to `gen_ai.input.messages`: `gen_ai.prompt.{i}.*` / `gen_ai.completion.{i}.*`."""
    first = {
        "gen_ai.request.model": "gpt-x",
        "gen_ai.prompt.0.role": "system",
        "gen_ai.prompt.0.content": SYSTEM,
        "gen_ai.prompt.1.role": "user",
        "gen_ai.prompt.1.content": QUERY,
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.tool_calls.0.id": "c1",
        "gen_ai.completion.0.tool_calls.0.name": "get_weather",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
        "llm.request.functions.0.name": "get_weather",
        "llm.request.functions.0.description": "Current weather for a city.",
        "llm.request.functions.0.parameters": '{"type": "object"}',
        "gen_ai.usage.prompt_tokens": 40,
        "gen_ai.usage.completion_tokens": 12,
    }
    second = {
        **{k: v for k, v in first.items() if not k.startswith("gen_ai.completion")},
        "gen_ai.prompt.2.role": "assistant",
        "gen_ai.prompt.2.tool_calls.0.id": "c1",
        "gen_ai.prompt.2.tool_calls.0.name": "get_weather",
        "gen_ai.prompt.2.tool_calls.0.arguments": '{"city": "Paris"}',
        "gen_ai.prompt.3.role": "tool",
        "gen_ai.prompt.3.tool_call_id": "c1",
        "gen_ai.prompt.3.content": "Error: city not found",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "I could not find it.",
    }
    evaluation = {
        "name": "gen_ai.evaluation.result",
        "timeUnixNano": "1",
        "attributes": [_kv("gen_ai.evaluation.name", "helpfulness"), _kv("gen_ai.evaluation.score.value", 0.25)],
    }
    path = tmp_path / "flat.jsonl"
    path.write_text(
        _doc(_span("0000000000000002", "0000000000000001", "openai.chat", 1, first))
        + "\n"
        + _doc(_span("0000000000000003", "0000000000000001", "openai.chat", 10, second))
        + "\n"
        + _doc(_span("0000000000000001", "", "agent run", 0, {}, events=[evaluation]))
        + "\n"
    )
    store = TraceStore(tmp_path / "store")
    assert ingest_paths([path], store).new == 1
    t = only_trace(store)
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert t.tools[0]["function"] == {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object"},
    }
    assert t.tool_calls[0].success is False and t.tool_calls[0].result == "Error: city not found"
    assert t.rewards == {"helpfulness": 0.25}
    assert t.metadata["otlp"]["convention"] == ["gen_ai-flat"]


def test_spans_without_content_or_root_are_skipped_not_fatal(tmp_path: Path) -> None:
    no_content = tmp_path / "a.jsonl"  # openai-v2's default: content goes to log events, not to the spans
    no_content.write_text(
        _doc(
            _span(
                "00000000000000a1",
                "",
                "chat gpt-x",
                0,
                {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 3},
            )
        )
    )
    orphan = tmp_path / "b.jsonl"  # the root span is not exported yet
    orphan.write_text(_doc(_span("00000000000000b2", "00000000000000b1", "chat", 0, {"gen_ai.input.messages": "[]"})))
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([no_content, orphan], store)
    assert (summary.new, summary.skipped, summary.rejected_count) == (0, 2, 0)
    assert any("content capture is off" in r for r in summary.skip_reasons)
    assert any("root span is not in the file" in r for r in summary.skip_reasons)


def test_unreadable_files_are_one_rejected_line_each(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_bytes((FIXTURES / "traceloop.jsonl").read_bytes())
    bad_pb = tmp_path / "x.binpb"
    bad_pb.write_bytes(b"\xff\xff\xff not protobuf")
    not_ours = tmp_path / "x.ndjson"
    not_ours.write_text('{"a": 1}\n')
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([good, bad_pb, not_ours], store)
    assert summary.new == 1 and summary.rejected_count == 2
    assert {Path(r.path).name for r in summary.rejected} == {"x.binpb", "x.ndjson"}
    assert all(Path(r.path).name in r.reason for r in summary.rejected)  # one line naming the file


# -- OpenAI-format logs ----------------------------------------------------------------------------


def _messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUERY + " My key is sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcd"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
    ]


_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _response() -> dict[str, Any]:
    return {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 1767000000,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 70, "completion_tokens": 9, "total_tokens": 79},
    }


def _request_response() -> dict[str, Any]:
    return {"request": {"model": "gpt-test-mini", "messages": _messages(), "tools": _TOOLS}, "response": _response()}


def _litellm() -> dict[str, Any]:
    return {
        "id": "litellm-1",
        "call_type": "completion",
        "status": "success",
        "model": "gpt-test-mini",
        "messages": _messages(),
        "response": _response(),
        "model_parameters": {"tools": _TOOLS},
        "prompt_tokens": 70,
        "completion_tokens": 9,
        "startTime": 1767000000.0,
        "endTime": 1767000000.25,
    }


@pytest.mark.parametrize("shape", ["request/response", "litellm"])
def test_openai_log_lines(shape: str, tmp_path: Path) -> None:
    record = _request_response() if shape == "request/response" else _litellm()
    path = tmp_path / "calls.jsonl"
    path.write_text(
        json.dumps(record) + "\n\n" + "{not json\n" + json.dumps({"request": {"messages": []}, "response": {}}) + "\n"
    )
    assert classify_explicit(path) == OPENAI_LOG
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([path], store)
    assert (summary.new, summary.skipped, summary.rejected_count) == (1, 2, 0), summary.to_dict()
    t = only_trace(store)
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert "sk-proj-" not in json.dumps(t.model_dump()) and summary.masked >= 1  # masked before it is written
    assert t.final_response == ANSWER and t.tools == _TOOLS
    assert t.tool_calls[0].tool_name == "get_weather" and t.tool_calls[0].result == "18C and sunny"
    [call] = t.llm_calls
    assert (call.model, call.tokens_in, call.tokens_out) == (MODEL, 70, 9)
    if shape == "litellm":
        assert call.latency_ms == 250.0 and t.session_id == "default"
    assert ingest_paths([path], store).new == 0
