"""Langfuse observations and scores (issue 16): the real Langfuse SDK v3's output, recorded by
tests/fixtures/langfuse/produce.py, ingests into complete traces whose scores become host outcomes; and the SDK
pointed at `flowrl serve-otlp` (LANGFUSE_HOST) delivers both there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.ingest import langfuse
from flowrl.ingest.api import ingest_paths
from flowrl.ingest.discover import LANGFUSE, OTLP, classify, classify_explicit
from flowrl.ingest.otlp import read_otlp
from flowrl.store.files import TraceStore

FIXTURES = Path(__file__).parent / "fixtures" / "langfuse"
OTEL_TRACE = json.loads((FIXTURES / "ingestion-1.json").read_text())["batch"][0]["body"]["traceId"]


def check_trace(trace) -> None:
    roles = [m["role"] for m in trace.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert trace.final_response == "It is 18C and sunny in Paris."
    (call,) = trace.tool_calls
    assert call.tool_name == "get_weather" and call.arguments == {"city": "Paris"}
    assert call.result == "18C and sunny" and call.call_id == "call_abc123" and call.duration_ms > 0
    assert [c.model for c in trace.llm_calls] == ["gpt-test-mini-2026-01-01"] * 2
    assert [(c.tokens_in, c.tokens_out) for c in trace.llm_calls] == [(40, 12), (70, 9)]
    assert trace.tools[0]["function"]["name"] == "get_weather"
    assert trace.agent_name == "weather-agent" and trace.session_id == "session-42"
    assert trace.run_id == OTEL_TRACE and trace.metadata["otlp"]["convention"] == ["langfuse"]


def test_the_recorded_otel_export_is_one_complete_trace() -> None:
    parsed = read_otlp(FIXTURES / "otel-1.pb")
    assert parsed.skipped == [] and len(parsed.traces) == 1
    check_trace(parsed.traces[0][1])
    assert parsed.traces[0][1].metadata["otlp"]["user_id"] == "user-7"


def test_scores_are_read_from_the_ingestion_batch_and_from_an_export() -> None:
    for name in ("ingestion-1.json", "scores-export.json"):
        got = langfuse.read_scores(FIXTURES / name)
        assert {s.name: s.value for s in got.scores} == {"correctness": 0.9, "helpful": 1.0}, name
        assert {s.trace_id for s in got.scores} == {OTEL_TRACE}
        assert got.notes == [langfuse.CATEGORICAL] and got.skipped == [langfuse.OUT_OF_RANGE]
    false = langfuse.scores_of([{"traceId": "ab" * 16, "name": "ok", "value": 0, "dataType": "BOOLEAN"}])
    assert false.scores[0].value == 0.0
    assert langfuse.scores_of([{"name": "x", "value": 1}]).skipped == [langfuse.NO_TRACE]


def test_files_are_recognised() -> None:
    assert classify(FIXTURES / "otel-1.pb") == OTLP
    assert classify(FIXTURES / "ingestion-1.json") == LANGFUSE
    assert classify_explicit(FIXTURES / "scores-export.json") == LANGFUSE


def test_flowrl_ingest_stores_the_trace_and_its_scores_as_outcomes(tmp_path: Path) -> None:
    src = tmp_path / "export"
    shutil.copytree(FIXTURES, src, ignore=shutil.ignore_patterns("*.py"))
    store = TraceStore(tmp_path / "traces")
    summary = ingest_paths([src], store)
    (trace,) = list(store.iter_traces())
    check_trace(trace)
    (outcome,) = store.outcomes(trace.trace_id)  # two files, the same scores: recorded once
    assert outcome.source == "langfuse" and outcome.rewards == {"correctness": 0.9, "helpful": 1.0}
    assert summary.skip_reasons[langfuse.OUT_OF_RANGE] == 2 and summary.notes[langfuse.CATEGORICAL] == 2
    again = ingest_paths([src], store)  # re-ingesting adds nothing
    assert again.new == 0 and len(store.outcomes(trace.trace_id)) == 1


def test_scores_of_a_trace_not_stored_are_counted(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    summary = ingest_paths([FIXTURES / "ingestion-1.json"], store)
    assert summary.skip_reasons[langfuse.NOT_STORED] == 2 and summary.rejected_count == 0


def post(url: str, body: bytes, ctype: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_serve_otlp_takes_the_langfuse_paths_scores_first_or_last(served) -> None:
    url, receiver, store = served
    status, reply = post(
        url + "/api/public/ingestion", (FIXTURES / "ingestion-1.json").read_bytes(), "application/json"
    )
    assert status == 207 and len(json.loads(reply)["successes"]) == 4  # before the trace: the scores wait
    otel = (FIXTURES / "otel-1.pb").read_bytes()
    assert post(url + "/api/public/otel/v1/traces", otel, "application/x-protobuf")[0] == 200
    (trace,) = list(store.iter_traces())
    check_trace(trace)
    assert store.outcomes(trace.trace_id)[0].rewards == {"correctness": 0.9, "helpful": 1.0}
    status, _ = post(url + "/api/public/ingestion", (FIXTURES / "ingestion-1.json").read_bytes(), "application/json")
    assert status == 207 and len(store.outcomes(trace.trace_id)) == 1  # a retried batch: recorded once
    assert receiver.stats.scores == 2 and post(url + "/api/public/ingestion", b"[]", "application/json")[0] == 400


LIVE = """
import importlib.util
spec = importlib.util.spec_from_file_location("langfuse_produce", {producer!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.run_against({host!r})
"""


def test_the_real_langfuse_sdk_pointed_at_serve_otlp(served) -> None:
    pytest.importorskip("langfuse")
    url, receiver, store = served  # LANGFUSE_HOST=url, any keys: the app sets nothing else
    script = LIVE.format(producer=str(FIXTURES / "produce.py"), host=url)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (trace,) = list(store.iter_traces())
    assert trace.final_response == "It is 18C and sunny in Paris." and len(trace.tool_calls) == 1
    assert trace.tool_calls[0].result == "18C and sunny" and trace.llm_calls[1].tokens_in == 70
    (outcome,) = store.outcomes(trace.trace_id)
    assert outcome.rewards == {"correctness": 0.9, "helpful": 1.0} and outcome.source == "langfuse"
    assert receiver.stats.bad_requests == 0
