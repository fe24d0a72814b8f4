"""One hook's handle on the shared collector of its store: its counters, masking and share of the queue.

`flowrl.capture.collector` owns the queue and the writer threads; a `Registration` is what a hook holds.
It calls back into its collector only through the collector's own methods, so this module imports none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from flowrl.trace.redact import Redactor

if TYPE_CHECKING:
    from flowrl.store.files import TraceStore

DEFAULT_QUEUE_SIZE = 1024
DEFAULT_EXIT_TIMEOUT = 5.0
DEFAULT_IO_THREADS = 8
DEFAULT_MAX_CHARS = 65536
BATCH_MAX = 64  # traces built while others waited are written together (one filesystem sync)


def check_queue_size(queue_size: Any) -> None:
    if not isinstance(queue_size, int) or queue_size < 1:
        raise ValueError(f"queue_size must be a positive integer, not {queue_size!r}")


@dataclass
class CaptureStats:
    """Counters of one hook. Read them any time; they only go up."""

    captured: int = 0  # runs finished and handed to the writer
    dropped: int = 0  # runs not written because the queue was full or the hook was closed
    written: int = 0  # traces written to the store
    errors: int = 0  # failures inside flowrl, all kinds (capture steps, building, writing)
    write_errors: int = 0  # of which: the store refused the write
    build_errors: int = 0  # of which: a record could not be turned into a valid trace
    capture_errors: int = 0  # of which: a capture step on the host's side failed (the run went on)
    batch_write_errors: int = 0  # write_many raised; its traces were then written one at a time
    mask_failures: int = 0  # values masked whole because the user's mask raised
    secrets_masked: int = 0  # secrets replaced by the built-in patterns
    tool_calls: int = 0  # tool calls in written traces
    llm_calls: int = 0  # LLM calls in written traces
    unattributed: int = 0  # calls on a hooked agent outside any captured run (not recorded)
    events_over_limit: int = 0  # events past max_events_per_run (not recorded)
    outcomes: int = 0  # the host's outcomes recorded in the store (`record_outcome`)
    outcome_errors: int = 0  # of which could not be: a bad value, or the store refused the write

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Writer(Protocol):
    """What a registration calls on its collector (`flowrl.capture.collector.TraceCollector`, above this module)."""

    store: TraceStore

    def _submit(self, record: Any, reg: Registration) -> bool: ...

    def _flush(self, timeout: float | None, reg: Registration) -> bool: ...

    def _release(self, reg: Registration, timeout: float | None) -> bool: ...

    def _release_later(self, reg: Registration) -> None: ...

    def _fail(self, reg: Registration, what: str, exc: BaseException) -> None: ...


class Registration:
    """One hook's handle on a collector: its counters, its masking and its share of the queue.

    `submit(record)` queues a record (a `RunRecord`, or anything with `.build() -> dict`), `flush()` waits for what was
    queued, `close()` lets go of the collector (the last registration to go stops its threads)."""

    def __init__(
        self,
        collector: Writer,
        *,
        mask: Callable[[str], str] | None = None,
        redact: bool = True,
        max_chars: int | None = DEFAULT_MAX_CHARS,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        exit_timeout: float = DEFAULT_EXIT_TIMEOUT,
        stats: CaptureStats | None = None,
    ) -> None:
        check_queue_size(queue_size)
        self.collector = collector
        self.redactor = Redactor(mask=mask, max_chars=max_chars) if redact else None
        # strings over max_chars are cut to head and tail while the trace is built (masking on or off); when
        # masking, the edges kept are first masked with the built-in patterns (values.Values.cut)
        self.max_chars = max_chars
        self.premask = Redactor(max_chars=None) if redact and max_chars is not None else None
        self.queue_size = queue_size
        self.exit_timeout = float(exit_timeout)
        self.stats = stats or CaptureStats()
        self.lock = threading.RLock()  # reentrant: the garbage collector may count while a count runs
        # set by the owner (the Hook): how failures are logged, and what to finish before a flush
        self.on_error: Callable[[str, BaseException], None] | None = None
        self.before_flush: Callable[[float | None], None] | None = None
        self.on_written: Callable[[Any], None] | None = None  # given each trace once it is written
        self.accepted = 0  # records queued (host side, under the collector's lock)
        self.taken = 0  # records the writer took off the queue (written by the writer thread only)
        self.failed = 0  # records that failed to build or to write
        self.failed_reported = 0  # failures a flush() has already answered False for
        self.closed = False

    @property
    def store(self) -> TraceStore:
        return self.collector.store

    @property
    def queued(self) -> int:
        return self.accepted - self.taken

    def submit(self, record: Any) -> bool:
        """Queue a record for writing. Never blocks; False (and counted) when it was dropped."""
        return self.collector._submit(record, self)

    def captured(self, rec: Any) -> bool:
        """A run is over: counted (`captured`, and `events_over_limit` for the events it could not keep) and
        queued for writing (`submit`)."""
        if rec.overflow:
            self.count("events_over_limit", rec.overflow)
        self.count("captured")
        return self.submit(rec)

    def count(self, name: str, n: int = 1) -> None:
        """Add to one of `stats`' counters (thread-safe)."""
        with self.lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def flush(self, timeout: float | None = None) -> bool:
        return self.collector._flush(timeout, self)

    def close(self, timeout: float | None = None) -> bool:
        """Write what this registration queued (up to `timeout`), then let go of the collector."""
        return self.collector._release(self, timeout)

    def abandon(self) -> None:
        """`close` without waiting or taking the registry's lock: for the garbage collector's callbacks.
        Later submits are dropped at once; the writer thread lets go of the collector soon after."""
        self._before_flush(0)
        self.collector._release_later(self)

    def _before_flush(self, timeout: float | None) -> None:
        if self.before_flush is not None:
            try:
                self.before_flush(timeout)
            except Exception as exc:  # pragma: no cover - defensive
                self.collector._fail(self, "finishing waiting runs", exc)
