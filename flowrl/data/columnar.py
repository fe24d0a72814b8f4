"""The columnar build: dataset rows from a segment store's derived columns (`flowrl.segments.derived`), a
segment's rows at a time, without parsing a trace's JSON or building an `ExecutionTrace`.

`DatasetPipeline.build` takes this path for a `SegmentStore` and a streaming builder (KTO) whose tool-call
arguments are dicts, grouped by query or group key (not embeddings), without a token budget (`reason_not`
says why not, otherwise). The rows are the row-by-row build's, byte for byte: the same builder code runs on a
`RowView` (the fields builders read of a trace) and a `PackedConversation` (messages kept as their JSON text).
A row the columns cannot stand for is read whole and built as before, and counted (`BuildStats.read_whole`):
JSON files and segment-v1 rows, a trace with LLM calls (its captured token ids are in the trace), with host
outcomes, or with a side record that changes more than its labels and rewards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from flowrl.conversation import Conversation
from flowrl.data.sinks import RawJSON, RawJSONList

if TYPE_CHECKING:
    from flowrl.segments.columns import ColumnRows

COLUMNS = [
    "trace_id",
    "agent_name",
    "session_id",
    "source",
    "label",
    "label_source",
    "reward_score",
    "manual_review",
    "rewards",
    "conv_messages",
    "conv_chars",
    "conv_steps",
    "conv_prompt_end",
    "conv_tools",
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


@dataclass
class PackedConversation(Conversation):
    """A conversation from the derived columns: messages as `RawJSON`, steps, characters and key precomputed."""

    steps: list[int] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)  # prefix[i]: characters of messages[:i]
    dedupe_key: bytes = b""
    tool_calls: bool = False
    texts: list[str] = field(default_factory=list)  # the messages' JSON

    def assistant_indices(self) -> list[int]:
        return self.steps

    @property
    def has_tool_calls(self) -> bool:
        return self.tool_calls

    def chars(self, start: int, end: int) -> int:
        return self.prefix[end] - self.prefix[start]

    def key(self) -> bytes:
        return self.dedupe_key

    def head(self, end: int) -> Any:
        return RawJSONList(self.texts[:end])


SCALARS = [c for c in COLUMNS if c not in ("conv_messages", "conv_chars", "conv_tools")]
MESSAGES = ["conv_messages", "conv_chars", "conv_tools"]


def rows(
    store: Any, flt: Any, *, messages: bool = True, columns: list[str] = MESSAGES
) -> Iterator[tuple[str, RowView | None, PackedConversation | None]]:
    """`(ref, view, conversation)` per stored trace in listing order; `(ref, None, None)` for one to read whole.
    A view that `flt` rules out comes without a conversation. `messages=False`: conversations without their
    messages (see `PackedConversation`), with the segment's `columns` read besides the scalar ones."""
    side: set[str] | None = None
    for batch in store.scan_columns(flt, SCALARS + [c for c in (MESSAGES if messages else columns)]):
        if side is None:  # after the listing has read the side records
            side = store.side_ids()
        if batch.table is None:
            for ref in batch.refs:
                yield ref, None, None
            continue
        cols = batch.lists(SCALARS + (MESSAGES if messages else []))
        for i, ref in enumerate(batch.refs):
            if cols["conv_steps"][i] is None or cols["llm_calls"][i]:  # no chat derived (all its columns null)
                yield ref, None, None
                continue
            view = _view(store, cols, i, side)
            if view is None:
                yield ref, None, None
            elif not flt.matches(view):
                yield ref, view, None
            elif messages:
                yield ref, view, _conversation(cols, i, cols["conv_messages"][i])
            else:
                yield ref, view, SegmentRow(cols, i, batch)  # type: ignore[misc]


def _view(store: Any, cols: dict[str, list[Any]], i: int, side: set[str]) -> RowView | None:
    fields: dict[str, Any] = {
        "label": cols["label"][i],
        "label_source": cols["label_source"][i],
        "manual_review": bool(cols["manual_review"][i]),
        "reward_score": cols["reward_score"][i],
        "rewards": cols["rewards"][i],
    }
    trace_id = cols["trace_id"][i]
    if trace_id in side:
        merged = _patched(store, trace_id, fields)
        if merged is None:
            return None
        fields = merged
    rewards = fields["rewards"]
    return RowView(
        trace_id=trace_id,
        agent_name=cols["agent_name"][i],
        session_id=cols["session_id"][i],
        source=cols["source"][i],
        label=fields["label"],
        label_source=fields["label_source"],
        manual_review=fields["manual_review"],
        reward_score=fields["reward_score"],
        rewards=orjson.loads(rewards) if isinstance(rewards, str) else rewards,
        group_key=cols["group_key"][i],
        query_key=cols["query_key"][i],
    )


def _patched(store: Any, trace_id: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """`fields` with the trace's patches merged, or None when the trace must be read whole (a patch to another
    field, a host outcome, or a value the trace model would refuse: the whole read then says so)."""
    base = dict.fromkeys(PATCHABLE)
    base.update(fields, rewards=orjson.loads(fields["rewards"]))
    merged = store.merged_fields(trace_id, base)
    if merged is None:
        return None
    score, rewards = merged["reward_score"], merged["rewards"]
    ok = (
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
    if not ok:
        return None
    merged["reward_score"] = None if score is None else float(score)
    merged["rewards"] = {k: None if v is None else float(v) for k, v in rewards.items()}
    return merged


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _conversation(cols: dict[str, list[Any]], i: int, messages: list[str]) -> PackedConversation:
    prefix = [0]
    for n in cols["conv_chars"][i]:
        prefix.append(prefix[-1] + n)
    return PackedConversation(
        messages=[RawJSON(m) for m in messages],  # type: ignore[misc]
        texts=messages,
        prompt_end=cols["conv_prompt_end"][i],
        tools=RawJSON(cols["conv_tools"][i]),  # type: ignore[arg-type]
        synthesized=cols["conv_synthesized"][i],
        steps=cols["conv_steps"][i],
        prefix=prefix,
        dedupe_key=cols["conv_key"][i],
        tool_calls=cols["conv_tool_calls"][i],
    )


class SegmentRow:
    """A trace's conversation as a build that makes rows a segment at a time needs it (`rows(...,
    messages=False)`): what the pipeline checks of a conversation, and where its columns are (`batch`: the
    segment's `ColumnRows`, `row`: the trace's row in its table) instead of its messages."""

    __slots__ = ("prompt_end", "steps", "dedupe_key", "synthesized", "has_tool_calls", "batch", "row")

    def __init__(self, cols: dict[str, list[Any]], i: int, batch: ColumnRows) -> None:
        self.prompt_end: int = cols["conv_prompt_end"][i]
        self.steps: list[int] = cols["conv_steps"][i]
        self.dedupe_key: bytes = cols["conv_key"][i]
        self.synthesized: bool = cols["conv_synthesized"][i]
        self.has_tool_calls: bool = cols["conv_tool_calls"][i]
        self.batch = batch
        self.row: int = batch.index[i]  # type: ignore[index]

    def assistant_indices(self) -> list[int]:
        return self.steps

    def key(self) -> bytes:
        return self.dedupe_key
