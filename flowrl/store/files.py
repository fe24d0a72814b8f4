"""TraceStore: one JSON file per trace under dated folders, written atomically.

Layout: `{root}/YYYY-MM-DD/{trace_id}.json`. Every write goes to a file in `{root}/.staging/` (same
filesystem), is fsynced, and is moved into place with `os.replace`, so a reader, a crash or a
watchdog observer never sees half a file. toolboxv2 rl-module trace files use the same layout and
load unchanged.

Redaction is not done here: whoever builds a trace from the outside world (capture, ingest) masks it
before calling `write`. The store only stores.

Its folder may hold anything, so (details in `flowrl.store.index`, which owns the folder on disk):

- **Writes stay inside the root and are durable when acknowledged**: links in place of `.staging` or a day
  folder are replaced by real folders; the folder is fsynced after each rename (`write_many`: one `syncfs`
  and one fsync per touched folder). A trace whose date does not exist (`2026-13-45`) is filed under the day
  it is written, its timestamp kept as it was. Stale staging files are removed by age (`STALE_STAGING_S`)
  when a store is opened and, while it writes, once per that interval.
- **Reading never opens what is not a trace file**: impossible or foreign folders, links, FIFOs and other
  non-regular files are skipped and recorded as read problems. A file without a `trace_id` is known by its
  file name (what `find` knows it by), so every read and rewrite of it lands on the same file.

Three things keep it right when it is shared:

- **Problems per operation.** A file that cannot be read is skipped and recorded in the `ReadProblems` of
  the operation that read it, once per file however often it was read. `with store.operation() as op:`
  groups several listings into one operation; outside one, each `iter_paths`/`iter_traces` call starts
  afresh, and `store.problems` is the latest operation's record (per thread).
- **Read-modify-write under a lock.** `label`, `modify` and `update` hold `{root}/.flowrl-store.lock`
  (`flock`, so threads and processes both wait) from the read to the rename. `update` also keeps a
  manual review that was stored after the caller read its copy: a score written back by `flowrl score`
  cannot undo a label given meanwhile. `write`/`write_many` (new traces: capture, ingest) take no lock.
- **An index for `find`** (`flowrl.store.index`): O(1) after the first call, kept fresh by this
  object's writes and by a cheap check, on a miss, of whether any process wrote since.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import ConfigError, SchemaError, StoreError
from flowrl.store.index import (
    STAGING,
    STALE_STAGING_S,
    TraceIndex,
    atomic_write_bytes,
    clean_staging,
    day_dirs,
    is_url,
    open_lock,
    put_files,
    read_regular_file,
    trace_files,
    valid_day,
)
from flowrl.store.outcomes import OUTCOMES, append_outcomes, ids_with_outcomes, read_outcomes
from flowrl.trace.facts import is_manual_label
from flowrl.trace.load import load_trace, stored_dict
from flowrl.trace.outcomes import HostOutcome, make_outcome
from flowrl.trace.schema import SOURCES, ExecutionTrace

log = logging.getLogger(__name__)

TRACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
LOCK_NAME = ".flowrl-store.lock"
# marks the log record of a skipped file: the CLI names every one at the end of the command instead
READ_PROBLEM = {"flowrl_read_problem": True}


def default_root() -> Path:
    """`$FLOWRL_HOME/traces`, else toolboxv2's `{data_dir}/rl_traces` when importable, else XDG."""
    home = os.environ.get("FLOWRL_HOME")
    if home:
        return Path(home).expanduser() / "traces"
    data_dir = _toolboxv2_data_dir()
    if data_dir is not None:
        return Path(data_dir) / "rl_traces"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "flowrl" / "traces"


def _toolboxv2_data_dir() -> str | None:
    import importlib.util
    import sys

    if "toolboxv2" not in sys.modules and importlib.util.find_spec("toolboxv2") is None:
        return None
    try:  # only when the host already runs toolboxv2; get_app() has side effects otherwise
        tb = sys.modules.get("toolboxv2")
        if tb is None:
            return None
        return str(tb.get_app().data_dir)
    except Exception:  # pragma: no cover - depends on the host
        return None


def dumps(trace: ExecutionTrace | dict[str, Any]) -> bytes:
    data = stored_dict(trace) if isinstance(trace, ExecutionTrace) else trace
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=repr)


@dataclass
class ReadProblem:
    path: Path | str  # a str: a location in a `flowrl.store.segments.SegmentStore` (a URL, `segment#row`)
    message: str


class ReadProblems(list[ReadProblem]):
    """The files one operation could not read, each once: a build that reads the store twice (embedding
    grouping) still has one problem per broken file. `add` says whether the file was new."""

    def __init__(self, problems: Iterable[ReadProblem] = ()) -> None:
        super().__init__()
        self._paths: set[Path | str] = set()
        for problem in problems:
            self.add(problem)

    def add(self, problem: ReadProblem) -> bool:
        key = problem.path if isinstance(problem.path, str) else Path(problem.path)
        if key in self._paths:
            return False
        self._paths.add(key)
        super().append(problem)
        return True

    def append(self, problem: ReadProblem) -> None:  # callers that treat it as a list dedupe too
        self.add(problem)


class _Operations(threading.local):
    """Per thread: the operation now open (`TraceStore.operation`), and the latest one's record."""

    def __init__(self) -> None:
        self.current: ReadProblems | None = None
        self.last = ReadProblems()


@dataclass
class TraceFilter:
    """Which stored traces to read (`TraceStore.iter_traces`; a dataset build's `flowrl.data.DatasetFilter` adds
    its own options to these). Dates are inclusive; None means 'any'. A value no trace can have (an unknown
    source, `since` after `until`) is a ConfigError naming it, not an empty result."""

    since: date | None = None
    until: date | None = None
    agent: str | None = None
    session: str | None = None
    label: bool | None = None
    labelled: bool | None = None
    label_source: str | None = None
    source: str | None = None
    has_reward: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def __post_init__(self) -> None:
        if self.source is not None and self.source not in SOURCES:
            raise ConfigError(f"source {self.source!r}: use one of {', '.join(SOURCES)}")
        if self.label_source is not None and self.label_source not in ("manual", "engine"):
            raise ConfigError(f"label source {self.label_source!r}: use manual or engine")
        if self.since and self.until and self.since > self.until:
            raise ConfigError(f"since {self.since} is after until {self.until}")
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise ConfigError(f"min reward {self.min_reward} is above max reward {self.max_reward}")

    def day_ok(self, day: str) -> bool:
        if self.since is None and self.until is None:
            return True
        if not valid_day(day):  # a trace's own date that does not exist (`2026-13-45`) is in no range
            return False
        d = date.fromisoformat(day)
        return (self.since is None or d >= self.since) and (self.until is None or d <= self.until)

    def matches(self, t: ExecutionTrace) -> bool:
        checks = (
            self.agent is None or t.agent_name == self.agent,
            self.session is None or t.session_id == self.session,
            self.label is None or t.label is self.label,
            self.labelled is None or (t.label is not None) == self.labelled,
            self.label_source is None or t.label_source == self.label_source,
            self.source is None or t.source == self.source,
            self.has_reward is None or (t.reward_score is not None) == self.has_reward,
            self.min_reward is None or (t.reward_score is not None and t.reward_score >= self.min_reward),
            self.max_reward is None or (t.reward_score is not None and t.reward_score <= self.max_reward),
        )
        return all(checks)


class ProblemRecords:
    """The `problems` / `operation()` half of a store's API, shared by `TraceStore` and
    `flowrl.store.segments.SegmentStore`: what one operation could not read, per thread (`_ops`, set by the store)."""

    _ops: _Operations

    @property
    def problems(self) -> ReadProblems:
        """The files skipped as unreadable by the open `operation()`, else by the latest listing."""
        return self._ops.current if self._ops.current is not None else self._ops.last

    @contextlib.contextmanager
    def operation(self) -> Iterator[ReadProblems]:
        """One operation (a listing, a build, a report): its problems, apart from every other's.

        Every listing inside records into the record yielded here. A nested operation's problems also
        count for the one around it. After the outermost one, `store.problems` still names them."""
        ops = self._ops
        outer, ops.current = ops.current, ReadProblems()
        record = ops.current
        try:
            yield record
        finally:
            ops.current = outer
            if outer is None:
                ops.last = record
            else:
                for problem in record:
                    outer.add(problem)

    def _begin(self) -> ReadProblems:
        """The record a listing writes to: the open operation's, else a fresh one."""
        if self._ops.current is not None:
            return self._ops.current
        self._ops.last = ReadProblems()
        return self._ops.last

    @staticmethod
    def _skipper(problems: ReadProblems) -> Callable[[Any, str], None]:
        """Records a file skipped as unreadable in `problems`, logging it the first time."""

        def skip(path: Any, message: str) -> None:
            if problems.add(ReadProblem(path, message)):
                log.warning("flowrl: skipping %s", message, extra=READ_PROBLEM)

        return skip


class OutcomeRecords:
    """`record_outcome`, shared by `TraceStore` and `flowrl.store.segments.SegmentStore`: each appends through its own
    `record_outcomes`."""

    def record_outcomes(self, trace_id: str, outcomes: list[HostOutcome]) -> None:
        raise NotImplementedError

    def record_outcome(self, trace_id: str, outcome: HostOutcome | None = None, **fields: Any) -> HostOutcome:
        """Append an outcome to a run: a `HostOutcome`, or its fields (`reference`, `success`, `rewards`,
        `feedback`, `source`). Append-only and durable when it returns; the trace is not touched, so it may be
        recorded before the trace is written. ConfigError names a value that cannot be one."""
        _check_id(trace_id)
        if outcome is None:
            outcome = make_outcome(**fields)
        elif fields:
            raise ConfigError("give an outcome or its fields, not both")
        self.record_outcomes(trace_id, [outcome])
        return outcome


@dataclass
class TraceStore(ProblemRecords, OutcomeRecords):
    """A folder of traces. Pass it around; `TraceStore.default()` follows `FLOWRL_HOME`."""

    root: Path
    _ops: _Operations = field(default_factory=_Operations, init=False, repr=False, compare=False)
    _write_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _next_clean: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if is_url(self.root):  # Path("s3://b/t") is a local folder "s3:": the traces would land on this disk
            raise ConfigError(
                f"{self.root}: TraceStore is a local folder; open a URL with flowrl.store.open_store(URL) "
                "(the segment store), or pass --store URL to a command"
            )
        self.root = Path(self.root).expanduser()
        self._index = TraceIndex(self.root)
        self._tidy()  # leftovers of a crash are cleaned when the store is opened

    @classmethod
    def default(cls) -> TraceStore:
        return cls(default_root())

    @property
    def staging(self) -> Path:
        return self.root / STAGING

    def _tidy(self) -> None:
        """Clean stale staging files, at most once per `STALE_STAGING_S` (see `clean_staging`)."""
        if time.monotonic() >= self._next_clean:
            self._next_clean = time.monotonic() + STALE_STAGING_S
            clean_staging(self.staging)

    # -- writing ----------------------------------------------------------------------------
    def path_for(self, trace: ExecutionTrace) -> Path:
        """Where `trace` is written: its day folder (see `_day_of`) and `{trace_id}.json`."""
        _check_id(trace.trace_id)
        return self.root / _day_of(trace) / f"{trace.trace_id}.json"

    def write(self, trace: ExecutionTrace) -> Path:
        """Store a trace (replacing one with the same id and date). Returns its path."""
        path = self.path_for(trace)
        self._tidy()
        try:
            atomic_write_bytes(path, dumps(trace), self.staging, within=self.root)
        except OSError as exc:
            raise StoreError(
                f"cannot write {path}: {exc.strerror or exc}: check the store's permissions and free space"
            ) from exc
        self._index.added(trace.trace_id, path)
        return path

    def write_many(self, traces: list[ExecutionTrace]) -> list[Path]:
        """Store many traces with one filesystem sync instead of one fsync each (ingest's bulk path).

        Same guarantee as `write`: every file's data is on disk before it is renamed into place, and every
        touched folder is fsynced (once) after, so a reader or a crash sees each trace whole or not at all.
        Every id is checked before anything is staged; a failure leaves no staged file behind."""
        traces = list(traces)
        paths = [self.path_for(trace) for trace in traces]
        if not paths:
            return []
        self._tidy()
        items = ((path.parent.name, path.name, dumps(trace)) for trace, path in zip(traces, paths, strict=True))
        try:
            put_files(self.root, items, bulk=True)
        except OSError as exc:
            raise StoreError(
                f"cannot write to {self.root}: {exc.strerror or exc}: check the store's permissions and free space"
            ) from exc
        for trace, path in zip(traces, paths, strict=True):
            self._index.added(trace.trace_id, path)
        return paths

    def update(self, trace: ExecutionTrace) -> Path:
        """Rewrite a stored trace in place (its existing file), or write it if it is new.

        Under the store's lock. When the stored file carries a manual review and `trace` does not (it was
        read before the label was given), the stored review is copied onto `trace` before writing: a score
        write never undoes a label. Use `label` to change a manual review."""
        with self._locked():
            existing = self.find(trace.trace_id)
            if existing is None:
                return self.write(trace)
            if not is_manual_label(trace):
                try:
                    stored = self.read_file(existing)
                except SchemaError:
                    stored = None
                if stored is not None and is_manual_label(stored):
                    for name in _REVIEW_FIELDS:
                        setattr(trace, name, getattr(stored, name))
            self._rewrite(existing, trace)
            return existing

    def modify(self, trace_id: str, change: Callable[[ExecutionTrace], object]) -> ExecutionTrace:
        """Read a stored trace, apply `change` to it and write it back, with no other `modify`, `update`
        or `label` (of any thread or process) between the read and the write. Returns the trace written."""
        with self._locked():
            path = self.find(trace_id)
            if path is None:
                raise StoreError(f"no trace {trace_id!r} under {self.root}: list them with `flowrl traces ls`")
            trace = self.read_path(path)
            change(trace)
            self._rewrite(path, trace)
        return trace

    def label(self, trace_id: str, label: bool, notes: str = "") -> ExecutionTrace:
        """Record a manual review verdict. A manual label always wins over the engine's."""

        def review(trace: ExecutionTrace) -> None:
            trace.label = bool(label)
            trace.label_source = "manual"
            trace.manual_review = True
            trace.review_notes = notes

        return self.modify(trace_id, review)

    def _rewrite(self, path: Path, trace: ExecutionTrace) -> None:
        self._tidy()
        try:
            atomic_write_bytes(path, dumps(trace), self.staging, within=self.root)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The store's write lock: `flock` on `{root}/.flowrl-store.lock` (threads and processes alike), or,
        where the platform has no `flock`, a lock for this object's threads."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: this process's threads only
            with self._write_lock:
                yield
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = open_lock(self.root / LOCK_NAME)
        except OSError as exc:
            raise StoreError(
                f"cannot lock {self.root / LOCK_NAME}: {exc.strerror or exc}: check the store's permissions"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def find(self, trace_id: str) -> Path | None:
        """The file of `trace_id`, or None. O(1) after the first call (see `flowrl.store.index`)."""
        _check_id(trace_id)
        return self._index.find(trace_id)

    # -- reading ----------------------------------------------------------------------------
    def exists(self, trace_id: str) -> bool:
        return self.find(trace_id) is not None

    def get(self, trace_id: str) -> ExecutionTrace:
        path = self.find(trace_id)
        if path is None:
            raise StoreError(f"no trace {trace_id!r} under {self.root}: list them with `flowrl traces ls`")
        return self.read_path(path)

    def read_path(self, path: Path, *, outcome_ids: set[str] | None = None) -> ExecutionTrace:
        """Load one stored trace with its host outcomes (`trace.outcomes`). Raises SchemaError naming the file
        when it is not a valid trace. `outcome_ids` (a listing's `ids_with_outcomes`) saves a lookup per file."""
        trace = self.read_file(path)
        if outcome_ids is None or trace.trace_id in outcome_ids:
            trace.outcomes = read_outcomes(self.root, trace.trace_id, self._skipper(self.problems))
        return trace

    @staticmethod
    def read_file(path: Path) -> ExecutionTrace:
        """Load one trace file as it is (no side records). Raises SchemaError naming the file when it is not a
        valid trace."""
        try:
            raw = read_regular_file(path)
        except OSError as exc:
            raise SchemaError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        return trace_from_json(raw, str(path), Path(path))

    # -- the host's outcomes (side records, `flowrl.store.outcomes`) ----------------------------------
    def record_outcomes(self, trace_id: str, outcomes: list[HostOutcome]) -> None:
        """Append checked outcomes to a run's side records, in one durable write."""
        _check_id(trace_id)
        try:
            append_outcomes(self.root, trace_id, outcomes)
        except OSError as exc:
            raise StoreError(
                f"cannot record an outcome under {self.root / OUTCOMES}: {exc.strerror or exc}: "
                "check the store's permissions and free space"
            ) from exc

    def outcomes(self, trace_id: str) -> list[HostOutcome]:
        """The run's outcomes in the order they were recorded."""
        _check_id(trace_id)
        return read_outcomes(self.root, trace_id, self._skipper(self.problems))

    def iter_paths(self, flt: TraceFilter | None = None) -> Iterator[Path]:
        """Stored trace files, oldest day first. Outside an `operation()`, a listing starts a fresh
        `problems` record (what its caller skips while reading them goes there)."""
        yield from self._paths(flt, self._begin())

    def _paths(self, flt: TraceFilter | None, problems: ReadProblems) -> Iterator[Path]:
        """Trace files, oldest day first; every entry that is not one is recorded in `problems` (once)."""
        skip = self._skipper(problems)
        for day in sorted(day_dirs(self.root, skip)):
            if flt is None or flt.day_ok(day.name):
                yield from trace_files(day, skip)

    def iter_traces(self, flt: TraceFilter | None = None, **filters: Any) -> Iterator[ExecutionTrace]:
        """Stream stored traces, oldest day first. Corrupt files are logged, recorded once each in this
        operation's `problems` and skipped; they never stop the iteration."""
        if flt is None:
            flt = TraceFilter(**{k: _coerce_date(k, v) for k, v in filters.items()})
        problems = self._begin()
        skip = self._skipper(problems)
        outcome_ids = ids_with_outcomes(self.root)
        for path in self._paths(flt, problems):
            try:
                trace = self.read_path(path, outcome_ids=outcome_ids)
            except SchemaError as exc:
                skip(path, str(exc))
                continue
            if flt.matches(trace):
                yield trace

    def count(self) -> int:
        return sum(1 for _ in self._paths(None, ReadProblems()))

    def count_paths(self, flt: TraceFilter | None = None) -> int:
        """How many paths `iter_paths(flt)` gives."""
        return sum(1 for _ in self.iter_paths(flt))

    def listed_outcomes(self) -> set[str]:
        """The ids of the traces with host outcomes, listed once (what `read_path(outcome_ids=...)` takes), so a
        scan does not look for outcomes once per trace file."""
        return ids_with_outcomes(self.root)

    @property
    def shared(self) -> bool:
        """A folder: another process that opens it sees it."""
        return True

    def flush(self) -> None:
        """Nothing is buffered: every write is durable when it returns."""


# The fields of a person's review: `label` writes them, `update` never undoes them.
_REVIEW_FIELDS = ("label", "label_source", "manual_review", "review_notes")


def _coerce_date(key: str, value: Any) -> Any:
    if key in ("since", "until") and isinstance(value, str):
        return date.fromisoformat(value)
    if key in ("since", "until") and isinstance(value, datetime):
        return value.date()
    return value


def _day_of(trace: ExecutionTrace) -> str:
    """The trace's day folder: the date of its timestamp, or, when that date does not exist (`2026-13-45`,
    `0000-01-01`), the day it is written (UTC, as for a trace without a timestamp). The timestamp is kept."""
    day = trace.date()
    return day if valid_day(day) else datetime.now(UTC).strftime("%Y-%m-%d")


def _id_from_name(path: Path) -> str:
    """The id of a stored file without a `trace_id`: its file name, which is what `find` knows it by, so a
    rewrite (`flowrl score`, `label`) lands on this same file instead of adding a copy at each read."""
    if not TRACE_ID.match(path.stem):
        raise SchemaError(
            f"{path}: no trace_id, and the file name is not a usable one (letters, digits, '_', "
            "'-', '.'): add a \"trace_id\" field or rename the file"
        )
    return path.stem


def trace_from_json(raw: bytes, where: str, file: Path | None) -> ExecutionTrace:
    """A stored trace's JSON as a trace: empty and invalid JSON are SchemaErrors naming `where`; a trace without
    an id takes it from its file's name (`file`, when it came from one)."""
    if not raw.strip():
        raise SchemaError(f"{where}: empty file")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"{where}: not valid JSON ({exc})") from exc
    if isinstance(data, dict) and not data.get("trace_id") and file is not None:
        data["trace_id"] = _id_from_name(file)
    return load_trace(data, origin=where)


def _check_id(trace_id: str) -> None:
    if not isinstance(trace_id, str) or not TRACE_ID.match(trace_id):
        raise StoreError(f"invalid trace id {trace_id!r}: use letters, digits, '_', '-' and '.'")
