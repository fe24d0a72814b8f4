"""`DecisionRow`: the row a segment store writes into its columns is the row a build computes from the trace."""

from __future__ import annotations

from pathlib import Path

from flowrl.data import columnar
from flowrl.data.synthetic import synthetic_trace
from flowrl.store.files import TraceFilter
from flowrl.store.segments import SegmentStore
from flowrl.trace.conversation import trace_conversation
from flowrl.trace.row import decision_row
from flowrl.trace.schema import ExecutionTrace


def _traces() -> list[ExecutionTrace]:
    traces = [synthetic_trace(i, n_tasks=5) for i in range(20)]
    traces[3].label, traces[3].label_source, traces[3].manual_review = False, "manual", True
    traces[4].reward_score, traces[4].rewards = 0.9, {"reference_answer": 0.0}
    traces[5].group_key = "g-5"
    traces[6].messages = traces[6].messages[:1]  # no assistant turn
    return traces


def test_the_row_read_from_a_segment_s_columns_is_the_row_of_the_parsed_trace(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path / "store")
    traces = _traces()
    store.write_many(traces)
    store.flush()
    read = {
        row.trace_id: row
        for item in columnar.items(store, TraceFilter(), [])
        if isinstance(item, columnar.Decided)
        for row in item.facts
    }
    assert len(read) == len(traces)
    for trace in traces:
        stored = store.get(trace.trace_id)
        assert read[trace.trace_id] == decision_row(stored, trace_conversation(stored, "dict"))


def test_a_row_s_label_is_the_trace_s_label() -> None:
    from flowrl.trace.facts import label_at

    for trace in _traces():
        row = decision_row(trace, trace_conversation(trace, "dict"))
        for threshold in (None, 0.5, 0.95):
            assert row.label_at(threshold) == label_at(trace, threshold)
