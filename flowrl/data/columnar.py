"""The columnar build: dataset rows from a segment store's derived columns (`flowrl.segments.derived`), a
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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from flowrl.segments.columns import ColumnRows

# the scalar columns a build reads of each trace; the rows are made from conv_messages, conv_chars, conv_tools
SCALARS = [
    "trace_id",
    "agent_name",
    "session_id",
    "source",
    "label",
    "label_source",
    "reward_score",
    "manual_review",
    "rewards",
    "conv_steps",
    "conv_prompt_end",
    "conv_key",
    "conv_synthesized",
    "conv_tool_calls",
    "query_key",
    "group_key",
    "llm_calls",
]
# what a side record may change for a row to be built from its columns (the rest need the whole trace)
PATCHABLE = (
    "label",
    "label_source",
    "manual_review",
    "review_notes",
    "reward_score",
    "rewards",
    "reward_details",
    "facts",
    "success",
    "status",
)


def reason_not(builder: Any, store: Any, pipeline: Any) -> str | None:
    """Why a build cannot take the columnar path (None: it can)."""
    if not hasattr(store, "scan_columns"):
        return "the store keeps one JSON file per trace"
    if builder.grouped:
        return f"{pipeline.method} groups runs before building rows"
    if not hasattr(builder, "trace_label"):
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
    rewards: dict[str, Any]
    group_key: str | None
    query_key: str
    outcomes: tuple[()] = ()
    llm_calls: tuple[()] = ()


# what the pipeline reads of a row decided from its columns alone (`Decided`): the filters' columns were applied by
# the listing, and `conv_steps` is read as its length
DECIDED = [c for c in SCALARS if c not in ("agent_name", "session_id", "source", "conv_steps", "llm_calls")]
# the columns of a `Decided` row that its label and reward patches replace
PATCHED_COLUMNS = ("label", "label_source", "manual_review", "reward_score", "rewards")


@dataclass
class Decided:
    """Consecutive rows of a segment that need nothing but their columns: a derived chat, no LLM calls, no side
    record but label and reward patches (merged into the columns, and matched against the filters). The listing's
    column pushdown (`flowrl.segments.pushdown`) let only rows through that the filters match, so the pipeline
    decides them without a `RowView` or a `SegmentRow` each (`DatasetPipeline._decide`)."""

    batch: ColumnRows
    rows: list[int]  # the rows in the segment's table
    cols: dict[str, list[Any]]  # DECIDED, and `steps`: the number of assistant steps

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
        slow = whole
        views: dict[int, RowView | None] = {}  # rows with side records: label and reward patches merged
        sided = store.side_mask(table.column("trace_id").to_pylist()) & ~whole  # a scored store: every row
        if sided.any():
            cols = {name: table.column(name).to_pylist() for name in SCALARS}
            rows = np.flatnonzero(sided).tolist()
            views = dict(zip(rows, _views(store, cols, rows), strict=True))
            for at, view in views.items():  # decided with the others when the filter keeps it
                sided[at] = view is None or not flt.matches(view)
            slow = whole | sided
        start = 0
        for at in [*np.flatnonzero(slow).tolist(), table.num_rows]:
            if at > start:
                yield _decided(batch, table, start, at, views)
            if at == table.num_rows:
                break
            yield batch.refs[at], None if whole[at] else views[at]  # read whole, or ruled out
            start = at + 1


def _decided(batch: ColumnRows, table: Any, start: int, end: int, views: dict[int, RowView | None]) -> Decided:
    """Rows `start` to `end` of a segment's listed rows, with the patched fields of those in `views` (`rewards`
    then a dict, not JSON text)."""
    import pyarrow.compute as pc

    part = table.slice(start, end - start)
    cols = {name: part.column(name).to_pylist() for name in DECIDED}
    cols["steps"] = pc.list_value_length(part.column("conv_steps")).to_pylist()
    for at in range(start, end) if views else ():
        view = views.get(at)
        if view is not None:
            for name in PATCHED_COLUMNS:
                cols[name][at - start] = getattr(view, name)
    index = batch.index or []
    return Decided(batch, index[start:end], cols)


def _views(store: Any, cols: dict[str, list[Any]], rows: list[int]) -> list[RowView | None]:
    """The `RowView` of each of `rows` (with side records) with its patches merged, or None for a row that must be
    read whole (a patch to another field, a host outcome, or a value the trace model would refuse: the whole read
    then says so)."""
    bases = []
    for i in rows:
        base = dict.fromkeys(PATCHABLE)
        base.update(
            label=cols["label"][i],
            label_source=cols["label_source"][i],
            manual_review=bool(cols["manual_review"][i]),
            reward_score=cols["reward_score"][i],
            rewards=orjson.loads(cols["rewards"][i]),
        )
        bases.append(base)
    ids = cols["trace_id"]
    merged = store.merged_many([ids[i] for i in rows], bases)
    return [None if m is None or not _valid(m) else _view(cols, i, m) for i, m in zip(rows, merged, strict=True)]


def _valid(merged: dict[str, Any]) -> bool:
    score, rewards = merged["reward_score"], merged["rewards"]
    return (
        merged["label"] in (None, True, False)
        and merged["label_source"] in (None, "manual", "engine")
        and isinstance(merged["manual_review"], bool)
        and (score is None or _number(score))
        and isinstance(rewards, dict)
        and all(isinstance(k, str) and (v is None or _number(v)) for k, v in rewards.items())
        and (merged["success"] is None or isinstance(merged["success"], bool))
        and (merged["status"] is None or isinstance(merged["status"], str))
        and (merged["review_notes"] is None or isinstance(merged["review_notes"], str))
        and (merged["reward_details"] is None or isinstance(merged["reward_details"], dict))
        and merged["facts"] is None
    )


def _view(cols: dict[str, list[Any]], i: int, merged: dict[str, Any]) -> RowView:
    score = merged["reward_score"]
    return RowView(
        trace_id=cols["trace_id"][i],
        agent_name=cols["agent_name"][i],
        session_id=cols["session_id"][i],
        source=cols["source"][i],
        label=merged["label"],
        label_source=merged["label_source"],
        manual_review=merged["manual_review"],
        reward_score=None if score is None else float(score),
        rewards={k: None if v is None else float(v) for k, v in merged["rewards"].items()},
        group_key=cols["group_key"][i],
        query_key=cols["query_key"][i],
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
