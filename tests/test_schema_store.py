from __future__ import annotations

import json
import os
import shutil
from datetime import date
from pathlib import Path

import pytest

from flowrl.errors import SchemaError, StoreError
from flowrl.store.files import TraceFilter, TraceStore
from flowrl.trace.facts import result_failed
from flowrl.trace.load import load_trace
from flowrl.trace.schema import SCHEMA_VERSION, ExecutionTrace, ToolCallTrace

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


def test_toolboxv2_rl_trace_files_load_unchanged() -> None:
    store = TraceStore(RL_TRACES)
    traces = {t.trace_id: t for t in store.iter_traces()}
    assert set(traces) == {"0498911e921f", "2a86d8ba994f", "eb4f7d6913ae"}
    t = traces["0498911e921f"]
    assert t.user_query == "What is the sum of squares from 1 to 10?"
    assert t.source == "import" and t.schema_version == SCHEMA_VERSION
    assert t.tool_calls[0].tool_name == "exec_code"
    assert store.problems == []


def test_upgrade_marks_traceback_results_as_failures() -> None:
    # eb4f7d6913ae: exec_code raised IndexError but FlowAgent reported success=True
    t = TraceStore(RL_TRACES).get("eb4f7d6913ae")
    assert [c.success for c in t.tool_calls] == [False, True]


def test_result_failed_rules() -> None:
    assert result_failed("Error executing fetch_stock: timeout")
    assert result_failed("System-Error: Invalid JSON in tool arguments")
    assert result_failed("{'success': True, 'output': 'Traceback (most recent call last):\\n ...'}")
    assert result_failed({"success": False})
    assert not result_failed("{'success': True, 'output': '385', 'error': None}")
    assert not result_failed("The error rate was 2%")


def test_write_is_atomic_and_round_trips(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    t = ExecutionTrace(
        user_query="hi",
        timestamp="2026-11-20T10:00:00",
        tool_calls=[ToolCallTrace(tool_name="x", arguments={"a": 1}, call_id="c1")],
    )
    path = store.write(t)
    assert path == tmp_path / "store" / "2026-11-20" / f"{t.trace_id}.json"
    assert list((tmp_path / "store" / ".staging").iterdir()) == []  # nothing half-written left behind
    back = store.get(t.trace_id)
    assert back == t


def test_unknown_fields_survive_a_round_trip(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    t = load_trace({"trace_id": "abc", "user_query": "q", "future_field": {"x": 1}})
    store.write(t)
    raw = json.loads(store.find("abc").read_text())
    assert raw["future_field"] == {"x": 1}


def test_newer_schema_version_is_a_clear_error() -> None:
    with pytest.raises(SchemaError, match="newer than this flowrl understands"):
        load_trace({"trace_id": "a", "schema_version": SCHEMA_VERSION + 1}, origin="x.json")


def test_corrupt_file_is_reported_by_name_and_skipped(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    good = ExecutionTrace(user_query="ok", timestamp="2026-11-21T00:00:00")
    store.write(good)
    day = tmp_path / "2026-11-21"
    (day / "broken.json").write_text('{"trace_id": "broken", "tool_calls": [')
    (day / "empty.json").write_text("")
    (day / "list.json").write_text("[1, 2]")
    (day / "badtype.json").write_text(json.dumps({"trace_id": "b", "tool_calls": "nope"}))
    got = list(store.iter_traces())
    assert [t.trace_id for t in got] == [good.trace_id]
    names = sorted(p.path.name for p in store.problems)
    assert names == ["badtype.json", "broken.json", "empty.json", "list.json"]
    assert all(p.path.name in p.message for p in store.problems)


def test_filters(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.write(
        ExecutionTrace(
            trace_id="a", timestamp="2026-11-01T00:00:00", agent_name="x", source="live", reward_score=0.9, label=True
        )
    )
    store.write(ExecutionTrace(trace_id="b", timestamp="2026-11-05T00:00:00", agent_name="y", source="checkpoint"))
    store.write(
        ExecutionTrace(
            trace_id="c", timestamp="2026-11-09T00:00:00", agent_name="x", source="live", reward_score=0.1, label=False
        )
    )

    def ids(**kw: object) -> list[str]:
        return [t.trace_id for t in store.iter_traces(**kw)]

    assert ids() == ["a", "b", "c"]
    assert ids(since="2026-11-02") == ["b", "c"]
    assert ids(until=date(2026, 11, 5)) == ["a", "b"]
    assert ids(agent="x") == ["a", "c"]
    assert ids(source="checkpoint") == ["b"]
    assert ids(has_reward=True) == ["a", "c"]
    assert ids(label=False) == ["c"]
    assert ids(min_reward=0.5) == ["a"]
    assert [t.trace_id for t in store.iter_traces(TraceFilter(labelled=False))] == ["b"]


def test_manual_label_is_recorded_in_place(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    t = ExecutionTrace(trace_id="t1", timestamp="2026-11-01T00:00:00")
    path = store.write(t)
    store.label("t1", False, "wrong answer")
    back = store.get("t1")
    assert (back.label, back.label_source, back.manual_review, back.review_notes) == (
        False,
        "manual",
        True,
        "wrong answer",
    )
    assert store.find("t1") == path


def test_missing_trace_and_bad_ids_are_clear_errors(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    with pytest.raises(StoreError, match="flowrl traces ls"):
        store.get("nope")
    with pytest.raises(StoreError, match="invalid trace id"):
        store.get("../etc/passwd")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_store_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="cannot write"):
            TraceStore(root).write(ExecutionTrace())
    finally:
        root.chmod(0o700)


def test_write_failure_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TraceStore(tmp_path)
    t = ExecutionTrace(trace_id="full", timestamp="2026-11-01T00:00:00")

    def boom(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(StoreError, match="No space left"):
        store.write(t)
    monkeypatch.undo()
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == []


def test_default_root_follows_flowrl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWRL_HOME", str(tmp_path))
    assert TraceStore.default().root == tmp_path / "traces"


def test_store_reads_a_copied_toolboxv2_store(tmp_path: Path) -> None:
    shutil.copytree(RL_TRACES, tmp_path / "rl")
    assert TraceStore(tmp_path / "rl").count() == 3


def test_write_many_stores_all_and_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TraceStore(tmp_path / "s")
    traces = [ExecutionTrace(trace_id=f"t{i}", timestamp="2026-11-01T00:00:00") for i in range(5)]
    paths = store.write_many(traces)
    assert [p.name for p in paths] == [f"t{i}.json" for i in range(5)]
    assert [t.trace_id for t in store.iter_traces()] == [f"t{i}" for i in range(5)]
    assert list(store.staging.iterdir()) == []

    real_replace = os.replace

    def fail_third(src: str, dst: object) -> None:
        if str(dst).endswith("u2.json"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_third)
    with pytest.raises(StoreError, match="No space left"):
        store.write_many([ExecutionTrace(trace_id=f"u{i}", timestamp="2026-11-02T00:00:00") for i in range(4)])
    assert list(store.staging.iterdir()) == []  # no temp file left behind
    for p in (tmp_path / "s" / "2026-11-02").glob("*.json"):
        assert store.read_path(p).trace_id in ("u0", "u1")  # what was renamed is whole
