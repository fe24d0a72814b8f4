"""SegmentStore: the `TraceStore` API over date-partitioned Parquet segments on any fsspec filesystem.

For a fleet of hosts writing one store (`s3://bucket/prefix`, `gs://...`, `memory://x`, or a local folder):

    {root}/segments/date=YYYY-MM-DD/{writer_id}-{seq:06d}-{rand}.parquet   traces, one row each (`format`)
    {root}/sidecar/date=YYYY-MM-DD/{writer_id}-{seq:06d}-{rand}.jsonl      scores, labels, outcomes (`sidecar`)
    {root}/YYYY-MM-DD/{trace_id}.json                                      the per-trace layout, read as well

Objects are put whole and never rewritten or replaced (`flowrl.store.segments.fs`); names cannot collide
(`flowrl.store.segments.names`). `write`/`write_many` buffer traces and put one segment per day partition every
`flush_rows` traces, `flush_seconds` after the first unflushed one (a timer), and on `flush()`, `close()`, the
end of a `with` block and interpreter exit (`atexit`): a trace is durable once a flush put it, not when
`write` returns. `update`/`modify`/`label` append patches to the side buffer the same way; `record_outcome(s)`
flushes it at once (durable when it returns, as `TraceStore` promises). This process's buffered traces and
patches are visible to its own reads at once; a listing flushes first.

Differences from `TraceStore`: `write`, `update`, `find` and `iter_paths` give strings, not `Path`s (a row is
`{segment}#{row}`, a JSON file its location), which `read_path` takes back. `modify` is atomic against this
object's threads only: writers on other hosts append their own patches, merged field by field in time order.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.errors import ConfigError, SchemaError, StoreError
from flowrl.store.files import OutcomeRecords, ReadProblems, TraceFilter, _check_id, _coerce_date, _day_of
from flowrl.store.outcomes import read_outcomes
from flowrl.store.segments import lifecycle, names, sideview
from flowrl.store.segments.catalog import Catalog, Ref, ScanStats, SegmentRows
from flowrl.store.segments.columns import ColumnRows, scan
from flowrl.store.segments.format import encode
from flowrl.store.segments.fs import Root, RootURL, protocols
from flowrl.store.segments.problems import ProblemRecords
from flowrl.store.segments.pushdown import row_filter
from flowrl.store.segments.sidecar import REVIEW_FIELDS, Record, diff, outcome_line, patch_line
from flowrl.trace.facts import is_manual_label
from flowrl.trace.load import stored_dict
from flowrl.trace.outcomes import HostOutcome
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

FLUSH_ROWS = 1000
FLUSH_SECONDS = 5.0


class SegmentStore(ProblemRecords, OutcomeRecords):
    """Traces in Parquet segments under `spec` (a URL or a folder), written as `writer_id`."""

    def __init__(
        self,
        spec: str | os.PathLike[str],
        *,
        writer_id: str | None = None,
        flush_rows: int = FLUSH_ROWS,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        if flush_rows < 1 or flush_seconds <= 0:
            raise ConfigError(f"flush_rows must be >= 1 and flush_seconds > 0, not {flush_rows} and {flush_seconds}")
        self.writer_id = names.check_writer_id(writer_id) if writer_id is not None else names.default_writer_id()
        self.flush_rows, self.flush_seconds = flush_rows, flush_seconds
        self._root = Root(spec)
        self._catalog = Catalog(self._root)
        super().__init__()
        self._lock = threading.RLock()
        self._seq = 0
        self._traces: list[tuple[ExecutionTrace, str, int]] = []  # (trace, day, written_ns), not yet put
        self._pending: dict[str, ExecutionTrace] = {}  # the same, by id, for this process's reads
        self._side: list[tuple[str, Record]] = []  # (day, record), not yet put
        self._timer: threading.Timer | None = None
        self._closed = False
        lifecycle.track(self)

    # -- identity ------------------------------------------------------------------------------------
    @property
    def root(self) -> Path | RootURL:
        """A local root as a `Path`; a remote one as its URL (a `str` with `is_dir()`)."""
        if self._root.local:
            return Path(self._root.path)
        return RootURL(self._root.url, self._root.exists)

    @property
    def url(self) -> str:
        return self._root.url

    @property
    def shared(self) -> bool:
        """Whether another process opening `url` sees this store (not so for `memory://`, one per process)."""
        return "memory" not in protocols(self._root.fs)

    @property
    def scan_stats(self) -> ScanStats:
        """Segments opened and `trace` row groups decoded so far (what filter pushdown saves)."""
        return self._catalog.stats

    def __repr__(self) -> str:
        return f"SegmentStore({self._root.url!r}, writer_id={self.writer_id!r})"

    # -- writing -------------------------------------------------------------------------------------
    def write(self, trace: ExecutionTrace) -> str:
        """Buffer a trace for the next segment. Returns where it will be: `{root}/segments/date=DAY#pending`
        until flushed (`find` gives the row once it is). A trace with an id already stored supersedes it."""
        return self.write_many([trace])[0]

    def write_many(self, traces: list[ExecutionTrace]) -> list[str]:
        """Buffer many traces (every id checked first); flushes once `flush_rows` are waiting."""
        traces = list(traces)
        for trace in traces:
            _check_id(trace.trace_id)
        out = []
        with self._lock:
            self._check_open()
            for trace in traces:
                day = _day_of(trace)
                self._traces.append((trace, day, time.time_ns()))
                self._pending[trace.trace_id] = trace
                out.append(f"{self._root.display(self._root.join(names.SEGMENTS, names.partition(day)))}#pending")
            self._after_buffering(len(self._traces))
        return out

    def update(self, trace: ExecutionTrace) -> str:
        """Record the fields of `trace` that differ from the stored copy as a patch (a new trace is written).

        A person's label on the stored copy is kept when `trace` has none (as `TraceStore.update`); reads
        keep it too when the patches of several hosts meet (`flowrl.store.segments.sidecar`)."""
        with self._lock:
            try:
                stored = self.get(trace.trace_id)
            except StoreError:
                return self.write(trace)
            manual = is_manual_label(trace)
            fields = diff(stored_dict(stored), stored_dict(trace))
            if not manual and is_manual_label(stored):
                for name in REVIEW_FIELDS:
                    fields.pop(name, None)
            self._patch(trace.trace_id, stored, fields, manual)
            return self._ref_of(trace.trace_id)

    def modify(self, trace_id: str, change: Callable[[ExecutionTrace], object]) -> ExecutionTrace:
        """Read a trace, apply `change`, and record what changed as a patch. Atomic against this object's
        threads; other processes' patches merge with it field by field on read. Returns the trace as changed."""
        with self._lock:
            trace = self.get(trace_id)
            before = stored_dict(trace)
            change(trace)
            self._patch(trace_id, trace, diff(before, stored_dict(trace)), is_manual_label(trace))
        return trace

    def label(self, trace_id: str, label: bool, notes: str = "") -> ExecutionTrace:
        """Record a manual review verdict. A manual label always wins over the engine's."""

        def review(trace: ExecutionTrace) -> None:
            trace.label, trace.label_source = bool(label), "manual"
            trace.manual_review, trace.review_notes = True, notes

        return self.modify(trace_id, review)

    def _patch(self, trace_id: str, trace: ExecutionTrace, fields: dict[str, Any], manual: bool) -> None:
        fields.pop("trace_id", None)
        if not fields:
            return
        at = time.time_ns()
        line = patch_line(trace_id, fields, manual, at)
        record = Record(at, ("pending", len(self._side)), trace_id, "patch", line, manual)
        self._catalog.view.add_pending(record)
        self._side.append((_day_of(trace), record))
        self._after_buffering(len(self._side))

    def record_outcomes(self, trace_id: str, outcomes: list[HostOutcome]) -> None:
        """Append checked outcomes to the side records and put them (with any buffered patch) at once."""
        _check_id(trace_id)
        with self._lock:
            self._check_open()
            day = time.strftime("%Y-%m-%d", time.gmtime())
            for outcome in outcomes:
                at = time.time_ns()
                line = outcome_line(trace_id, outcome, at)
                record = Record(at, ("pending", len(self._side)), trace_id, "outcome", line)
                self._catalog.view.add_pending(record)
                self._side.append((day, record))
            self._flush_side()

    def _after_buffering(self, waiting: int) -> None:
        if waiting >= self.flush_rows:
            self.flush()
        elif self._timer is None:
            self._timer = threading.Timer(self.flush_seconds, self._timed_flush)
            self._timer.daemon = True
            self._timer.start()

    def _timed_flush(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # kept buffered; the next flush retries
            log.warning("flowrl: flushing %s failed (%s); retrying at the next flush", self._root.url, exc)

    def flush(self) -> None:
        """Put every buffered trace (one segment per day) and side record. What fails stays buffered."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while self._traces:
                day = self._traces[0][1]
                rows = [row for row in self._traces if row[1] == day]
                self._put(names.SEGMENTS, day, encode(rows))
                self._traces = [row for row in self._traces if row[1] != day]
                for trace, _day, _ns in rows:
                    if self._pending.get(trace.trace_id) is trace:
                        del self._pending[trace.trace_id]
            self._flush_side()

    def _flush_side(self) -> None:
        while self._side:
            day = self._side[0][0]
            records = [record for d, record in self._side if d == day]
            data = b"".join(record.line for record in records)
            path = self._put(names.SIDECAR, day, data)
            self._catalog.settle(path, data, records)  # read from there, not held twice
            self._side = [(d, record) for d, record in self._side if d != day]

    def _put(self, kind: str, day: str, data: bytes) -> str:
        def name() -> str:
            self._seq += 1
            return names.object_name(self.writer_id, self._seq, names.EXTENSIONS[kind])

        try:
            return self._root.put_new(f"{kind}/{names.partition(day)}", name, data)
        except OSError as exc:
            raise StoreError(
                f"cannot write to {self._root.url}/{kind}: {exc}: check the store's permissions and credentials"
            ) from exc

    def close(self) -> None:
        """Flush and stop; later writes are refused. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._catalog.close()
        lifecycle.untrack(self)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed: open the store again to write")

    def __enter__(self) -> SegmentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------------
    def find(self, trace_id: str) -> str | None:
        """Where `trace_id` is stored (`{segment}#{row}`, a JSON file, or `...#pending`), or None."""
        _check_id(trace_id)
        with self._lock:
            if trace_id in self._pending:
                return self._ref_of(trace_id)
        ref = self._catalog.find(trace_id)
        if ref is None:
            self._catalog.refresh(self._skipper(self._begin()))
            ref = self._catalog.find(trace_id)
        return None if ref is None else self._catalog.ref_text(ref)

    def _ref_of(self, trace_id: str) -> str:
        ref = self._catalog.find(trace_id)
        if trace_id in self._pending or ref is None:
            return f"{self._root.display(self._root.join(names.SEGMENTS))}#pending"
        return self._catalog.ref_text(ref)

    def exists(self, trace_id: str) -> bool:
        return self.find(trace_id) is not None

    def get(self, trace_id: str) -> ExecutionTrace:
        """The stored trace with its side records merged. StoreError when there is none."""
        _check_id(trace_id)
        with self._lock:
            pending = self._pending.get(trace_id)
            if pending is not None:
                copy = ExecutionTrace.model_validate(pending.model_dump())
                return self._catalog.view.apply(copy, "a buffered trace", self._skipper(self.problems))
        ref = self.find(trace_id)
        if ref is None:
            raise StoreError(f"no trace {trace_id!r} under {self._root.url}: list them with `flowrl traces ls`")
        return self.read_path(ref)

    def read_path(self, path: str | Path, *, outcome_ids: set[str] | None = None) -> ExecutionTrace:
        """Load the trace at a location `iter_paths` or `find` gave, with its side records merged."""
        ref = self._catalog.parse_ref(str(path))
        return self._merged(ref, self._skipper(self.problems))

    def _merged(self, ref: Ref, skip: Callable[[str, str], None]) -> ExecutionTrace:
        trace = self._catalog.load(ref)
        trace = self._catalog.view.apply(trace, self._catalog.ref_text(ref), skip)
        if trace.trace_id in self._catalog.legacy_outcome_ids:  # `.outcomes/` of a local per-trace store
            trace.outcomes = [*self._legacy_outcomes(trace.trace_id, skip), *trace.outcomes]
        return trace

    def _legacy_outcomes(self, trace_id: str, skip: Callable[[str, str], None]) -> list[HostOutcome]:
        return read_outcomes(Path(self._root.path), trace_id, lambda path, message: skip(str(path), message))

    def outcomes(self, trace_id: str) -> list[HostOutcome]:
        """The run's outcomes in the order they were recorded (side records, and `.outcomes` of a local root)."""
        _check_id(trace_id)
        skip = self._skipper(self.problems)
        self._catalog.refresh(skip)
        legacy = self._legacy_outcomes(trace_id, skip) if self._root.local else []
        return [*legacy, *self._catalog.view.outcomes(trace_id, skip)]

    def _listing(self, flt: TraceFilter | None, problems: ReadProblems) -> Iterator[Ref]:
        for hit in self._winners(flt, problems):
            yield from [hit] if isinstance(hit, Ref) else map(hit.ref, hit.rows)

    def _winners(self, flt: TraceFilter | None, problems: ReadProblems) -> Iterator[Ref | SegmentRows]:
        """The listing (`Catalog.winners`): days in order, `flt`'s days and columns applied."""
        self.flush()  # this process's buffered traces are listed too
        self._catalog.refresh(self._skipper(problems))
        patched = self._catalog.view
        keep = row_filter(flt, lambda ids: patched.mask(ids, "patch")) if flt is not None else None
        for day in self._catalog.days():
            if flt is None or flt.day_ok(day):
                yield from self._catalog.winners(day, keep)

    def iter_paths(self, flt: TraceFilter | None = None) -> Iterator[str]:
        """Where each stored trace is, oldest day first (strings, see the module docstring)."""
        for ref in self._listing(None if flt is None else _days_only(flt), self._begin()):
            yield self._catalog.ref_text(ref)

    def listed_outcomes(self) -> None:
        """None: a segment store merges a trace's side records (its outcomes among them) as it reads it."""
        return None

    def count_paths(self, flt: TraceFilter | None = None) -> int:
        """How many paths `iter_paths(flt)` gives, without making them (a segment's rows counted at once)."""
        hits = self._winners(None if flt is None else _days_only(flt), self._begin())
        return sum(1 if isinstance(hit, Ref) else len(hit.rows) for hit in hits)

    def iter_traces(self, flt: TraceFilter | None = None, **filters: Any) -> Iterator[ExecutionTrace]:
        """Stream stored traces, oldest day first, side records merged. Filters on the segment columns are
        applied before a row group's traces are decoded; what cannot be read is skipped and recorded."""
        if flt is None:
            flt = TraceFilter(**{k: _coerce_date(k, v) for k, v in filters.items()})
        problems = self._begin()
        skip = self._skipper(problems)
        for ref in self._listing(flt, problems):
            try:
                trace = self._merged(ref, skip)
            except SchemaError as exc:
                skip(self._catalog.ref_text(ref), str(exc))
                continue
            if flt.matches(trace):
                yield trace

    def scan_columns(self, flt: TraceFilter | None, columns: list[str]) -> Iterator[ColumnRows]:
        """The stored traces in `iter_paths` order, a segment's rows at a time with `columns` of them
        (`flowrl.store.segments.columns`), rows `flt`'s columns rule out left out; refs without columns are read
        whole with `read_path`."""
        return scan(self._catalog, self._winners(flt, self._begin()), columns)

    def side_mask(self, ids: list[str]) -> Any:
        """A numpy bool per id: whether the trace may have side records or host outcomes (as of the latest
        listing); False means it has none."""
        mask = self._catalog.view.mask(ids)
        legacy = self._catalog.legacy_outcome_ids
        if legacy:
            mask |= np.fromiter((tid in legacy for tid in ids), bool, len(ids))
        return mask

    def merged_fields(self, trace_id: str, base: dict[str, Any]) -> dict[str, Any] | None:
        """`base` (fields of a stored row) with the trace's patches merged, or None when the trace must be read
        whole: it has host outcomes, or a patch sets a field `base` lacks."""
        if trace_id in self._catalog.legacy_outcome_ids:
            return None
        return self._catalog.view.patched_fields(trace_id, base)

    def merged_columns(self, ids: list[str], base: Any) -> tuple[Any, dict[str, list[Any]] | None]:
        """Label and score columns of rows with side records (`base`, a pyarrow table) with each trace's patch
        merged where its only record is a plain one, as a scored store's are
        (`flowrl.store.segments.sideview.merge_columns`: which rows, and the columns as lists); the others go through
        `merged_fields` one by one."""
        return sideview.merge_columns(self._catalog.view, ids, base, self._catalog.legacy_outcome_ids)

    def count(self) -> int:
        self.flush()
        self._catalog.refresh(self._skipper(ReadProblems()))
        return self._catalog.count()


def _days_only(flt: TraceFilter) -> TraceFilter:
    """What `iter_paths` filters on, as `TraceStore.iter_paths` does: the days."""
    return TraceFilter(since=flt.since, until=flt.until)
