"""The columnar build (flowrl.data.columnar) gives the row-by-row build's dataset byte for byte, on a segment
store holding every case a row can be in: patched by scoring and by a person, host outcomes, captured token
ids, JSON files beside the segments, a segment written before the derived columns, duplicates, filters."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from flowrl.data import DatasetFilter, DatasetPipeline, columnar
from flowrl.data.synthetic import synthetic_trace
from flowrl.methods import make_builder
from flowrl.schema import LLMCall
from flowrl.segments import SegmentStore
from flowrl.segments.format import FORMAT_KEY, SCALARS, TRACE_COLUMN
from flowrl.store import TraceStore


def _store(root: Path) -> SegmentStore:
    traces = [synthetic_trace(i, n_tasks=12) for i in range(240)]
    for trace in traces[200:210]:  # captured token ids: read whole (the ids are in the trace)
        steps = sum(m["role"] == "assistant" for m in trace.messages)
        trace.llm_calls = [
            LLMCall(prompt_token_ids=[1, 2, 3 + k], token_ids=[4, 5], tokenizer="tok@abc") for k in range(steps)
        ]
    traces[120].messages = []  # synthesised from tool calls and the final answer
    traces[121].agent_name = "other"
    duplicate = traces[5].model_copy(deep=True)
    duplicate.trace_id = "dup-of-5"
    traces.append(duplicate)
    store = SegmentStore(root, writer_id="a")
    store.write_many(traces[:100])
    store.flush()
    _downgrade_to_v1(root)  # the first segment as flowrl wrote it before the derived columns
    store.write_many(traces[100:])
    store.flush()
    for trace in traces[30:60]:  # what `flowrl score` leaves: patches of rewards and labels
        store.modify(trace.trace_id, lambda t: setattr(t, "reward_score", 0.05) or setattr(t, "label", None))
    store.label(traces[61].trace_id, True, "looks right")
    store.label(traces[62].trace_id, False)
    store.modify(traces[63].trace_id, lambda t: setattr(t, "user_query", "another task"))  # not a label: whole
    store.record_outcome(traces[64].trace_id, success=False)
    store.flush()
    TraceStore(root).write(synthetic_trace(500, n_tasks=12))  # the per-trace layout, read beside
    return store


def _downgrade_to_v1(root: Path) -> None:
    (path,) = list((root / "segments").rglob("*.parquet"))
    table = pq.read_table(path)
    table = table.select([*SCALARS, TRACE_COLUMN]).replace_schema_metadata({FORMAT_KEY: b"segment-v1"})
    path.unlink()
    pq.write_table(table, path.with_name(path.name.replace("-000001-", "-000099-")), compression="zstd")


def _build(store: Any, out: Path, *, row_by_row: bool, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Any:
    with monkeypatch.context() as m:
        if row_by_row:
            m.setattr(columnar, "reason_not", lambda *a: "off")
        method = options.pop("method", "kto")
        return DatasetPipeline(make_builder(method, **options.pop("builder", {})), **options).build(store, out)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"builder": {"rows": "final", "threshold": 0.5}},
        {"filters": DatasetFilter(agent="synthetic", min_reward=0.2, dedupe=False)},
        {"filters": DatasetFilter(label=True, since=date(2026, 11, 1)), "group_by": "group_key", "val_fraction": 0.3},
    ],
)
def test_the_columnar_build_is_the_row_by_row_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    store = _store(tmp_path / "store")
    fast = _build(store, tmp_path / "fast", row_by_row=False, monkeypatch=monkeypatch, **dict(options))
    slow = _build(store, tmp_path / "slow", row_by_row=True, monkeypatch=monkeypatch, **dict(options))
    assert fast.stats.columnar and not slow.stats.columnar
    if not options:  # read whole: the v1 segment's 100 rows, 10 with token ids, the JSON file, a query, an outcome
        assert fast.stats.read_whole == 100 + 10 + 1  # (the patched query and the outcome are in the v1 segment)
    for split in fast.counts:
        assert (fast.out / "data" / f"{split}.jsonl").read_bytes() == (
            slow.out / "data" / f"{split}.jsonl"
        ).read_bytes()
    assert fast.counts == slow.counts
    f, s = fast.stats.to_dict(), slow.stats.to_dict()
    for d in (f, s):
        d.pop("columnar"), d.pop("read_whole")
    assert f == s
    import datasets

    assert (
        datasets.load_from_disk(str(fast.out))["train"].to_list()
        == datasets.load_from_disk(str(slow.out))["train"].to_list()
    )


def test_labels_given_after_writing_reach_the_columnar_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path / "store")
    result = _build(store, tmp_path / "out", row_by_row=False, monkeypatch=monkeypatch)
    rows = {}
    for split in result.counts:
        for line in (result.out / "data" / f"{split}.jsonl").read_text().splitlines():
            import json

            row = json.loads(line)
            rows[row["trace_id"]] = row
    assert rows["syn0x0000061"]["label"] is True and rows["syn0x0000061"]["label_source"] == "manual"
    assert rows["syn0x0000062"]["label"] is False
    assert rows["syn0x0000030"]["reward"] == 0.05 and rows["syn0x0000030"]["label"] is False
    assert rows["syn0x0000064"]["label_source"] == "host"
    assert ("dup-of-5" in rows) != ("syn0x0000005" in rows)  # one of two equal runs
    assert rows["syn0x0000205"]["captured"]["call"]["completion_ids"] == [4, 5]


def test_a_grouped_method_or_a_json_store_builds_row_by_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path / "store")
    assert columnar.reason_not(make_builder("sft"), store, DatasetPipeline(make_builder("sft"))) is not None
    assert columnar.reason_not(make_builder("kto"), TraceStore(tmp_path / "j"), DatasetPipeline(make_builder("kto")))
    assert columnar.reason_not(make_builder("kto"), store, DatasetPipeline(make_builder("kto"))) is None
