"""Side records of a segment store: what changes a trace after it was written, never rewriting its segment.

Objects: `{root}/sidecar/date=YYYY-MM-DD/{writer_id}-{seq:06d}-{rand}.jsonl` (the day the records were written),
one JSON object per line, immutable once put. JSON Lines, not Parquet: the records are few and small and every
listing reads all of them, so a columnar file would buy nothing; JSONL needs no schema for the changed fields
of a patch (any trace field), and a person can read it with `cat`. Two kinds:

- `{"kind": "patch", "trace_id", "at", "manual", "fields": {name: value}}`: the top-level trace fields that
  `update`, `modify` or `label` changed (`rewards`, `reward_score`, `label`, ...). `manual` says the patch
  leaves a person's label on the trace.
- `{"kind": "outcome", "trace_id", "at", "outcome": {...}}`: a host outcome (`flowrl.outcomes.HostOutcome`),
  the segment store's counterpart of `flowrl.store_outcomes` (same validation and size limit per record).

**Merge on read.** A trace's patches are applied to its stored row in order of `at` (the writer's clock, in
ns; ties by object name and line), so the latest value of each field wins. A manual label outranks scores, as
`TraceStore.update` keeps it: once the merged trace carries a person's label, a later patch that is not
manual has its review fields (`label`, `label_source`, `manual_review`, `review_notes`) dropped. Writers on
different hosts are ordered by their clocks: keep them in sync (NTP) for "latest wins" to mean what it says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from flowrl.errors import SchemaError
from flowrl.facts import manual_label
from flowrl.outcomes import HostOutcome
from flowrl.schema import ExecutionTrace, load_trace
from flowrl.store_outcomes import MAX_LINE

REVIEW_FIELDS = ("label", "label_source", "manual_review", "review_notes")
Skip = Callable[[str, str], None]


@dataclass(order=True, slots=True)
class Record:
    """One side record, ordered by (`at`, object, line). It holds its line and parses its body (a patch's fields,
    an outcome) when read: a listing holds every record of the store, and a scored store has one per trace
    (parsed, a record was ~1.6 KB)."""

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


def parse(data: bytes, location: str, skip: Skip | None) -> list[Record]:
    """The records of one side object; a line that is not one is reported through `skip` and passed over."""
    out: list[Record] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{location} line {number}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            _tell(skip, location, f"{where}: not JSON, skipped")
            continue
        record = _record(obj, (location, number), line)
        if record is None:
            _tell(skip, location, f"{where}: not a side record (patch or outcome), skipped")
        else:
            out.append(record)
    return out


def _record(obj: Any, where: tuple[str, int], line: bytes) -> Record | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("trace_id"), str) or not isinstance(obj.get("at"), int):
        return None
    kind = obj.get("kind")
    if kind == "patch" and isinstance(obj.get("fields"), dict):
        return Record(obj["at"], where, obj["trace_id"], "patch", line, bool(obj.get("manual")))
    if kind == "outcome" and isinstance(obj.get("outcome"), dict):
        return Record(obj["at"], where, obj["trace_id"], "outcome", line)
    return None


class SideView:
    """Every side record read so far, by trace id, applied on read (`apply`, `outcomes`)."""

    def __init__(self) -> None:
        self._by_id: dict[str, list[Record]] = defaultdict(list)
        self._sorted: set[str] = set()

    def add(self, records: list[Record]) -> None:
        for record in records:
            self._by_id[record.trace_id].append(record)
            self._sorted.discard(record.trace_id)

    def has(self, trace_id: str, kind: str = "patch") -> bool:
        return any(r.kind == kind for r in self._by_id.get(trace_id, ()))

    def ids(self) -> set[str]:
        """Every trace id with a side record."""
        return set(self._by_id)

    def patched_ids(self) -> set[str]:
        return {tid for tid, records in self._by_id.items() if any(r.kind == "patch" for r in records)}

    def _records(self, trace_id: str) -> list[Record]:
        records = self._by_id.get(trace_id, [])
        if trace_id not in self._sorted:
            records.sort()
            self._sorted.add(trace_id)
        return records

    def apply(self, trace: ExecutionTrace, origin: str, skip: Skip | None) -> ExecutionTrace:
        """`trace` with its patches applied (latest field wins, a person's label kept) and its outcomes."""
        records = self._records(trace.trace_id)
        patches = [(r, r.body) for r in records if r.kind == "patch"]
        if patches:
            data = trace.to_dict()
            _merge(data, patches)
            try:
                trace = load_trace(data, origin=f"{origin} with its side records")
            except SchemaError as exc:  # a patch that breaks the trace: the stored row, and say so
                _tell(skip, origin, str(exc))
        trace.outcomes = self.outcomes(trace.trace_id, skip)
        return trace

    def patched_fields(self, trace_id: str, base: dict[str, Any]) -> dict[str, Any] | None:
        """`base` (some top-level fields of a stored trace) with the trace's patches merged as `apply` merges
        them, or None when a patch sets a field `base` does not hold (the whole trace is needed then)."""
        patches = [(r, r.body) for r in self._records(trace_id) if r.kind == "patch"]
        if any(name not in base for _r, body in patches for name in body if name != "trace_id"):
            return None
        data = dict(base)
        _merge(data, patches)
        return data

    def outcomes(self, trace_id: str, skip: Skip | None) -> list[HostOutcome]:
        out = []
        for record in self._records(trace_id):
            if record.kind != "outcome":
                continue
            try:
                out.append(HostOutcome.model_validate(record.body))
            except ValidationError as exc:
                location, line = record.where
                _tell(skip, location, f"{location} line {line}: not a valid outcome ({exc.errors()[0].get('msg')})")
        return out


def _merge(data: dict[str, Any], patches: list[tuple[Record, dict[str, Any]]]) -> None:
    """Apply patches (each with its body) in order to a trace dict: the latest value of a field wins, a person's
    label is kept against patches that are not manual."""
    for patch, fields in patches:
        if not patch.manual and _manual(data):
            for name in REVIEW_FIELDS:
                fields.pop(name, None)
        fields.pop("trace_id", None)
        data.update(fields)


def _manual(data: dict[str, Any]) -> bool:
    """Whether a trace dict carries a person's label (`flowrl.facts.manual_label` decides; a probe trace made with
    pydantic's `model_construct` cost 3 ms a patch, an hour for a million scored traces)."""
    return manual_label(data.get("label"), data.get("label_source"), bool(data.get("manual_review")))


def _tell(skip: Skip | None, location: str, message: str) -> None:
    if skip is not None:
        skip(location, message)
