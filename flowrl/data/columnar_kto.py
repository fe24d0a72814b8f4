"""KTO rows of a segment's traces made with Arrow and numpy, a run of traces at a time: what makes a columnar
build fast (`flowrl.data.columnar`).

The pipeline decides per trace, from its scalar columns, what the row-by-row build decides (filters, dedupe,
label, group, split) and hands over the traces of one segment that get rows (`Pending`). This module expands
them into one row per assistant step without a Python object per row: the prompt of a row is a slice of the
segment's `conv_messages` values (`take` over index ranges); its JSON line is made from that Arrow row when it
is written (`flowrl.data.arrow_json`). Rows and lines are those of `KTODatasetBuilder.trace_rows` written by
`DiskSink.add`, byte for byte (tests/test_data_columnar.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Pending:
    """The traces of one segment (`batch`, its `ColumnRows`) that get rows, in listing order: per trace, its row in
    the segment's table and what the pipeline decided for it (a list per field, not an object per trace)."""

    def __init__(self, batch: Any = None) -> None:
        self.batch = batch
        self.rows: list[int] = []
        self.first: list[int] = []  # the first assistant step with a row (`KTODatasetBuilder.first_row`)
        self.label: list[bool] = []
        self.source: list[str] = []
        self.split: list[str] = []
        self.group_id: list[str] = []
        self.trace_id: list[str] = []
        self.reward: list[float | None] = []

    def add(
        self,
        row: int,
        first: int,
        label: bool,
        source: str,
        split: str,
        group_id: str,
        trace_id: str,
        reward: float | None,
    ) -> None:
        self.rows.append(row)
        self.first.append(first)
        self.label.append(label)
        self.source.append(source)
        self.split.append(split)
        self.group_id.append(group_id)
        self.trace_id.append(trace_id)
        self.reward.append(reward)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class Plan:
    """The rows of a run of traces of one segment, in the order the row-by-row build makes them, before their
    text: made from the small columns (`conv_steps`, `conv_chars`) where the traces are decided; the text is
    added by `materialize`, in that process or another one (`flowrl.data.workers`)."""

    rows: Any  # numpy: each trace's row in the segment
    parent: Any  # numpy, per row: which trace
    step: Any  # numpy, per row: the assistant step's number
    index: Any  # numpy, per row: the completion's message index in its trace
    split: Any  # numpy, per row: the split
    label: Any  # numpy, per row: bool
    traces: dict[str, list[Any]]  # per trace: label, source, group_id, trace_id, reward
    dropped: int  # rows over max_chars
    used: int  # traces with at least one row


def plan(table: Any, pending: Pending, max_chars: int | None) -> Plan:
    """The rows of `pending` (traces of one segment, in listing order) from the segment's `table`
    (`conv_steps`, `conv_chars`, one chunk each)."""
    import numpy as np

    chars, steps = (table.column(n).chunk(0) for n in ("conv_chars", "conv_steps"))
    rows = np.array(pending.rows, dtype=np.int64)
    first = np.array(pending.first, dtype=np.int64)

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
    parent, step, index = parent[fits], step[fits], index[fits]
    labels = np.array(pending.label, dtype=bool)
    traces: dict[str, list[Any]] = {
        "label": pending.label,
        "source": pending.source,
        "group_id": pending.group_id,
        "trace_id": pending.trace_id,
        "reward": pending.reward,
    }
    split = np.array(pending.split, dtype=object)[parent]
    dropped = int(len(fits) - fits.sum())
    return Plan(rows, parent, step, index, split, labels[parent], traces, dropped, int(np.unique(parent).size))


def materialize(table: Any, plan: Plan, schema: Any) -> Any:
    """The planned rows as an Arrow table in `schema` (their JSON lines are made when they are written:
    `flowrl.data.arrow_json`), from the segment's `table` (`conv_messages`, `conv_tools`, one chunk each)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    messages = table.column("conv_messages").chunk(0)
    parent, index, traces = plan.parent, plan.index, plan.traces
    start = messages.offsets.to_numpy().astype(np.int64)[plan.rows][parent]
    prompt_off = np.concatenate([[0], np.cumsum(index)])
    gather = np.repeat(start - prompt_off[:-1], index) + np.arange(prompt_off[-1])
    texts = messages.values
    n = len(parent)
    take = pa.array(parent)

    tools = table.column("conv_tools").chunk(0).take(pa.array(plan.rows))
    tools_json = pc.if_else(pc.equal(tools, "null"), pa.scalar(None, pa.string()), tools)
    columns = {
        "prompt": pa.ListArray.from_arrays(pa.array(prompt_off, pa.int32()), _json(texts.take(pa.array(gather)))),
        "completion": pa.ListArray.from_arrays(
            pa.array(np.arange(n + 1), pa.int32()), _json(texts.take(pa.array(start + index)))
        ),
        "label": pa.array(plan.label),
        "tools": _json(tools_json.take(take)),
        "trace_id": pa.array(traces["trace_id"], pa.string()).take(take),
        "group_id": pa.array(traces["group_id"], pa.string()).take(take),
        "step": pa.array(plan.step, pa.int32()),
        "reward": pa.array(traces["reward"], pa.float64()).take(take),
        "label_source": pa.array(traces["source"], pa.string()).take(take),
        "captured": pa.nulls(n, pa.json_()),
    }
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def _json(storage: Any) -> Any:
    import pyarrow as pa

    return pa.ExtensionArray.from_storage(pa.json_(), storage)
