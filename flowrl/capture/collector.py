"""TraceCollector: a bounded queue and one background writer thread.

The host's event loop only appends a finished run record to a deque (when the deque is full the
record is dropped and counted: the host never waits). The writer thread builds the trace from the
record, masks secrets (`flowrl.redact.Redactor`, with the user's `mask`) and validates it; a few I/O
threads (`io_threads`, default 8) then write it through the store: `TraceStore.write` (atomic, its
own fsync) for a lone trace, `TraceStore.write_many` (atomic, one filesystem sync) for the traces that
piled up while the disk was busy. The sync, not Python, is what limits the rate; it runs without the
GIL. Every failure there is counted in `stats` and logged; none reaches the host.

`flush()` waits until what was queued before the call is written. At interpreter exit an `atexit`
handler flushes every live collector (bounded by `exit_timeout`). After `os.fork()` the child starts
with an empty queue and its own writer thread (the parent's queue is the parent's to write).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flowrl.capture.assemble import complete_trace
from flowrl.capture.masking import redact_trace
from flowrl.redact import Redactor
from flowrl.schema import ExecutionTrace, load_trace
from flowrl.store import TraceStore

log = logging.getLogger("flowrl.capture")

DEFAULT_QUEUE_SIZE = 1024
DEFAULT_EXIT_TIMEOUT = 5.0
DEFAULT_IO_THREADS = 8
BATCH_MAX = 64  # traces built while others waited are written together (one filesystem sync)
_STOP = object()


@dataclass
class CaptureStats:
    """Counters of one hook (one collector). Read them any time; they only go up."""

    captured: int = 0        # runs finished and handed to the writer
    dropped: int = 0         # runs not written because the queue was full or the hook was closed
    written: int = 0         # traces written to the store
    errors: int = 0          # failures inside flowrl, all kinds (capture steps, building, writing)
    write_errors: int = 0    # of which: the store refused the write
    build_errors: int = 0    # of which: a record could not be turned into a valid trace
    capture_errors: int = 0  # of which: a capture step on the host's side failed (the run went on)
    mask_failures: int = 0   # values masked whole because the user's mask raised
    secrets_masked: int = 0  # secrets replaced by the built-in patterns
    tool_calls: int = 0      # tool calls in written traces
    llm_calls: int = 0       # LLM calls in written traces
    unattributed: int = 0    # calls on a hooked agent outside any captured run (not recorded)
    events_over_limit: int = 0  # events past max_events_per_run (not recorded)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Counter:
    """A lock around `CaptureStats`: several threads count into it."""

    def __init__(self, stats: CaptureStats) -> None:
        self.stats = stats
        self.lock = threading.Lock()

    def bump(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)


_LIVE: weakref.WeakSet[TraceCollector] = weakref.WeakSet()
_PROCESS_HOOKS_DONE = False


def _at_exit() -> None:
    for collector in list(_LIVE):
        try:
            collector.flush(timeout=collector.exit_timeout)
        except Exception:  # pragma: no cover - best effort at shutdown
            log.warning("flowrl: flushing traces at exit failed", exc_info=True)


def _after_fork_in_child() -> None:
    for collector in list(_LIVE):
        collector._reinit_after_fork()


def _install_process_hooks() -> None:
    global _PROCESS_HOOKS_DONE
    if _PROCESS_HOOKS_DONE:
        return
    _PROCESS_HOOKS_DONE = True
    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)


def as_store(store: TraceStore | str | os.PathLike[str] | None) -> TraceStore:
    if store is None:
        return TraceStore.default()
    if isinstance(store, TraceStore):
        return store
    if isinstance(store, (str, os.PathLike)):
        return TraceStore(Path(store))
    raise TypeError(f"store must be a TraceStore or a folder path, not {type(store).__name__}")


class TraceCollector:
    """Queue + writer thread. `submit(record)` takes anything with `.build() -> dict`; `submit_trace`
    takes a ready `ExecutionTrace` (or trace dict)."""

    def __init__(
        self,
        store: TraceStore | str | os.PathLike[str] | None = None,
        *,
        mask: Callable[[str], str] | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        redact: bool = True,
        max_chars: int | None = 65536,
        exit_timeout: float = DEFAULT_EXIT_TIMEOUT,
        io_threads: int = DEFAULT_IO_THREADS,
        stats: CaptureStats | None = None,
    ) -> None:
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be a positive integer, not {queue_size!r}")
        if not isinstance(io_threads, int) or io_threads < 0:
            raise ValueError(f"io_threads must be a non-negative integer, not {io_threads!r}")
        self.io_threads = io_threads
        self.store = as_store(store)
        self.redactor = Redactor(mask=mask, max_chars=max_chars) if redact else None
        self.queue_size = queue_size
        self.exit_timeout = exit_timeout
        self.stats = stats or CaptureStats()
        self._count = _Counter(self.stats)
        # set by the owner (the Hook): how failures are logged, and what to finish before a flush
        self.on_error: Callable[[str, BaseException], None] | None = None
        self.before_flush: Callable[[float | None], None] | None = None
        self._init_runtime()
        _install_process_hooks()
        _LIVE.add(self)

    def _init_runtime(self) -> None:
        self._queue: deque[Any] = deque()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._accepted = 0   # records queued so far
        self._done = 0       # records taken off the queue and finished (written or failed)
        self._failed = 0     # records that failed to build or to write
        self._failed_reported = 0  # failures a flush() has already answered False for
        self._thread: threading.Thread | None = None
        # batches of built traces waiting for an I/O thread; bounded, so a stalled disk backs up into the deque
        self._io: queue.Queue[Any] = queue.Queue(maxsize=max(2 * self.io_threads, 1))
        self._io_started = 0
        self._closed = False
        self._pid = os.getpid()

    def _reinit_after_fork(self) -> None:
        closed = self._closed
        self._init_runtime()  # new locks and no thread: the parent's may be held or gone
        self._closed = closed

    # -- the host's side ------------------------------------------------------------------------
    def submit(self, record: Any) -> bool:
        """Queue a record for writing. Never blocks; False (and counted) when it was dropped."""
        if self._pid != os.getpid():
            self._reinit_after_fork()
        with self._lock:
            if self._closed or len(self._queue) >= self.queue_size:
                reason: str | None = "closed" if self._closed else "full"
            else:
                self._queue.append(record)
                self._accepted += 1
                reason = None
            start = reason is None and self._thread is None
        if reason is not None:
            self._count.bump("dropped")
            dropped = self.stats.dropped
            if dropped == 1 or dropped % 1000 == 0:
                log.warning("flowrl: trace queue %s; dropped a run (%d dropped so far)", reason, dropped)
            return False
        if start:
            self._start()
        self._wake.set()
        return True

    def count(self, name: str, n: int = 1) -> None:
        """Add to one of `stats`' counters (thread-safe)."""
        self._count.bump(name, n)

    def submit_trace(self, trace: ExecutionTrace | dict[str, Any]) -> bool:
        return self.submit(_Ready(trace))

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _start(self) -> None:
        if sys.is_finalizing():  # no new threads while the interpreter shuts down
            return
        with self._lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="flowrl-trace-writer", daemon=True)
            self._thread = thread
            io = [threading.Thread(target=self._write_loop, name=f"flowrl-trace-io-{i}", daemon=True)
                  for i in range(self._io_started, self.io_threads)]
            self._io_started = self.io_threads
        thread.start()
        for t in io:
            t.start()

    # -- the writer thread and the I/O threads ----------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            batch: list[ExecutionTrace] = []
            while True:
                try:
                    record = self._queue.popleft()
                except IndexError:
                    break
                trace = self._build(record)
                if trace is None:
                    self._finished(False)
                    continue
                batch.append(trace)
                if len(batch) >= BATCH_MAX or not self._queue:
                    self._hand_over(batch)
                    batch = []
            if batch:
                self._hand_over(batch)
            with self._lock:
                if self._closed and not self._queue:
                    self._thread = None
                    self._cond.notify_all()
                    started, self._io_started = self._io_started, 0
                    break
        for _ in range(started):
            self._io.put(_STOP)  # after the traces already handed over
        _LIVE.discard(self)

    def _hand_over(self, batch: list[ExecutionTrace]) -> None:
        if self.io_threads:
            self._io.put(batch)  # blocks only this thread, and only while every I/O thread is busy
        else:
            self._write_batch(batch)

    def _write_loop(self) -> None:
        while True:
            batch = self._io.get()
            if batch is _STOP:
                return
            self._write_batch(batch)

    def _write_batch(self, batch: list[ExecutionTrace]) -> None:
        """One trace: `TraceStore.write` (its own fsync). A backlog: `write_many`, one filesystem sync for
        the lot (same all-or-nothing guarantee per file); if that fails, each trace on its own."""
        write_many = getattr(self.store, "write_many", None)
        if len(batch) > 1 and write_many is not None:
            try:
                write_many(batch)
            except Exception:
                pass  # retried one by one below, where each failure is counted
            else:
                for trace in batch:
                    self._written(trace)
                    self._finished(True)
                return
        for trace in batch:
            self._finished(self._write(trace))

    def _finished(self, ok: bool) -> None:
        with self._cond:
            self._done += 1
            if not ok:
                self._failed += 1
            self._cond.notify_all()

    def _build(self, record: Any) -> ExecutionTrace | None:
        try:
            data = record.build()
            if self.redactor is not None:
                data = redact_trace(self.redactor, data)
            return load_trace(complete_trace(data), origin="live capture")
        except Exception as exc:
            self._count.bump("build_errors")
            self._fail("building a trace", exc)
            return None
        finally:
            self._sync_redaction_counts()

    def _write(self, trace: ExecutionTrace) -> bool:
        try:
            self.store.write(trace)
        except Exception as exc:
            self._count.bump("write_errors")
            self._fail(f"writing a trace to {self.store.root}", exc)
            return False
        self._written(trace)
        return True

    def _written(self, trace: ExecutionTrace) -> None:
        with self._count.lock:
            self.stats.written += 1
            self.stats.tool_calls += len(trace.tool_calls)
            self.stats.llm_calls += len(trace.llm_calls)

    def _sync_redaction_counts(self) -> None:
        if self.redactor is not None:
            rs = self.redactor.stats
            with self._count.lock:
                self.stats.mask_failures = rs.mask_failures
                self.stats.secrets_masked = rs.masked

    def _fail(self, what: str, exc: BaseException) -> None:
        self._count.bump("errors")
        if self.on_error is not None:
            try:
                self.on_error(what, exc)
                return
            except Exception:  # pragma: no cover
                pass
        log.warning("flowrl: %s failed: %s", what, exc)

    # -- waiting and closing ----------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record queued before this call is written.

        True when they all were and nothing failed since the previous flush; False on timeout or when
        a run could not be built or written (see `stats`). Blocks the calling thread: from async code
        use `await asyncio.to_thread(hook.flush)`.
        """
        if self._pid != os.getpid():
            self._reinit_after_fork()
        if self.before_flush is not None:
            try:
                self.before_flush(timeout)
            except Exception as exc:  # pragma: no cover - defensive
                self._fail("finishing waiting runs", exc)
        with self._lock:
            target = self._accepted
            need_thread = self._thread is None and self._done < target
        if need_thread:
            self._start()
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            clean = self._failed == self._failed_reported
            self._failed_reported = self._failed
            return clean

    def close(self, timeout: float | None = None) -> bool:
        """Write what is queued (waiting up to `timeout`), then stop the writer thread once the queue is
        empty. Later submits are dropped (counted). `timeout=0` never blocks."""
        if timeout == 0:  # do not wait (and do not start a thread: this may run inside the GC)
            if self.before_flush is not None:
                self.before_flush(0)
            ok = self._done >= self._accepted
        else:
            ok = self.flush(timeout)
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is None:
                _LIVE.discard(self)
        self._wake.set()
        if thread is not None and thread is not threading.current_thread() and timeout != 0:
            thread.join(timeout)
        return ok

    @property
    def closed(self) -> bool:
        return self._closed


class _Ready:
    """A trace that is already built (submit_trace)."""

    __slots__ = ("trace",)

    def __init__(self, trace: ExecutionTrace | dict[str, Any]) -> None:
        self.trace = trace

    def build(self) -> dict[str, Any]:
        if isinstance(self.trace, ExecutionTrace):
            return self.trace.to_dict()
        return dict(self.trace)
