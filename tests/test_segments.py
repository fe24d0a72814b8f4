"""SegmentStore: round trip, pushdown, side records, both layouts, compaction, hostile files, names, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("fsspec")

from flowrl.cli import main  # noqa: E402
from flowrl.data.synthetic import write_synthetic_store  # noqa: E402
from flowrl.errors import ConfigError, StoreError  # noqa: E402
from flowrl.store.files import TraceStore  # noqa: E402
from flowrl.store.opener import open_store  # noqa: E402
from flowrl.store.segments import SegmentStore, names  # noqa: E402
from flowrl.store.segments import compact as compact_mod  # noqa: E402
from flowrl.trace.schema import ExecutionTrace  # noqa: E402


def _trace(i: int, *, agent: str = "a", day: int = 1, **fields: object) -> ExecutionTrace:
    return ExecutionTrace(
        trace_id=f"t{i:04d}", agent_name=agent, timestamp=f"2026-03-{day:02d}T10:00:00", user_query=f"q{i}", **fields
    )


def _memory_url() -> str:
    return f"memory://seg-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["memory", "local"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _memory_url() if request.param == "memory" else str(tmp_path / "segstore")


def test_round_trip_buffered_then_flushed(spec: str) -> None:
    store = SegmentStore(spec, writer_id="w1", flush_rows=50)
    traces = [_trace(i, day=1 + i % 3) for i in range(120)]
    for t in traces[:10]:
        store.write(t)
    assert store.get("t0003").user_query == "q3" and store.exists("t0003")  # buffered, visible to this process
    store.write_many(traces[10:])
    store.close()
    again = SegmentStore(spec, writer_id="w2")
    assert again.count() == 120
    got = {t.trace_id: t for t in again.iter_traces()}
    assert got.keys() == {t.trace_id for t in traces} and got["t0042"].user_query == "q42"
    assert [t.date() for t in again.iter_traces()] == sorted(t.date() for t in traces)  # oldest day first
    assert again.find("t0042").endswith("#" + again.find("t0042").rsplit("#", 1)[1])
    assert again.read_path(again.find("t0042")).trace_id == "t0042"
    assert [t.trace_id for t in again.iter_traces(since="2026-03-02", until="2026-03-02")] == [
        t.trace_id for t in traces if t.date() == "2026-03-02"
    ]
    assert not again.problems
    with pytest.raises(StoreError, match="no trace"):
        again.get("nope")


def test_layout_is_date_partitioned_parquet_named_by_writer(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    with SegmentStore(tmp_path, writer_id="host-1") as store:
        store.write_many([_trace(1, day=1), _trace(2, day=2)])
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "segments").rglob("*.parquet"))
    assert [f.split("/")[1] for f in files] == ["date=2026-03-01", "date=2026-03-02"]
    for f in files:
        assert names.parse_object(f.rsplit("/", 1)[1], "parquet")[0] == "host-1"
        meta = pq.ParquetFile(tmp_path / f).metadata
        assert meta.row_group(0).column(0).compression == "ZSTD"
    assert not list((tmp_path / ".staging").iterdir())  # nothing left staged


def test_a_default_segment_is_one_row_group(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    with SegmentStore(tmp_path, writer_id="w") as store:  # flushes every FLUSH_ROWS (1,000) traces
        store.write_many([_trace(i) for i in range(1000)])
    (path,) = (tmp_path / "segments").rglob("*.parquet")
    meta = pq.ParquetFile(path).metadata
    assert (meta.num_rows, meta.num_row_groups) == (1000, 1)  # each group costs every column read its chunks


def test_filters_are_pushed_down_to_columns_and_partitions() -> None:
    spec = _memory_url()
    with SegmentStore(spec, writer_id="w") as store:
        store.write_many([_trace(i, agent="alpha", day=1) for i in range(300)])  # one row group
        store.flush()
        store.write_many([_trace(1000 + i, agent="beta", day=1) for i in range(300)])
        store.flush()
        store.write_many([_trace(2000 + i, agent="beta", day=2) for i in range(10)])
    reader = SegmentStore(spec, writer_id="r")
    reader.count()
    before = reader.scan_stats.row_groups_read
    got = list(reader.iter_traces(agent="alpha"))
    assert len(got) == 300 and {t.agent_name for t in got} == {"alpha"}
    assert reader.scan_stats.row_groups_read - before == 1  # only alpha's segment's group was decoded
    opened = reader.scan_stats.segments_opened
    assert len(list(reader.iter_traces(agent="beta", since="2026-03-02"))) == 10
    assert reader.scan_stats.segments_opened == opened  # the index was read once; no segment reopened
    assert list(reader.iter_traces(agent="nobody")) == []


def test_side_records_merge_latest_wins_and_manual_label_outranks_scores() -> None:
    spec = _memory_url()
    with SegmentStore(spec, writer_id="capture") as cap:
        cap.write_many([_trace(1), _trace(2)])
    with SegmentStore(spec, writer_id="scorer") as scorer:
        t = scorer.get("t0001")
        t.rewards, t.reward_score, t.label, t.label_source = {"x": 0.2}, 0.2, False, "engine"
        scorer.update(t)
    with SegmentStore(spec, writer_id="human") as human:
        human.label("t0001", True, "looks right")
    with SegmentStore(spec, writer_id="scorer2") as scorer:
        t = scorer.get("t0001")
        t.label, t.label_source, t.manual_review, t.reward_score = False, "engine", False, 0.9
        scorer.update(t)  # a re-score after the label: the score lands, the label stays
        stale = _trace(2)
        stale.reward_score = 0.5
        scorer.update(stale)
    reader = SegmentStore(spec, writer_id="reader")
    t1 = reader.get("t0001")
    assert (t1.label, t1.label_source, t1.review_notes, t1.reward_score) == (True, "manual", "looks right", 0.9)
    assert reader.get("t0002").reward_score == 0.5
    assert [t.trace_id for t in reader.iter_traces(label=True)] == ["t0001"]  # filters see the merged trace
    assert [t.trace_id for t in reader.iter_traces(min_reward=0.8)] == ["t0001"]
    segments = [p for p in reader._root.fs.find(reader._root.path) if p.endswith(".parquet")]
    assert len(segments) == 1  # never rewritten


def test_outcomes_are_side_records(spec: str) -> None:
    store = SegmentStore(spec, writer_id="w")
    store.record_outcome("t0001", success=True, reference="42")  # before the trace exists, durable at once
    store.write(_trace(1))
    store.close()
    reader = SegmentStore(spec, writer_id="r")
    assert [o.reference for o in reader.outcomes("t0001")] == ["42"]
    assert reader.get("t0001").outcomes[0].success is True


def test_both_layouts_read_and_open_store_picks_the_layout(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    TraceStore(root).write(_trace(1))
    assert isinstance(open_store(root), TraceStore)
    with SegmentStore(root, writer_id="w") as seg:
        seg.write(_trace(2))
    opened = open_store(root)
    assert isinstance(opened, SegmentStore)
    assert sorted(t.trace_id for t in opened.iter_traces()) == ["t0001", "t0002"] and not opened.problems
    json_store = TraceStore(root)  # the JSON layout keeps working beside segments, and says nothing of them
    assert [t.trace_id for t in json_store.iter_traces()] == ["t0001"] and not json_store.problems
    assert isinstance(open_store(_memory_url()), SegmentStore)
    assert isinstance(open_store(tmp_path / "new", layout="segments"), SegmentStore)
    assert isinstance(open_store(Path("memory://x")), SegmentStore)  # a URL folded by Path is mended
    with pytest.raises(ConfigError):
        open_store(tmp_path, layout="columns")


def test_hostile_files_under_segments_are_skipped_and_reported(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with SegmentStore(tmp_path, writer_id="w") as store:
        store.write(_trace(1))
    part = tmp_path / "segments" / "date=2026-03-01"
    (part / "evil-000001-0123456789ab.parquet").write_bytes(b"PAR1 not really")
    pq.write_table(pa.table({"trace_id": ["x"]}), part / "evil-000002-0123456789ab.parquet")
    (part / "upload.tmp").write_bytes(b"partial")
    (tmp_path / "segments" / "notadate").mkdir()
    os.mkfifo(part / "fifo-000003-0123456789ab.parquet")
    (part / "link-000004-0123456789ab.parquet").symlink_to(next(part.glob("w-*.parquet")))
    reader = SegmentStore(tmp_path, writer_id="r")
    assert [t.trace_id for t in reader.iter_traces()] == ["t0001"]
    messages = " | ".join(p.message for p in reader.problems)
    for text in ("not a Parquet file", "not a flowrl segment", "upload.tmp", "notadate", "FIFO", "symbolic link"):
        assert text in messages, text
    assert reader.count() == 1


def test_writer_ids_are_checked_and_names_never_collide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("", "../x", "a/b", "x" * 65, "-lead", "a b"):
        with pytest.raises(ConfigError, match="writer id"):
            SegmentStore(tmp_path, writer_id=bad)
    assert names.WRITER_ID.match(names.default_writer_id())
    assert SegmentStore(tmp_path).writer_id != SegmentStore(tmp_path).writer_id
    for spec in (str(tmp_path / "c"), _memory_url()):
        drawn = iter(["same-000001-000000000000.parquet"] * 2 + ["same-000002-000000000001.parquet"])
        monkeypatch.setattr(names, "object_name", lambda *_a, drawn=drawn: next(drawn))
        first, second = SegmentStore(spec, writer_id="same"), SegmentStore(spec, writer_id="same")
        first.write(_trace(1))
        first.flush()
        second.write(_trace(2))
        second.flush()  # its first name exists: refused, not replaced, and drawn again
        monkeypatch.undo()
        assert sorted(t.trace_id for t in SegmentStore(spec, writer_id="r").iter_traces()) == ["t0001", "t0002"]


def test_compact_in_place_keeps_everything_and_removes_json(tmp_path: Path) -> None:
    root = write_synthetic_store(tmp_path / "s", 60, n_tasks=6)
    before = {t.trace_id: t.to_dict() for t in TraceStore(root).iter_traces()}
    TraceStore(root).record_outcome(next(iter(before)), success=True)
    summary = compact_mod.compact(root, writer_id="compactor")
    assert summary.copied == 60 and summary.removed == 60
    assert not list(root.glob("????-??-??/*.json"))
    store = open_store(root)
    assert isinstance(store, SegmentStore)
    assert {t.trace_id: t.to_dict() for t in store.iter_traces()} == before
    assert store.get(next(iter(before))).outcomes[0].success is True  # `.outcomes/` still read


def test_compact_keep_json_and_into_another_root(tmp_path: Path) -> None:
    root = write_synthetic_store(tmp_path / "s", 20, n_tasks=4)
    ids = {t.trace_id for t in TraceStore(root).iter_traces()}
    TraceStore(root).label(sorted(ids)[0], True, "mine")
    assert compact_mod.compact(root, keep_json=True).removed == 0
    assert len(list(root.glob("????-??-??/*.json"))) == 20
    store = SegmentStore(root)
    assert store.count() == 20 and {t.trace_id for t in store.iter_traces()} == ids  # each once
    out = _memory_url()
    assert compact_mod.compact(root, out=out).copied == 20
    moved = SegmentStore(out)
    assert {t.trace_id for t in moved.iter_traces()} == ids and moved.get(sorted(ids)[0]).review_notes == "mine"


def test_interrupted_compact_leaves_everything_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_synthetic_store(tmp_path / "s", 40, n_tasks=4)
    before = {t.trace_id: t.to_dict() for t in TraceStore(root).iter_traces()}

    def crash(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(compact_mod, "_verify", crash)  # killed after the segments, before any removal
    with pytest.raises(KeyboardInterrupt):
        compact_mod.compact(root)
    monkeypatch.undo()
    assert {t.trace_id: t.to_dict() for t in SegmentStore(root).iter_traces()} == before
    real_unlink, removed = os.unlink, []

    def unlink_some(path: str) -> None:  # killed halfway through the removals
        if len(removed) == 15:
            raise KeyboardInterrupt
        removed.append(path)
        real_unlink(path)

    monkeypatch.setattr(compact_mod.os, "unlink", unlink_some)
    with pytest.raises(KeyboardInterrupt):
        compact_mod.compact(root)
    monkeypatch.undo()
    assert {t.trace_id: t.to_dict() for t in SegmentStore(root).iter_traces()} == before
    compact_mod.compact(root)  # run again: completes
    store = SegmentStore(root)
    assert {t.trace_id: t.to_dict() for t in store.iter_traces()} == before and store.count() == 40
    assert not list(root.glob("????-??-??/*.json")) and not store.problems


def test_a_json_file_rewritten_after_compaction_is_the_copy_read(tmp_path: Path) -> None:
    root = tmp_path / "s"
    TraceStore(root).write(_trace(1))
    compact_mod.compact(root, keep_json=True)
    later = _trace(1)
    later.user_query = "edited later"
    TraceStore(root).update(later)
    assert SegmentStore(root).get("t0001").user_query == "edited later"


def test_capture_hook_flushes_into_a_segment_store() -> None:
    from flowrl.capture import hook_into_agent

    class Agent:
        async def run(self, query: str) -> str:
            return query.upper()

    spec = _memory_url()
    store = open_store(spec, writer_id="cap")
    agent = Agent()
    hook = hook_into_agent(agent, store=store, run_methods=["run"])
    try:
        for i in range(5):
            asyncio.run(agent.run(f"q{i}"))
        assert hook.flush(10)
    finally:
        hook.unhook()
    fresh = SegmentStore(spec, writer_id="r")
    assert sorted(t.user_query for t in fresh.iter_traces()) == [f"q{i}" for i in range(5)]


def test_cli_ls_build_dataset_and_compact_on_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_synthetic_store(tmp_path / "s", 80, n_tasks=8)
    assert main(["compact", "--store", str(root)]) == 0
    assert "compacted 80 traces" in capsys.readouterr().out
    assert main(["traces", "ls", "--ids", "--limit", "0", "--store", str(root)]) == 0
    assert len(capsys.readouterr().out.split()) == 80
    out = tmp_path / "ds"
    assert main(["build-dataset", "--method", "sft", "--store", str(root), "--out", str(out), "-q"]) == 0
    meta = json.loads((out / "flowrl_dataset.json").read_text()) if (out / "flowrl_dataset.json").exists() else None
    printed = capsys.readouterr().out
    assert "sft dataset:" in printed and (meta is None or sum(meta["counts"].values()) > 0)
    url = _memory_url()
    assert main(["compact", "--store", str(root), "--out", url]) == 0
    capsys.readouterr()
    assert main(["traces", "ls", "--store", url]) == 0
    assert "80 traces under memory://" in capsys.readouterr().out
