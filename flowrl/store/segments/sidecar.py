"""Side records of a segment store: what changes a trace after it was written, never rewriting its segment.

Objects: `{root}/sidecar/date=YYYY-MM-DD/{writer_id}-{seq:06d}-{rand}.jsonl` (the day the records were written),
one JSON object per line, immutable once put. JSON Lines, not Parquet: JSONL needs no schema for the changed
fields of a patch (any trace field), and a person can read it with `cat`. Two kinds:

- `{"kind": "patch", "trace_id", "at", "manual", "fields": {name: value}}`: the top-level trace fields that
  `update`, `modify` or `label` changed (`rewards`, `reward_score`, `label`, ...). `manual` says the patch
  leaves a person's label on the trace.
- `{"kind": "outcome", "trace_id", "at", "outcome": {...}}`: a host outcome (`flowrl.trace.outcomes.HostOutcome`),
  the segment store's counterpart of `flowrl.store.outcomes` (same validation and size limit per record).

Every record of a store is held by `flowrl.store.segments.sideview.SideView` (compactly: a scored store has one per
trace) and merged on read with `apply` and `patched_fields`.

**Merge on read.** A trace's patches are applied to its stored row in order of `at` (the writer's clock, in
ns; ties by object name and line), so the latest value of each field wins. A manual label outranks scores, as
`TraceStore.update` keeps it: once the merged trace carries a person's label, a later patch that is not
manual has its review fields (`label`, `label_source`, `manual_review`, `review_notes`) dropped. Writers on
different hosts are ordered by their clocks: keep them in sync (NTP) for "latest wins" to mean what it says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from flowrl.errors import SchemaError
from flowrl.store.outcomes import MAX_LINE
from flowrl.trace.facts import manual_label
from flowrl.trace.load import load_trace, stored_dict
from flowrl.trace.outcomes import HostOutcome
from flowrl.trace.schema import ExecutionTrace

REVIEW_FIELDS = ("label", "label_source", "manual_review", "review_notes")
Skip = Callable[[str, str], None]


@dataclass(order=True, slots=True)
class Record:
    """One side record, ordered by (`at`, object, line), as `SideView.entries` gives it (or a pending one): its
    line, and its body (a patch's fields, an outcome) parsed afresh on each read."""

    at: int
    where: tuple[str, int]
    trace_id: str = field(compare=False)
    kind: str = field(compare=False)
    line: bytes = field(compare=False)  # as `patch_line` or `outcome_line` wrote it
    manual: bool = field(default=False, compare=False)

    @property
    def body(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.line)["fields" if self.kind == "patch" else "outcome"]
        return value


def patch_line(trace_id: str, fields: dict[str, Any], manual: bool, at: int) -> bytes:
    data = {"kind": "patch", "trace_id": trace_id, "at": at, "manual": manual, "fields": fields}
    return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS, default=repr) + b"\n"


def outcome_line(trace_id: str, outcome: HostOutcome, at: int) -> bytes:
    data = {"kind": "outcome", "trace_id": trace_id, "at": at, "outcome": outcome.model_dump(mode="json")}
    line = orjson.dumps(data) + b"\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"an outcome of {len(line)} bytes is over the {MAX_LINE}-byte limit of one record")
    return line


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The top-level fields of `after` that differ from `before` (what a patch records)."""
    return {k: v for k, v in after.items() if k not in before or before[k] != v}


def apply(
    trace: ExecutionTrace, entries: list[tuple[Record, dict[str, Any]]], origin: str, skip: Skip | None
) -> ExecutionTrace:
    """`trace` with its records (`SideView.entries`) applied: patches merged (latest field wins, a person's
    label kept), outcomes set."""
    patches = [(r, body) for r, body in entries if r.kind == "patch"]
    if patches:
        data = stored_dict(trace)
        _merge(data, patches)
        try:
            trace = load_trace(data, origin=f"{origin} with its side records")
        except SchemaError as exc:  # a patch that breaks the trace: the stored row, and say so
            tell(skip, origin, str(exc))
    trace.outcomes = outcomes(entries, skip)
    return trace


def patched_fields(entries: list[tuple[Record, dict[str, Any]]], base: dict[str, Any]) -> dict[str, Any] | None:
    """`base` (some top-level fields of a stored trace) with the patches of `entries` merged as `apply` merges
    them, or None when the trace must be read whole: a patch sets a field `base` does not hold, or it has an
    outcome."""
    if any(r.kind != "patch" or any(name not in base for name in body if name != "trace_id") for r, body in entries):
        return None
    data = dict(base)
    _merge(data, entries)
    return data


def outcomes(entries: list[tuple[Record, dict[str, Any]]], skip: Skip | None) -> list[HostOutcome]:
    """The outcomes among `entries`, in order; one that is not valid is said through `skip` and left out."""
    out = []
    for record, body in entries:
        if record.kind != "outcome":
            continue
        try:
            out.append(HostOutcome.model_validate(body))
        except ValidationError as exc:
            location, line = record.where
            tell(skip, location, f"{location} line {line}: not a valid outcome ({exc.errors()[0].get('msg')})")
    return out


def _merge(data: dict[str, Any], patches: list[tuple[Record, dict[str, Any]]]) -> None:
    """Apply patches (each with its body) in order to a trace dict (`merge_patch`)."""
    for patch, fields in patches:
        merge_patch(data, fields, patch.manual)


def merge_patch(data: dict[str, Any], fields: dict[str, Any], manual: bool) -> None:
    """Apply one patch's fields (its body, changed here) to a trace dict: the patch's values win, but a person's
    label stays against a patch that is not `manual`."""
    if not manual and _manual(data):
        for name in REVIEW_FIELDS:
            fields.pop(name, None)
    fields.pop("trace_id", None)
    data.update(fields)


def _manual(data: dict[str, Any]) -> bool:
    """Whether a trace dict carries a person's label (`flowrl.trace.facts.manual_label` decides; a probe trace made with
    pydantic's `model_construct` cost 3 ms a patch, an hour for a million scored traces)."""
    return manual_label(data.get("label"), data.get("label_source"), bool(data.get("manual_review")))


def tell(skip: Skip | None, location: str, message: str) -> None:
    if skip is not None:
        skip(location, message)
