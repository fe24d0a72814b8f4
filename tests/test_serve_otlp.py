"""`flowrl serve-otlp` (issue 16): an application that only sets OTEL_EXPORTER_OTLP_ENDPOINT gets its agent runs
into the store. The producer is the real OpenTelemetry SDK with its real OTLP/HTTP protobuf exporter; the JSON
path is fed the real instrumentation output recorded in tests/fixtures/otlp/."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from flowrl.errors import ConfigError
from flowrl.ingest.otlp_receiver import OTLPReceiver, make_server
from flowrl.store.files import TraceStore

FIXTURES = Path(__file__).parent / "fixtures" / "otlp"


def post(url: str, body: bytes, ctype: str = "application/json", encoding: str = "") -> int:
    headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
    request = urllib.request.Request(url + "/v1/traces", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_real_sdk_exporter_pointed_at_it_by_the_environment_stores_the_run(served, monkeypatch) -> None:
    pytest.importorskip("opentelemetry.sdk")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    url, receiver, store = served
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)  # what the application sets, and nothing else
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-app"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))  # one request per span: child first
    tracer = provider.get_tracer("app")
    asked = [{"role": "user", "parts": [{"type": "text", "content": "Weather in Paris? sk-proj-" + "Ab12" * 10}]}]
    call = {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    with tracer.start_as_current_span("invoke_agent weather") as run:
        run.set_attribute("gen_ai.operation.name", "invoke_agent")
        run.set_attribute("gen_ai.agent.name", "weather")
        with tracer.start_as_current_span("chat m") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "m")
            chat.set_attribute("gen_ai.usage.input_tokens", 30)
            chat.set_attribute("gen_ai.usage.output_tokens", 9)
            chat.set_attribute("gen_ai.input.messages", json.dumps(asked))
            chat.set_attribute("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": [call]}]))
        with tracer.start_as_current_span("execute_tool get_weather") as tool:
            tool.set_attribute("gen_ai.operation.name", "execute_tool")
            tool.set_attribute("gen_ai.tool.name", "get_weather")
            tool.set_attribute("gen_ai.tool.call.id", "call_1")
        result = {"type": "tool_call_response", "id": "call_1", "response": "18 C, sunny"}
        with tracer.start_as_current_span("chat m") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "m")
            chat.set_attribute(
                "gen_ai.input.messages",
                json.dumps([*asked, {"role": "assistant", "parts": [call]}, {"role": "tool", "parts": [result]}]),
            )
            chat.set_attribute(
                "gen_ai.output.messages",
                json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "18 C and sunny."}]}]),
            )
        assert list(store.iter_traces()) == [] and receiver.waiting == 1  # the run's root span has not ended
    provider.shutdown()
    (trace,) = list(store.iter_traces())
    roles = [m["role"] for m in trace.messages]
    assert roles == ["user", "assistant", "tool", "assistant"] and trace.final_response == "18 C and sunny."
    assert trace.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert trace.tool_calls[0].tool_name == "get_weather" and trace.tool_calls[0].result == "18 C, sunny"
    assert "Ab12Ab12" not in trace.user_query and trace.agent_name == "weather"  # masked like every ingest
    assert trace.llm_calls[0].tokens_in == 30 and receiver.stats.written == 1 and receiver.stats.bad_requests == 0


def test_json_requests_gzip_and_duplicates(served) -> None:
    url, receiver, store = served
    lines = (FIXTURES / "openinference.jsonl").read_bytes().splitlines()
    for line in lines:
        assert post(url, line) == 200
    assert len(list(store.iter_traces())) == 1
    for line in lines:  # the exporter retried: the run is stored once
        assert post(url, gzip.compress(line), encoding="gzip") == 200
    assert len(list(store.iter_traces())) == 1 and receiver.stats.duplicates == 1


def test_what_is_not_an_otlp_export_is_refused_and_the_server_goes_on(served) -> None:
    url, receiver, store = served
    assert post(url, b"{not json") == 400
    assert post(url, b"[1, 2]") == 400
    assert post(url, b"x", ctype="text/plain") == 415
    assert post(url, b"x", encoding="gzip") == 400
    assert receiver.stats.bad_requests == 3
    assert post(url, (FIXTURES / "traceloop.jsonl").read_bytes().splitlines()[0]) == 200


def test_a_run_whose_root_never_comes_is_dropped_after_the_wait_and_counted(tmp_path: Path) -> None:
    now = [0.0]
    receiver = OTLPReceiver(TraceStore(tmp_path), pending_s=10.0, clock=lambda: now[0])
    line = (FIXTURES / "traceloop.jsonl").read_bytes().splitlines()[0]
    doc = json.loads(line)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                span["parentSpanId"] = span.get("parentSpanId") or "00f067aa0ba902b7"  # every span has a parent
    receiver.receive(json.dumps(doc).encode(), "application/json")
    assert receiver.waiting == 1
    now[0] = 11.0
    receiver.sweep()
    assert receiver.waiting == 0 and sum(receiver.stats.skipped.values()) == 1


def test_it_listens_on_localhost_unless_told() -> None:
    receiver = OTLPReceiver(TraceStore(Path("/nonexistent-store-not-created")))
    with pytest.raises(ConfigError, match="--allow-remote"):
        make_server(receiver, "0.0.0.0", 0)
