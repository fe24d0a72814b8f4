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
from flowrl.store.files import TraceStore
from flowrl.store.segments import SegmentStore
from flowrl.store.segments.format import FORMAT_KEY, SCALARS, TRACE_COLUMN
from flowrl.trace.schema import LLMCall


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
    for trace in traces[130:136]:  # the same in a segment with the derived columns: between rows decided by columns
        store.modify(trace.trace_id, lambda t: setattr(t, "reward_score", 0.9) or setattr(t, "label", None))
    store.label(traces[140].trace_id, False)
    store.modify(traces[141].trace_id, lambda t: setattr(t, "user_query", "a third task"))
    store.record_outcome(traces[142].trace_id, success=True)
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
        assert fast.stats.read_whole == 100 + 10 + 1 + 2  # (one query and one outcome in the v1 segment)
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


def test_the_progress_total_of_a_segment_store_is_its_listing(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    totals: set[int | None] = set()
    DatasetPipeline(make_builder("kto")).build(
        store, tmp_path / "out", on_progress=lambda stage, _done, total: stage == "read" and totals.add(total)
    )
    assert store.count_paths() == len(list(store.iter_paths())) == 242
    assert totals == {242}


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
    assert rows["syn0x0000130"]["reward"] == 0.9 and rows["syn0x0000130"]["label"] is True
    assert rows["syn0x0000140"]["label"] is False and rows["syn0x0000140"]["label_source"] == "manual"
    assert rows["syn0x0000142"]["label"] is True and rows["syn0x0000142"]["label_source"] == "host"
    assert ("dup-of-5" in rows) != ("syn0x0000005" in rows)  # one of two equal runs
    assert rows["syn0x0000205"]["captured"]["call"]["completion_ids"] == [4, 5]


def test_a_grouped_method_or_a_json_store_builds_row_by_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path / "store")
    assert columnar.reason_not(make_builder("sft"), store, DatasetPipeline(make_builder("sft"))) is not None
    assert columnar.reason_not(make_builder("kto"), TraceStore(tmp_path / "j"), DatasetPipeline(make_builder("kto")))
    assert columnar.reason_not(make_builder("kto"), store, DatasetPipeline(make_builder("kto"))) is None


def _segments(root: Path) -> SegmentStore:
    """Twelve segments, rows of every bucket in each, and runs with token ids between them (read whole by the
    pipeline's own process while the workers make the others)."""
    traces = [synthetic_trace(i, n_tasks=9) for i in range(300)]
    for trace in traces[::25]:
        steps = sum(m["role"] == "assistant" for m in trace.messages)
        trace.llm_calls = [LLMCall(prompt_token_ids=[1, 2], token_ids=[3]) for _ in range(steps)]
    store = SegmentStore(root, writer_id="w")
    for start in range(0, 300, 25):
        store.write_many(traces[start : start + 25])
        store.flush()
    return store


@pytest.mark.parametrize("options", [{}, {"builder": {"rows": "final"}, "val_fraction": 0.4, "seed": 3}])
def test_a_build_on_two_worker_processes_is_the_same_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    store = _segments(tmp_path / "store")
    pipeline = DatasetPipeline(make_builder("kto", **options.get("builder", {})), workers=2, **_rest(options))
    fast = pipeline.build(store, tmp_path / "fast")
    slow = _build(store, tmp_path / "slow", row_by_row=True, monkeypatch=monkeypatch, **dict(options))
    assert sorted(pipeline.worker_peaks) == [0, 1] and fast.stats.read_whole == 12
    assert len(list((fast.out / "train").glob("*.arrow"))) == 2  # each worker wrote half the buckets
    for split in fast.counts:
        assert (fast.out / "data" / f"{split}.jsonl").read_bytes() == (
            slow.out / "data" / f"{split}.jsonl"
        ).read_bytes()
    f, s = fast.stats.to_dict(), slow.stats.to_dict()
    for d in (f, s):
        d.pop("columnar"), d.pop("read_whole")
    assert f == s and fast.counts == slow.counts
    import datasets

    for split in fast.counts:
        assert (
            datasets.load_from_disk(str(fast.out))[split].to_list()
            == datasets.load_from_disk(str(slow.out))[split].to_list()
        )


def _rest(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "builder"}


def test_workers_are_said_to_be_unused_where_a_build_cannot_use_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _segments(tmp_path / "store")
    memory = SegmentStore("memory://flowrl-workers-test", writer_id="m")
    memory.write_many([synthetic_trace(i, n_tasks=9) for i in range(40)])
    memory.flush()
    for source, method, why in [(store, "sft", "groups runs"), (memory, "kto", "in this process's memory")]:
        caplog.clear()
        result = DatasetPipeline(make_builder(method), workers=2).build(source, tmp_path / f"out-{method}")
        assert sum(result.counts.values()) > 0
        (line,) = [r.getMessage() for r in caplog.records if "--workers" in r.getMessage()]
        assert "runs in one process" in line and why in line


def test_a_worker_that_fails_stops_the_build_with_its_error(tmp_path: Path) -> None:
    from flowrl.data.columnar_kto import Plan
    from flowrl.data.workers import SegmentTask, WorkerError, Workers

    schema = make_builder("kto").features().arrow_schema
    pool = Workers(1, str(tmp_path), schema, tmp_path / "tmp")
    try:
        missing = str(tmp_path / "gone.parquet")
        pool.submit(SegmentTask(missing, missing, Plan(*[None] * 7, 0, 0), ["train"], None, None))
        with pytest.raises(WorkerError, match=r"build worker 0 failed: .*gone\.parquet"):
            pool.spooled()
    finally:
        pool.terminate(wait=False)


def test_workers_start_asking_glibc_for_huge_pages_and_the_environment_is_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from flowrl.data.workers import _huge_pages

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    with _huge_pages():  # what a worker started here inherits
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert "GLIBC_TUNABLES" not in os.environ
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    with _huge_pages():
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"


def test_rows_with_only_label_and_reward_patches_are_decided_with_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "store")
    one_by_one: list[str] = []  # rows with side records, in segments with the derived columns, yielded alone
    items = columnar.items

    def spy(*args: Any) -> Any:
        for item in items(*args):
            if not isinstance(item, columnar.Decided) and "#" in item[0] and "-000099-" not in item[0]:
                if store.side_mask([store.read_path(item[0]).trace_id])[0]:  # not the v1 segment, not a JSON file
                    one_by_one.append(item[0])
            yield item

    monkeypatch.setattr(columnar, "items", spy)
    DatasetPipeline(make_builder("kto")).build(store, tmp_path / "out")
    # in the segment with the derived columns: 130-135 scored and 140 labelled by hand go in the columnar loop;
    # 141 (a patched query) and 142 (an outcome) go one by one; a scored store's rows no longer do
    assert len(one_by_one) == 2


def test_a_process_s_peak_memory_is_its_own_not_that_of_the_process_it_was_forked_from() -> None:
    """Linux keeps `ru_maxrss` across exec: a build started from a bench that held 500 MiB reported 500 MiB."""
    import subprocess
    import sys

    ballast = b"x" * (300 * 2**20)  # written, so resident
    child = "from flowrl.data.workers import peak_mib; print(peak_mib())"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout
    assert len(ballast) and float(out) < 250, out
