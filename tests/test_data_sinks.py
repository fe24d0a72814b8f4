"""The disk sink's order: a split written in order (validation) is spooled in buckets of `ORDERED_BUCKET` rows, so
that a finish holds one bucket, not the whole split, and the buckets shared out between processes still give the
rows in the order they came."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.data import sinks
from flowrl.data.sinks import DiskSink, Shuffle, ordered
from flowrl.data.spools import finish_part


def _features():  # type: ignore[no-untyped-def]
    from datasets import Features, Value

    return Features({"n": Value("int64"), "text": Value("string")})


def test_a_split_in_order_is_spooled_in_buckets_and_finished_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sinks, "ORDERED_BUCKET", 7)
    sink = DiskSink(tmp_path / "tmp", _features(), shuffle=set(), seed=0)
    for n in range(50):
        sink.add("validation", {"n": n, "text": "x" * n})
    parts, arrows = sink.plan(tmp_path / "out", processes=2)
    assert len(parts) == 2 and sum(len(p.buckets) for p in parts) == 8  # 50 rows in buckets of 7, on 2 processes
    for part in parts:
        finish_part(part, sink.features.arrow_schema)
    lines = (tmp_path / "out" / "data" / "validation.jsonl").read_text().splitlines()
    assert [json.loads(line)["n"] for line in lines] == list(range(50))
    import pyarrow as pa

    rows = [r for path in arrows["validation"] for r in pa.ipc.open_stream(str(path)).read_all().to_pylist()]
    assert [r["n"] for r in rows] == list(range(50))


def test_buckets_drawn_at_once_are_those_drawn_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sinks, "ORDERED_BUCKET", 7)
    for shuffle in (False, True):
        one, many = Shuffle(3, shuffle), Shuffle(3, shuffle)
        assert [one.bucket() for _ in range(40)] == many.take(15).tolist() + many.take(25).tolist()
    assert ordered(30, False, 0) == list(range(30))


def test_rows_made_with_arrow_spool_no_lines_and_mix_with_rows_added_one_by_one(tmp_path: Path) -> None:
    import numpy as np
    import pyarrow as pa

    sink = DiskSink(tmp_path / "tmp", _features(), shuffle={"train"}, seed=5)
    rows = [{"n": n, "text": f'say "{n}"' if n % 3 else None} for n in range(300)]
    for start in range(0, 300, 50):  # one by one, then as Arrow batches, in turn
        part = rows[start : start + 50]
        if start % 100:
            sink.add_batch(np.array(["train"] * 50), pa.Table.from_pylist(part, schema=sink.features.arrow_schema))
        else:
            for row in part:
                sink.add("train", row)
    parts, _arrows = sink.plan(tmp_path / "out", processes=2)
    spooled = sum(p.stat().st_size for p in (tmp_path / "tmp" / "spools").glob("*.spool"))
    assert spooled == sum(
        len(json.dumps(r, separators=(",", ":"))) + 1 for r in rows[:50] + rows[100:150] + rows[200:250]
    )
    for part in parts:
        finish_part(part, sink.features.arrow_schema)
    lines = (tmp_path / "out" / "data" / "train.jsonl").read_text().splitlines()
    assert sorted(lines) == sorted(json.dumps(r, separators=(",", ":")) for r in rows)  # shuffled, every byte


def test_rows_made_with_arrow_wait_and_reach_each_spool_in_few_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    import pyarrow as pa

    from flowrl.data import spools

    monkeypatch.setattr(spools, "WAIT_ROWS", 100)
    sink = DiskSink(tmp_path / "tmp", _features(), shuffle={"train"}, seed=1)
    for start in range(0, 400, 10):  # 40 batches of 10 rows, as 40 segments would give them
        part = [{"n": n, "text": str(n)} for n in range(start, start + 10)]
        sink.add_batch(np.array(["train"] * 10), pa.Table.from_pylist(part, schema=sink.features.arrow_schema))
    parts, _arrows = sink.plan(tmp_path / "out")
    for ipc in (tmp_path / "tmp" / "spools").glob("*.ipc"):
        assert pa.ipc.open_file(str(ipc)).num_record_batches <= 4  # one per 100 rows waited for, not one per 10
    for part in parts:
        finish_part(part, sink.features.arrow_schema)
    lines = (tmp_path / "out" / "data" / "train.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["n"] for line in lines) == list(range(400))
