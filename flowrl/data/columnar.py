"""The columnar build: dataset rows from a segment store's derived columns (`flowrl.store.segments.derived`), a
segment's rows at a time, without parsing a trace's JSON or building an `ExecutionTrace`.

`DatasetPipeline.build` takes this path for a `SegmentStore` and a streaming builder (KTO) whose tool-call
arguments are dicts, grouped by query or group key (not embeddings), without a token budget (`reason_not`
says why not, otherwise). The rows are the row-by-row build's, byte for byte: the pipeline decides a segment's traces
from their columns (`Decided`; a trace's label and reward patches merged onto a `RowView`, the fields filters and
labels read of a trace), and `flowrl.data.columnar_kto` makes a segment's rows with Arrow.
A row the columns cannot stand for is read whole and built as before, and counted (`BuildStats.read_whole`):
JSON files and segment-v1 rows, a trace with LLM calls (its captured token ids are in the trace), with host
outcomes, or with a side record that changes more than its labels and rewards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from flowrl.store.segments.derived import ROW_COLUMNS, decision_rows
from flowrl.store.segments.plain import COLUMNS, FIELDS, float_rewards, is_plain

if TYPE_CHECKING:
    from flowrl.store.segments.columns import ColumnRows
    from flowrl.trace.row import DecisionRow

# the scalar columns a build reads of each trace (the decision's, and what its rows and checks need); the rows are
# made from conv_messages, conv_chars, conv_tools
SCALARS = [*ROW_COLUMNS, "agent_name", "session_id", "source", "conv_steps", "llm_calls"]
# what a side record may change for a row to be built from its columns (the rest need the whole trace)
PATCHABLE = tuple(name for name in FIELDS if name != "trace_id")


def reason_not(builder: Any, store: Any, pipeline: Any) -> str | None:
    """Why a build cannot take the columnar path (None: it can)."""
    if not hasattr(store, "scan_columns"):
        return "the store keeps one JSON file per trace"
    if builder.grouped:
        return f"{pipeline.method} groups runs before building rows"
    if not builder.columnar:
        return f"{pipeline.method} rows are made trace by trace (only KTO's are made from columns)"
    if builder.arguments_as != "dict":
        return "tool-call arguments as strings"
    if pipeline.grouper.needs_fit:
        return "grouping by embeddings"
    if pipeline.budget is not None:
        return "a token budget"
    return None


@dataclass(slots=True)
class RowView:
    """The fields of a stored trace that the filters, the label rule and a streaming builder read."""

    trace_id: str
    agent_name: str | None
    session_id: str | None
    source: str | None
    label: bool | None
    label_source: str | None
    manual_review: bool
    reward_score: float | None
    # JSON text as stored, or a patch's (`flowrl.store.segments.sideview.PatchRewards`)
    rewards: Mapping[str, Any] | str
    group_key: str | None
    query_key: str
    outcomes: tuple[()] = ()
    llm_calls: tuple[()] = ()


# what the pipeline reads of a row decided from its columns alone (`Decided`), as a `DecisionRow`: the filters'
# columns were applied by the listing, and `conv_steps` is read as its length
DECIDED = list(ROW_COLUMNS)
# what a row with side records is read as: a `Decided` row's columns, and a `RowView`'s
VIEWED = [*DECIDED, "agent_name", "session_id", "source"]
# the columns of a `Decided` row that its label and reward patches replace
PATCHED_COLUMNS = COLUMNS


@dataclass
class Decided:
    """Consecutive rows of a segment that need nothing but their columns: a derived chat, no LLM calls, no side
    record but label and reward patches (merged into the columns, and matched against the filters). The listing's
    column pushdown (`flowrl.store.segments.pushdown`) let only rows through that the filters match, so the pipeline
    decides them from their `DecisionRow`s (`DatasetPipeline._decide`), without a `RowView` or a `SegmentRow`."""

    batch: ColumnRows
    rows: list[int]  # the rows in the segment's table
    facts: list[DecisionRow]  # each row's, from its columns (`flowrl.store.segments.derived.decision_rows`)

    def __len__(self) -> int:
        return len(self.rows)


Item = tuple[str, "RowView | None"] | Decided


def items(store: Any, flt: Any, columns: list[str]) -> Iterator[Item]:
    """The stored traces in listing order: stretches of rows decided from their columns (`Decided`), and
    `(ref, None)` for each row to read whole, `(ref, view)` for a patched row that `flt` rules out. `columns`:
    read besides the scalar ones, for the rows to be made from (`flowrl.data.columnar_kto`)."""
    import numpy as np
    import pyarrow.compute as pc

    for batch in store.scan_columns(flt, SCALARS + columns):
        if batch.table is None:
            for ref in batch.refs:
                yield ref, None
            continue
        table = batch.select(SCALARS)
        # read whole: no chat derived (all its columns null), or captured token ids (they are in the trace)
        whole = pc.or_(pc.is_null(table.column("conv_steps")), pc.greater(table.column("llm_calls"), 0))
        whole = whole.to_numpy(zero_copy_only=False)
        cols: dict[str, list[Any]] | None = None  # the columns `VIEWED`, its rows with side records merged
        apart: dict[int, RowView | None] = {}  # rows with side records to read whole (None), or ruled out
        sided = store.side_mask(table.column("trace_id").to_pylist()) & ~whole  # a scored store: every row
        if sided.any():
            cols = {name: table.column(name).to_pylist() for name in VIEWED}
            apart = _merge(store, table, cols, np.flatnonzero(sided).tolist(), flt)
        start = 0
        for at in [*sorted(apart.keys() | set(np.flatnonzero(whole).tolist())), table.num_rows]:
            if at > start:
                yield _decided(batch, table, start, at, cols)
            if at == table.num_rows:
                break
            yield batch.refs[at], None if whole[at] else apart[at]  # read whole, or ruled out
            start = at + 1


def _decided(batch: ColumnRows, table: Any, start: int, end: int, cols: dict[str, list[Any]] | None) -> Decided:
    """Rows `start` to `end` of a segment's listed rows; `cols`: all its rows' scalar columns with their patches
    merged (`rewards` then a mapping, not JSON text), when some have side records."""
    import pyarrow.compute as pc

    part = table.slice(start, end - start)
    if cols is None:
        decided = {name: part.column(name).to_pylist() for name in DECIDED}
    else:
        decided = {name: cols[name][start:end] for name in DECIDED}
    steps = pc.list_value_length(part.column("conv_steps")).to_pylist()
    index = batch.index or []
    return Decided(batch, index[start:end], decision_rows(decided, steps))


def _merge(store: Any, table: Any, cols: dict[str, list[Any]], rows: list[int], flt: Any) -> dict[int, RowView | None]:
    """Merge the patches of `rows` (with side records) into `cols`: plain ones in bulk (`store.merged_columns`),
    the rest one by one. Returns the rows not to be decided from their columns: None to read whole (a patch to
    another field, a host outcome, or a value the trace model would refuse: the whole read then says so), or the
    view of a row `flt` rules out."""
    every = len(rows) == table.num_rows  # a scored store's segment
    base = table.select(PATCHED_COLUMNS) if every else table.take(rows).select(PATCHED_COLUMNS)
    ids = cols["trace_id"]
    merged, values = store.merged_columns(ids if every else [ids[i] for i in rows], base)
    merged = merged.tolist()
    if values is not None and every and all(merged):
        cols.update(values)
    elif values is not None:
        for name in PATCHED_COLUMNS:
            column, new = cols[name], values[name]
            for j, i in enumerate(rows):
                if merged[j]:
                    column[i] = new[j]
    filtered = dataclasses.replace(flt, since=None, until=None) != type(flt)()  # a filter on these columns
    apart: dict[int, RowView | None] = {}
    for j, i in enumerate(rows):
        if merged[j]:
            view = _view(cols, i) if filtered else None
        else:
            view = _one_by_one(store, cols, i)
            if view is None:
                apart[i] = None
                continue
            for name in PATCHED_COLUMNS:
                cols[name][i] = getattr(view, name)
        if view is not None and not flt.matches(view):
            apart[i] = view
    return apart


def _one_by_one(store: Any, cols: dict[str, list[Any]], i: int) -> RowView | None:
    """Row `i`'s view with its patches merged (`store.merged_fields`), or None when it must be read whole."""
    base = dict.fromkeys(PATCHABLE)
    base.update(
        label=cols["label"][i],
        label_source=cols["label_source"][i],
        manual_review=bool(cols["manual_review"][i]),
        reward_score=cols["reward_score"][i],
        rewards=orjson.loads(cols["rewards"][i]),
    )
    merged = store.merged_fields(cols["trace_id"][i], base)
    if merged is None or not is_plain(merged):
        return None
    score = merged["reward_score"]
    merged["reward_score"] = None if score is None else float(score)
    merged["rewards"] = float_rewards(merged["rewards"])
    return _view(cols, i, merged)


def _view(cols: dict[str, list[Any]], i: int, merged: dict[str, Any] | None = None) -> RowView:
    """Row `i`'s view: its patched columns from `merged` when given, else from `cols` (merged into them)."""
    patched = {name: cols[name][i] for name in PATCHED_COLUMNS} if merged is None else merged
    return RowView(
        trace_id=cols["trace_id"][i],
        agent_name=cols["agent_name"][i],
        session_id=cols["session_id"][i],
        source=cols["source"][i],
        label=patched["label"],
        label_source=patched["label_source"],
        manual_review=patched["manual_review"],
        reward_score=patched["reward_score"],
        rewards=patched["rewards"],
        group_key=cols["group_key"][i],
        query_key=cols["query_key"][i],
    )
