"""SideView: a store's side records held compactly and found by trace id (`flowrl.store.segments.sideview`)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from flowrl.store.segments import sideview
from flowrl.store.segments.sidecar import Record, patch_line
from flowrl.store.segments.sideview import SideView

REPO = Path(__file__).resolve().parents[1]


def _score(trace_id: str, score: float, at: int) -> bytes:
    fields = {
        "reward_score": score,
        "rewards": {"tool_success": score, "host_outcome": None},
        "reward_details": {"tool_success": {"calls": 2, "counted": 2, "failed": 0}},
        "label": score >= 0.5,
        "label_source": "engine",
    }
    return patch_line(trace_id, fields, False, at)


def test_side_records_are_held_compressed_and_give_a_fresh_body_each_read() -> None:
    lines = [patch_line(f"t{i}", {"reward_score": i / 10, "rewards": {"a": 1.0}}, False, 100 + i) for i in range(3)]
    view = SideView()
    view.add_object("side.jsonl", b"".join(lines), None)
    [(record, body)] = view.entries("t1")
    assert record.line == lines[1].rstrip(b"\n") and record.where == ("side.jsonl", 2)
    assert body == {"reward_score": 0.1, "rewards": {"a": 1.0}}
    body["reward_score"] = 9.0  # a merge pops and updates what it reads: the record is not changed
    assert view.entries("t1")[0][1]["reward_score"] == 0.1
    assert view.entries("t9") == []


def _measure_records(n: int) -> float:
    """Bytes a record SideView holds for `n` score patches, by tracemalloc. Run in a process of its own (the test
    below): tracemalloc counts every thread's allocations, and in a whole suite the threads earlier tests leave
    behind once pushed a 65-byte figure over 100."""
    objects = [
        b"".join(_score(f"{i:032x}", (i * 7919 % 1000) / 1000, 10**18 + i) for i in range(k, k + 1000))
        for k in range(0, n, 1000)
    ]
    warm = SideView()  # numpy's and pyarrow's lazy imports are not the view's
    warm.add_object("warm.jsonl", objects[0], None)
    assert warm.mask(["x"]).tolist() == [False] and warm.entries(f"{0:032x}")
    tracemalloc.start()
    try:
        view = SideView()
        before = tracemalloc.get_traced_memory()[0]
        for number, data in enumerate(objects):
            view.add_object(f"side-{number}.jsonl", data, None)
        assert view.mask([f"{i:032x}" for i in range(0, n, 7)]).all()  # sorted into the index
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(view) == n
    assert view.entries(f"{123:032x}")[0][1]["reward_score"] == 123 * 7919 % 1000 / 1000
    return held / n


def test_a_scored_store_s_records_take_little_memory() -> None:
    """A score patch per trace was ~0.8 KB held (a `Record`, its line, a list and dict entry per id): 0.8 GiB for a
    million scored traces. Now under 100 bytes a record (lines compressed, records in arrays)."""
    import subprocess
    import sys

    code = "from tests.test_segments_sideview import _measure_records; print(_measure_records(20_000))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    per_record = float(out.stdout.strip().splitlines()[-1])
    assert per_record < 100, f"{per_record:.0f} bytes a record"


def test_ids_with_one_hash_never_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sideview, "_key", lambda trace_id: 7)  # every id collides
    view = SideView()
    view.add_object("a.jsonl", _score("x", 0.1, 1) + _score("y", 0.9, 2) + _score("x", 0.3, 3), None)
    assert [body["reward_score"] for _r, body in view.entries("x")] == [0.1, 0.3]
    assert [body["reward_score"] for _r, body in view.entries("y")] == [0.9]
    assert view.entries("z") == []
    assert view.mask(["x", "z"]).tolist() == [True, True]  # "may have": z then goes the careful way and finds none


def test_records_added_between_reads_are_found_before_and_after_the_index_is_sorted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sideview, "_SORT_AT", 3)
    view = SideView()
    scores: dict[str, list[float]] = {}
    for step in range(60):  # a scoring loop: an object put, then reads, as `flowrl score` does
        ids = [f"t{(step * 5 + j) % 37}" for j in range(4)]
        data = b"".join(_score(tid, step / 100, step * 10 + j) for j, tid in enumerate(ids))
        view.add_object(f"side-{step:03d}.jsonl", data, None)
        for tid in ids:
            scores.setdefault(tid, []).append(step / 100)
        for tid in (ids[0], f"t{step % 37}", "missing"):
            assert [body["reward_score"] for _r, body in view.entries(tid)] == scores.get(tid, [])
    assert view.mask(sorted(scores) + ["missing"]).tolist() == [True] * len(scores) + [False]


def test_merge_order_is_time_then_object_then_line_across_objects_and_pending() -> None:
    view = SideView()
    view.add_object("b.jsonl", _score("t", 0.2, 5) + _score("t", 0.3, 9), None)
    view.add_object("a.jsonl", _score("t", 0.1, 5), None)  # same time as b's first: the object name decides
    pending = Record(7, ("pending", 0), "t", "patch", _score("t", 0.25, 7))
    view.add_pending(pending)
    assert [body["reward_score"] for _r, body in view.entries("t")] == [0.1, 0.2, 0.25, 0.3]
    assert view.mask(["t", "u"], "outcome").tolist() == [False, False]
    view.settle([pending], "c.jsonl", pending.line)
    entries = view.entries("t")
    assert [r.where for r, _body in entries] == [("a.jsonl", 1), ("b.jsonl", 1), ("c.jsonl", 1), ("b.jsonl", 2)]
    assert len(view) == 4


def test_lines_that_are_not_records_are_said_once_and_skipped(tmp_path: Path) -> None:
    said: list[str] = []
    data = b"\n".join(
        [
            b"not json",
            b'{"kind": "patch"}',
            b'{"kind": "patch", "trace_id": "t", "at": 1e300}',
            b'{"kind": "patch", "trace_id": "t", "at": 99999999999999999999999, "fields": {}}',
            b"",
            _score("t", 0.5, 1).rstrip(b"\n"),
            b"\r",
        ]
    )
    view = SideView()
    view.add_object("s.jsonl", data, lambda location, message: said.append(message))
    assert said == [
        "s.jsonl line 1: not JSON, skipped",
        "s.jsonl line 2: not a side record (patch or outcome), skipped",
        "s.jsonl line 3: not a side record (patch or outcome), skipped",
        "s.jsonl line 4: not a side record (patch or outcome), skipped",
    ]
    [(record, body)] = view.entries("t")
    assert record.where == ("s.jsonl", 6) and body["reward_score"] == 0.5


def test_plain_records_are_the_only_plain_patch_of_each_id(monkeypatch: pytest.MonkeyPatch) -> None:
    view = SideView()
    outcome = b'{"kind":"outcome","trace_id":"o","at":1,"outcome":{"kind":"x"}}\n'
    query = patch_line("q", {"query": "other"}, False, 1)  # a field the columns do not stand for
    data = _score("one", 0.7, 1) + _score("two", 0.1, 2) + _score("two", 0.2, 3) + outcome + query
    view.add_object("a.jsonl", data, None)
    view.add_pending(Record(4, ("pending", 0), "held", "patch", _score("held", 0.5, 4)))
    view.add_object("b.jsonl", _score("held", 0.4, 2), None)
    found = view.plain_records(["one", "two", "o", "q", "held", "none"]).tolist()
    assert found[0] == 0 and view.fields(found[0])["reward_score"] == 0.7
    assert found[1:] == [-1] * 5  # several, an outcome, not plain, one put and one pending, nothing
    monkeypatch.setattr(sideview, "_key", lambda trace_id: 7)
    crowded = SideView()
    crowded.add_object("c.jsonl", _score("x", 0.1, 1), None)
    assert crowded.plain_records(["y", "x"]).tolist() == [-1, 0]  # x's record, found by y's hash, is not y's


VALUES = {
    "label": [None, True, False],
    "label_source": [None, "manual", "engine"],
    "manual_review": [True, False],
    "reward_score": [None, 0.25, 1, 0.75],
    "rewards": [{}, {"tool_success": 0.5, "host_outcome": None}, {"code": 0}],
    "review_notes": [None, "checked"],
    "reward_details": [None, {"tool_success": {"calls": 2}}],
}


def test_plain_patches_merged_in_bulk_as_one_by_one() -> None:
    """`sideview.merge_columns` gives what `sidecar.merge_patch` gives, for every kind of base and patch: a person's
    label kept against a patch that is not manual, the patch's values winning otherwise."""
    import random

    from flowrl.store.segments.plain import COLUMNS
    from flowrl.store.segments.sidecar import merge_patch
    from flowrl.store.segments.sideview import merge_columns

    rng = random.Random(5)
    view = SideView()
    ids, bases, patches = [], [], []
    for i in range(600):
        base = {name: rng.choice(VALUES[name]) for name in COLUMNS}
        fields = {name: rng.choice(VALUES[name]) for name in VALUES if rng.random() < 0.5}
        manual = rng.random() < 0.3
        ids.append(f"t{i}")
        bases.append(base)
        patches.append((fields, manual))
        view.add_object(f"s{i}.jsonl", patch_line(f"t{i}", fields, manual, i), None)
    columns = {name: [base[name] for base in bases] for name in COLUMNS}
    table = pa.table(
        {
            **{
                name: pa.array(columns[name], type=pa.float64() if name == "reward_score" else None) for name in COLUMNS
            },
            "rewards": [orjson.dumps(r).decode() for r in columns["rewards"]],  # JSON text, as a segment holds them
        }
    )
    merged, out = merge_columns(view, ids, table)
    assert merged.all() and out is not None
    for i, (base, (fields, manual)) in enumerate(zip(bases, patches, strict=True)):
        want = dict(base)
        merge_patch(want, dict(fields), manual)
        got = {name: out[name][i] for name in COLUMNS}
        rewards = orjson.loads(got["rewards"]) if isinstance(got["rewards"], str) else dict(got["rewards"])
        assert rewards == want["rewards"], (base, fields, manual)
        assert {**got, "rewards": None} == {**{k: want[k] for k in COLUMNS}, "rewards": None}, (base, fields, manual)
        assert type(got["reward_score"]) is type(None if want["reward_score"] is None else 0.0)
        assert type(got["manual_review"]) is bool
    odd = table.slice(0, 1).set_column(1, "label_source", pa.array(["bot"]))  # a source the trace model refuses
    assert merge_columns(view, ids[:1], odd)[0].tolist() == [False]


@pytest.mark.parametrize(
    "fields",
    [
        {"label": 1},
        {"label": "true"},
        {"label_source": "bot"},
        {"manual_review": None},
        {"reward_score": "0.5"},
        {"reward_score": True},
        {"rewards": [0.5]},
        {"rewards": {"a": "high"}},
        {"rewards": {"a": False}},
        {"review_notes": 3},
        {"reward_details": []},
        {"success": "yes"},
        {"status": 1},
        {"facts": {}},
        {"query": "a field the columns do not stand for"},
        {"reward_score": 0.5, "reward_details": {}, "status": None, "steps": []},
    ],
)
def test_a_patch_with_a_value_the_trace_model_refuses_or_another_field_is_not_plain(fields: dict[str, object]) -> None:
    from flowrl.store.segments.plain import codes, is_plain

    assert codes(fields) is None and not is_plain(fields)


def test_plain_codes_say_what_a_patch_sets() -> None:
    from flowrl.store.segments.plain import codes

    assert codes({}) == (0, pytest.approx(float("nan"), nan_ok=True))
    every = {"label": True, "label_source": "manual", "manual_review": False, "reward_score": 1, "rewards": {}}
    extras = {"review_notes": None, "reward_details": {}, "success": True, "status": "done", "facts": None}
    assert codes({**every, **extras, "trace_id": "t"}) == (3 | 2 << 2 | 2 << 4, 1.0)
    assert codes({"label": None, "label_source": None, "reward_score": None}) == (
        1 | 1 << 2,
        pytest.approx(float("nan"), nan_ok=True),
    )
