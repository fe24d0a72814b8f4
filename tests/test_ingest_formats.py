"""A new ingest format is one entry in `flowrl.ingest.discover.FORMATS`: found while walking, named on the
command line and read through the same path as OTLP and OpenAI logs."""

from __future__ import annotations

from pathlib import Path

import orjson

from flowrl.ingest import discover
from flowrl.ingest.api import ingest_paths
from flowrl.ingest.discover import FORMATS, Format, classify, classify_explicit
from flowrl.ingest.openai_logs import Parsed
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace


def _sniff(head: bytes) -> bool:
    return head.lstrip().startswith(b'{"made_up_log"')


def _read(path: Path, raw: bytes | None) -> Parsed:
    parsed = Parsed()
    for i, line in enumerate((raw if raw is not None else path.read_bytes()).splitlines()):
        record = orjson.loads(line)["made_up_log"]
        trace = ExecutionTrace(trace_id=f"made-up-{path.stem}-{i}", user_query=record["q"], final_response=record["a"])
        parsed.traces.append((trace.trace_id, trace))
    return parsed


def test_one_format_entry_is_read_like_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(discover, "FORMATS", (*FORMATS, Format("made-up-log", _sniff, _read, suffixes=(".mul",))))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "calls.jsonl").write_bytes(
        b'{"made_up_log": {"q": "2+2?", "a": "4"}}\n{"made_up_log": {"q": "hi", "a": "hello"}}\n'
    )
    (logs / "more.mul").write_bytes(b'{"made_up_log": {"q": "3+3?", "a": "6"}}\n')
    assert classify(logs / "calls.jsonl") == "made-up-log" and classify(logs / "more.mul") == "made-up-log"
    assert classify_explicit(logs / "calls.jsonl") == "made-up-log"

    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([logs], store)
    assert (summary.files_read, summary.new) == (2, 3)
    assert sorted(t.user_query for t in store.iter_traces()) == ["2+2?", "3+3?", "hi"]
