"""`flowrl.data.arrow_json`: a row's JSON line made from its Arrow form is orjson's line for the row dict, byte for
byte, and `sizes` is its length without making it."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

pa = pytest.importorskip("pyarrow")


def _features() -> Any:
    from flowrl.methods import make_builder

    return make_builder("kto").features()  # Json, List(Json), bool, int32, string and float64 fields


def _rows(n: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    rows = []
    for i in range(n):
        messages = [{"role": "user", "content": 'a"\\é\n\x00 ☃' * rng.randint(0, 3)} for _ in range(rng.randint(0, 3))]
        rows.append(
            {
                "prompt": messages if i % 7 else None,
                "completion": [{"x": 1}, None] if i % 5 == 0 else [{"x": i}],
                "label": [True, False, None][i % 3],
                "tools": None if i % 2 else [{"t": "ü", "n": 1.5}],
                "trace_id": [f't"{i}\x01\u2028', f"plain-{i}", f"\x7f\\é{i}"][i % 3],
                "group_id": f"g{i % 4}",
                "step": [i, -i * 1000, None][i % 3],
                "reward": [0.1, None, 1e-7, 3.0, 1e300, -0.0, float("nan"), 1 / 3][i % 8],
                "label_source": [None, "manual", "reward>=0.5"][i % 3],
                "captured": None if i % 4 else {"call": {"id": i, "text": "é\n"}},
            }
        )
    return rows


def _table(rows: list[dict[str, Any]]) -> Any:
    from flowrl.data.spools import _arrow, _converter

    features = _features()
    schema = features.arrow_schema
    table = pa.Table.from_arrays(
        [_arrow([_converter(f)(r.get(n)) for r in rows], f) for n, f in features.items()], schema=schema
    )
    return pa.concat_tables([table.slice(0, 17), table.slice(17, 20), table.slice(37)]), schema


def test_lines_are_orjson_lines_of_the_rows_and_sizes_their_lengths() -> None:
    from flowrl.data.arrow_json import lines, sizes

    rows = _rows(60)
    table, schema = _table(rows)  # three chunks, sliced: offsets that do not start at 0
    want = [orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows]
    assert [v.encode() for v in lines(table, schema).to_pylist()] == want
    assert sizes(table, schema).tolist() == [len(w) for w in want]
    assert sizes(table.slice(0, 0), schema).tolist() == []
    assert lines(table.slice(0, 0), schema).to_pylist() == []


def test_a_field_arrow_cannot_write_as_orjson_does_is_refused() -> None:
    from flowrl.data.arrow_json import lines

    schema = pa.schema([pa.field("score", pa.float32())])  # numpy's float32 text is not the row's float's
    with pytest.raises(ValueError, match="the field score .* cannot be written as JSON from Arrow"):
        lines(pa.table({"score": pa.array([0.1], pa.float32())}), schema)
