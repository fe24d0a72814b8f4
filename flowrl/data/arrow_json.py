"""A dataset row's JSON line made from its Arrow form: what lets a build spool a row once, as Arrow, and write its
JSONL line later (`flowrl.data.spools`), the bytes `orjson.dumps(row)` gives.

Values become text a column at a time: Json values are their text, lists of them are joined, bools and integers
are cast; a string is quoted, and only one that needs escaping (a quote, a backslash, a control character) goes
through orjson; floats go through orjson as one numpy array (its float format is not Arrow's). Fields of other
types are refused: no builder's rows made with Arrow have them.
"""

from __future__ import annotations

from typing import Any

import orjson

_ESCAPED = r'[\x00-\x1f"\\]'  # what orjson escapes in a string


def lines(table: Any, schema: Any) -> Any:
    """Each row of `table` (`schema`'s fields) as its JSON line, newline included: a string array, one chunk."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pieces: list[Any] = []
    for i, field in enumerate(schema):
        pieces += [("{" if i == 0 else ",") + orjson.dumps(field.name).decode() + ":", _value(table, field)]
    joined = pc.binary_join_element_wise(*pieces, "}\n", "")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def sizes(table: Any, schema: Any) -> Any:
    """The byte length of each row's line (numpy int64), as `lines` makes it, without making the long values."""
    import numpy as np

    total = np.full(table.num_rows, 2, dtype=np.int64)  # "}\n"
    for field in schema:  # "{" or ",", the name, ":" and the value
        total += 2 + len(orjson.dumps(field.name)) + _size(table, field)
    return total


def _value(table: Any, field: Any) -> Any:
    """A field's JSON text per row (string array)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column, kind = table.column(field.name).combine_chunks(), field.type
    if isinstance(kind, pa.JsonType):
        return pc.fill_null(column.storage, "null")
    if pa.types.is_list(kind) and isinstance(kind.value_type, pa.JsonType):
        listed = pc.binary_join_element_wise("[", pc.binary_join(_list_values(column), ","), "]", "")
        return pc.if_else(pc.is_null(column), "null", listed)
    if pa.types.is_boolean(kind):
        return pc.fill_null(pc.if_else(column, "true", "false"), "null")
    if pa.types.is_integer(kind):
        return pc.fill_null(pc.cast(column, pa.string()), "null")
    if pa.types.is_string(kind):
        return _strings(column)
    if pa.types.is_float64(kind):  # float32's JSON differs between numpy and the row's Python float
        return _floats(column)
    raise ValueError(f"the field {field.name} ({kind}) cannot be written as JSON from Arrow: a builder bug, report it")


def _size(table: Any, field: Any) -> Any:
    """A field's JSON text length per row (numpy int64), as `_value` makes it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = field.type
    if isinstance(kind, pa.JsonType):  # measured, not copied: a row's tools can be long
        return _numpy(pc.fill_null(pc.binary_length(table.column(field.name).combine_chunks().storage), 4))
    if not (pa.types.is_list(kind) or pa.types.is_boolean(kind)):
        return _numpy(pc.binary_length(_value(table, field)))  # small values: made, then measured
    column = table.column(field.name).combine_chunks()
    is_null = _numpy(pc.cast(pc.is_null(column), pa.int64())) == 1
    if pa.types.is_boolean(kind):
        return np.where(is_null, 4, 4 + _numpy(pc.cast(pc.invert(column).fill_null(False), pa.int64())))
    values = _list_values(column)
    offsets = values.offsets.to_numpy().astype(np.int64)
    n = np.diff(offsets)
    inner = _numpy(pc.binary_length(values.values.slice(offsets[0], offsets[-1] - offsets[0])))
    starts = np.minimum(offsets[:-1] - offsets[0], len(inner))
    summed = np.add.reduceat(np.append(inner, 0), starts) * (n > 0) if len(n) else n
    return np.where(is_null, 4, 2 + summed + np.maximum(n - 1, 0))


def _list_values(column: Any) -> Any:
    """A list<Json> array with its values as text, nulls inside as "null" (and null lists as lists: the caller
    tests them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.values.storage
    return pa.ListArray.from_arrays(column.offsets, pc.fill_null(values, "null") if values.null_count else values)


def _strings(column: Any) -> Any:
    """JSON strings: quoted, escaped by orjson where needed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.binary_join_element_wise('"', column, '"', "")
    escaped = pc.fill_null(pc.match_substring_regex(column, _ESCAPED), False)
    if pc.any(escaped).as_py():
        rows = np.flatnonzero(_numpy(pc.cast(escaped, pa.int64())))
        texts = [orjson.dumps(v).decode() for v in column.take(pa.array(rows)).to_pylist()]
        text = pc.replace_with_mask(text, escaped, pa.array(texts, pa.string()))
    return pc.fill_null(text, "null")


def _floats(column: Any) -> Any:
    """JSON numbers as orjson writes them (null and NaN as null), from one orjson call over the column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(column):
        return pa.array([], pa.string())
    values = column.to_numpy(zero_copy_only=False)  # a null is NaN here: orjson writes both as null
    text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode()
    return pc.split_pattern(pa.array([text], pa.string()), ",").values


def _numpy(array: Any) -> Any:
    import numpy as np

    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)
