"""KTO rows of a segment's traces made with Arrow and numpy, a run of traces at a time: what makes a columnar
build fast (`flowrl.data.columnar`).

The pipeline decides per trace, from its scalar columns, what the row-by-row build decides (filters, dedupe,
label, group, split) and hands over the traces of one segment that get rows (`Pending`). This module expands
them into one row per assistant step without a Python object per row: the prompt of a row is a slice of the
segment's `conv_messages` values (`take` over index ranges), its JSON line is joined from the messages' JSON
text and each trace's fixed pieces (`binary_join_element_wise`). Rows and lines are those of
`KTODatasetBuilder.trace_rows` written by `DiskSink.add`, byte for byte (tests/test_data_columnar.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(slots=True)
class Pending:
    """A trace that gets rows: its segment (`ColumnRows`), its row in the segment's table, and what the pipeline
    decided for it."""

    batch: Any
    row: int
    first: int  # the first assistant step with a row (`KTODatasetBuilder.first_row`)
    label: bool
    source: str
    split: str
    group_id: str
    trace_id: str
    reward: float | None


@dataclass
class Rows:
    """The rows of a run of traces, in the order the row-by-row build makes them."""

    table: Any  # pa.Table in the builder's features' schema
    lines: Any  # pa.StringArray: each row's JSON line, newline included
    split: Any  # np.ndarray of the rows' split names
    label: Any  # np.ndarray of bool
    dropped: int  # rows over max_chars
    used: int  # traces with at least one row


def kto_rows(table: Any, pending: list[Pending], max_chars: int | None, schema: Any) -> Rows:
    """The KTO rows of `pending` (traces of one segment, in listing order) from the segment's `table`
    (`conv_messages`, `conv_chars`, `conv_steps`, `conv_tools`, one chunk each)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    messages, chars, steps = (table.column(n).chunk(0) for n in ("conv_messages", "conv_chars", "conv_steps"))
    rows = np.array([p.row for p in pending], dtype=np.int64)
    first = np.array([p.first for p in pending], dtype=np.int64)

    # one row per assistant step from `first` on: parent (index into pending), step number, message index
    step_off = steps.offsets.to_numpy().astype(np.int64)
    count = step_off[rows + 1] - step_off[rows] - first
    parent = np.repeat(np.arange(len(pending)), count)
    within = np.arange(len(parent)) - np.repeat(np.cumsum(count) - count, count)
    step = first[parent] + within
    index = steps.values.to_numpy()[step_off[rows][parent] + step].astype(np.int64)

    # characters of the prompt (messages before `index`) and of the completion (message `index`)
    char_off = chars.offsets.to_numpy().astype(np.int64)[rows][parent]
    char_values = chars.values.to_numpy().astype(np.int64)
    prefix = np.concatenate([[0], np.cumsum(char_values)])
    completion_chars = char_values[char_off + index]
    fits = (
        np.ones(len(parent), dtype=bool)
        if max_chars is None
        else prefix[char_off + index] - prefix[char_off] + completion_chars <= max_chars
    )
    dropped = int(len(fits) - fits.sum())
    parent, step, index = parent[fits], step[fits], index[fits]
    used = int(np.unique(parent).size)

    start = messages.offsets.to_numpy().astype(np.int64)[rows][parent]
    prompt_off = np.concatenate([[0], np.cumsum(index)])
    gather = np.repeat(start - prompt_off[:-1], index) + np.arange(prompt_off[-1])
    texts = messages.values
    prompt_texts = texts.take(pa.array(gather))
    completion_texts = texts.take(pa.array(start + index))
    offsets = pa.array(prompt_off, pa.int32())
    n = len(parent)
    take = pa.array(parent)

    tools = table.column("conv_tools").chunk(0).take(pa.array(rows))
    tools_json = pc.if_else(pc.equal(tools, "null"), pa.scalar(None, pa.string()), tools)
    labels = np.array([p.label for p in pending], dtype=bool)
    columns = {
        "prompt": pa.ListArray.from_arrays(offsets, _json(prompt_texts)),
        "completion": pa.ListArray.from_arrays(pa.array(np.arange(n + 1), pa.int32()), _json(completion_texts)),
        "label": pa.array(labels[parent]),
        "tools": _json(tools_json.take(take)),
        "trace_id": pa.array([p.trace_id for p in pending], pa.string()).take(take),
        "group_id": pa.array([p.group_id for p in pending], pa.string()).take(take),
        "step": pa.array(step, pa.int32()),
        "reward": pa.array([p.reward for p in pending], pa.float64()).take(take),
        "label_source": pa.array([p.source for p in pending], pa.string()).take(take),
        "captured": pa.nulls(n, pa.json_()),
    }
    out = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)

    # the JSON line: '{"prompt":[' prompt '],"completion":[' completion mid step end
    mid = pc.binary_join_element_wise(
        pa.array([f'],"label":{"true" if p.label else "false"},"tools":' for p in pending]),
        tools,
        pa.array([f',"trace_id":{_text(p.trace_id)},"group_id":{_text(p.group_id)},"step":' for p in pending]),
        "",
    )
    end = pa.array(
        [f',"reward":{_text(p.reward)},"label_source":{_text(p.source)},"captured":null}}\n' for p in pending]
    )
    lines = pc.binary_join_element_wise(
        '{"prompt":[',
        pc.binary_join(pa.ListArray.from_arrays(offsets, prompt_texts), ","),
        '],"completion":[',
        completion_texts,
        mid.take(take),
        pc.cast(columns["step"], pa.string()),
        end.take(take),
        "",
    )
    splits = np.array([p.split for p in pending], dtype=object)
    return Rows(out, lines, splits[parent], labels[parent], dropped, used)


def _json(storage: Any) -> Any:
    import pyarrow as pa

    return pa.ExtensionArray.from_storage(pa.json_(), storage)


def _text(value: Any) -> str:
    return orjson.dumps(value).decode()
