"""TraceCollector: one per store per process, with one writer thread and a few I/O threads.

Every hook writing to the same store (same resolved root) shares one collector: `attach(store, ...)`
returns a `Registration`, the hook's thin handle on it, which carries what is the hook's own: its
`stats`, its masking (`mask`, `redact`, `max_chars`), its share of the queue (`queue_size`) and its
`exit_timeout`. Five hooked agents therefore cost one collector's threads, not five.

The host's event loop only appends a finished run record to a deque (when the hook's share is full
the record is dropped and counted: the host never waits). The writer thread builds the trace from the
record, masks it with the hook's redactor and validates it; the I/O threads (`io_threads`, default 8,
the largest any attached hook asked for) then write it through the store: `TraceStore.write` (atomic,
its own fsync) for a lone trace, `TraceStore.write_many` (atomic, one filesystem sync) for the traces
that piled up while the disk was busy. When `write_many` raises, its traces are written one at a time,
`batch_write_errors` is counted and the first failure is logged. Every failure is counted in the
hook's `stats`; none reaches the host.

Lifecycle: the collector is created by the first `attach` for a store, its threads start with the
first run queued, and when the last registration closes it writes what is queued, stops its threads
and leaves the registry (the next hook on that store gets a new one). `flush()` waits until what was
queued before the call is written. At interpreter exit an `atexit` handler flushes every live
collector (bounded by `exit_timeout`). After `os.fork()` the child starts with an empty queue and its
own writer thread (the parent's queue is the parent's to write).

A `TraceCollector` can also be built directly (`TraceCollector(store)`, `submit(record)`): that one is
private to its owner, not in the registry, and counts into its own `stats`.
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
from pathlib import Path
from typing import Any

from flowrl.capture.assemble import build_trace, complete_trace
from flowrl.capture.masking import redact_outcomes, redact_trace
from flowrl.capture.recorder import RunRecord
from flowrl.capture.registration import (
    BATCH_MAX,
    DEFAULT_EXIT_TIMEOUT,
    DEFAULT_IO_THREADS,
    DEFAULT_MAX_CHARS,
    DEFAULT_QUEUE_SIZE,
    CaptureStats,
    Registration,
    check_queue_size,
)
from flowrl.store.files import TraceStore
from flowrl.store.opener import open_store
from flowrl.trace.load import load_trace
from flowrl.trace.outcomes import HostOutcome
from flowrl.trace.redact import Redactor
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger("flowrl.capture")

_STOP = object()
_CHECK_WRITER_S = 0.5  # how often a waiting flush() checks that the writer thread is still there


# -- the process-wide registry: one shared collector per store root ---------------------------------

_SHARED: dict[Path, TraceCollector] = {}
_REGISTRY_LOCK = threading.RLock()
_LIVE: weakref.WeakSet[TraceCollector] = weakref.WeakSet()
_PROCESS_HOOKS_DONE = False


def store_key(store: TraceStore) -> Path:
    """What makes two stores one: the resolved root folder."""
    return Path(os.path.abspath(store.root)).resolve()


def attach(
    store: TraceStore | str | os.PathLike[str] | None, *, io_threads: int = DEFAULT_IO_THREADS, **options: Any
) -> Registration:
    """Register a hook on the process's collector for `store` (created on first use).

    `options` are the hook's own (`mask`, `redact`, `max_chars`, `queue_size`, `exit_timeout`, `stats`).
    The collector runs the largest `io_threads` any of its registrations asked for."""
    _check_io_threads(io_threads)
    check_queue_size(options.get("queue_size", DEFAULT_QUEUE_SIZE))  # before a collector is made for it
    resolved = as_store(store)
    key = store_key(resolved)
    with _REGISTRY_LOCK:
        collector = _SHARED.get(key)
        if collector is None or collector.closed:
            collector = _SHARED[key] = TraceCollector(resolved, io_threads=io_threads)
            collector._shared_key = key
        return collector._register(io_threads, options)


def shared_collectors() -> list[TraceCollector]:
    """The collectors hooks share in this process, one per store (for diagnostics and tests)."""
    with _REGISTRY_LOCK:
        return list(_SHARED.values())


def _at_exit() -> None:
    for collector in list(_LIVE):
        try:
            collector._reap()
            collector.flush(timeout=collector.exit_timeout)
        except Exception:  # pragma: no cover - best effort at shutdown
            log.warning("flowrl: flushing traces at exit failed", exc_info=True)


def _after_fork_in_child() -> None:
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.RLock()  # another thread of the parent may have held it
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
    """The store to write to: a `TraceStore`, a `SegmentStore` (anything with `write` and `flush`), or a folder
    or URL opened by `flowrl.store.opener.open_store` (segments for `s3://...` or a folder holding `segments/`)."""
    if store is None:
        return TraceStore.default()
    if isinstance(store, TraceStore):
        return store
    if callable(getattr(store, "write", None)) and callable(getattr(store, "flush", None)):
        return store  # type: ignore[return-value]  # a SegmentStore: the same writing API
    if isinstance(store, (str, os.PathLike)):
        return open_store(store)  # type: ignore[return-value]
    raise TypeError(f"store must be a TraceStore, a SegmentStore, a folder or a URL, not {type(store).__name__}")


def _check_io_threads(io_threads: Any) -> None:
    if not isinstance(io_threads, int) or io_threads < 0:
        raise ValueError(f"io_threads must be a non-negative integer, not {io_threads!r}")


class TraceCollector:
    """Queue + writer thread + I/O threads for one store. Hooks get one through `attach`; used directly,
    `submit(record)` takes a captured run (`recorder.RunRecord`) or anything with `.build() -> dict` (a trace
    dict of JSON values), counted in this
    collector's own `stats`."""

    def __init__(
        self,
        store: TraceStore | str | os.PathLike[str] | None = None,
        *,
        mask: Callable[[str], str] | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        redact: bool = True,
        max_chars: int | None = DEFAULT_MAX_CHARS,
        exit_timeout: float = DEFAULT_EXIT_TIMEOUT,
        io_threads: int = DEFAULT_IO_THREADS,
        stats: CaptureStats | None = None,
    ) -> None:
        _check_io_threads(io_threads)
        self.io_threads = io_threads
        self.store = as_store(store)
        self._shared_key: Path | None = None  # set when the registry holds it
        self._regs: set[Registration] = set()  # the hooks attached
        self._gone: deque[Registration] = deque()  # abandoned by the garbage collector, to let go of
        self._batch_failure_logged = False
        self._init_runtime()
        # what `submit`, `stats` and `count` use when the collector is used directly
        self._own = Registration(
            self,
            mask=mask,
            redact=redact,
            max_chars=max_chars,
            queue_size=queue_size,
            exit_timeout=exit_timeout,
            stats=stats,
        )
        _install_process_hooks()
        _LIVE.add(self)

    def _init_runtime(self) -> None:
        # `_lock` guards the queue, the counters and the threads; the registry's lock guards `_SHARED` and
        # `_regs`. Neither is ever taken while holding the other. A garbage-collector callback (an agent
        # gone without unhook) may take `_lock` (reentrant for that), never the registry's lock.
        self._queue: deque[_Item] = deque()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._accepted = 0  # records queued so far
        self._done = 0  # records taken off the queue and finished (written or failed)
        self._thread: threading.Thread | None = None
        self._held: list[_Item] = []  # what the writer took off the queue and still holds (see _run)
        self._logged: set[str] = set()  # failures of the writer itself already logged (each kind once)
        # batches of built traces waiting for an I/O thread; bounded, so a stalled disk backs up into the deque
        self._io: queue.Queue[Any] = queue.Queue(maxsize=max(2 * self.io_threads, 1))
        self._workers: list[threading.Thread] = []  # the I/O threads started
        self._closed = False
        self._pid = os.getpid()

    def _reinit_after_fork(self) -> None:
        closed = self._closed
        self._init_runtime()  # new locks and no thread: the parent's may be held or gone
        self._closed = closed
        for reg in [self._own, *self._regs]:
            reg.lock = threading.RLock()
            reg.taken = reg.accepted  # the queue they were in is the parent's

    # -- registrations ----------------------------------------------------------------------------
    @property
    def stats(self) -> CaptureStats:
        return self._own.stats

    @property
    def redactor(self) -> Redactor | None:
        return self._own.redactor

    @property
    def exit_timeout(self) -> float:
        return max([self._own.exit_timeout, *(r.exit_timeout for r in list(self._regs))])

    @property
    def registrations(self) -> int:
        """How many hooks are attached."""
        return sum(1 for r in list(self._regs) if not r.closed)

    def _register(self, io_threads: int, options: dict[str, Any]) -> Registration:
        """Add a registration (under the registry's lock: `_regs` only grows there)."""
        reg = Registration(self, **options)
        self._regs.add(reg)
        if io_threads > self.io_threads:
            self._io.maxsize = 2 * io_threads  # no mutex: a putter waiting meanwhile wakes on the next get
            self.io_threads = io_threads  # the writer starts the extra threads on its next round
        return reg

    def _release(self, reg: Registration, timeout: float | None) -> bool:
        if reg is self._own:
            return self.close(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout == 0:  # do not wait
            reg._before_flush(0)
            ok = reg.taken >= reg.accepted
        else:
            ok = self._flush(timeout, reg)
        last = self._let_go(reg)
        if last:  # stop the threads once what others queued meanwhile is written
            self.close(None if deadline is None else 0 if timeout == 0 else max(0.001, deadline - time.monotonic()))
        return ok

    def _let_go(self, reg: Registration) -> bool:
        """Close `reg` and drop every closed registration. True when no open one is left and this call
        took the (shared) collector out of the registry: closing it is then the caller's job."""
        reg.closed = True  # its later submits are dropped
        reg.on_error = reg.before_flush = None  # the collector no longer refers to the hook
        with _REGISTRY_LOCK:
            self._regs = {r for r in self._regs if not r.closed}
            if self._regs or self._shared_key is None or _SHARED.get(self._shared_key) is not self:
                return False
            del _SHARED[self._shared_key]
            return True

    def _release_later(self, reg: Registration) -> None:
        reg.closed = True
        self._gone.append(reg)
        self._wake.set()  # a running writer lets go of it; otherwise the next unhook or exit does

    def _reap(self) -> None:
        """Let go of the registrations the garbage collector abandoned (never from a GC callback). With
        no writer running, a collector whose hooks all went that way stays idle, without threads, and is
        reused by the next hook on its store."""
        last = False
        while self._gone:
            try:
                reg = self._gone.popleft()
            except IndexError:  # pragma: no cover - another thread took it
                break
            last = self._let_go(reg) or last
        if last:
            self.close(0)

    # -- the host's side ------------------------------------------------------------------------
    def submit(self, record: Any) -> bool:
        """Queue a record for writing. Never blocks; False (and counted) when it was dropped."""
        return self._submit(record, self._own)

    def _submit(self, record: Any, reg: Registration) -> bool:
        if self._pid != os.getpid():
            self._reinit_after_fork()
        item = _Item(record, reg)  # made outside the lock: nothing in there allocates a tracked object
        with self._lock:
            if self._closed or reg.closed:
                reason: str | None = "closed"
            elif reg.accepted - reg.taken >= reg.queue_size:
                reason = "full"
            else:
                self._queue.append(item)
                self._accepted += 1
                reg.accepted += 1
                reason = None
            start = reason is None and not self._writer_running()
        if reason is not None:
            reg.count("dropped")
            dropped = reg.stats.dropped
            if dropped == 1 or dropped % 1000 == 0:
                log.warning("flowrl: trace queue %s; dropped a run (%d dropped so far)", reason, dropped)
            return False
        if start:
            self._start()
        self._wake.set()
        return True

    def count(self, name: str, n: int = 1) -> None:
        """Add to one of `stats`' counters (thread-safe)."""
        self._own.count(name, n)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _writer_running(self) -> bool:
        """A writer thread is running or being started (under `_lock`). A writer that died is not: the
        next submit or flush starts another (`_start`), so no run waits for a thread that is gone."""
        thread = self._thread
        return thread is not None and (thread.ident is None or thread.is_alive())

    def _writer_lost(self) -> bool:
        """Runs wait for a writer that is not there: it died, or none could be started for what is queued
        (not: it stopped after its last run while the I/O threads finish writing)."""
        thread = self._thread
        return (thread is not None or bool(self._queue)) and not self._writer_running()

    def _start(self) -> None:
        """Start the writer thread, unless one is running. One that died (whatever killed it) is replaced:
        what it held is counted as failed, what is queued is written by the new one."""
        if sys.is_finalizing():  # no new threads while the interpreter shuts down
            return
        with self._lock:
            if self._writer_running():
                return
            dead, held = self._thread, self._held
            thread = threading.Thread(target=self._run, name="flowrl-trace-writer", daemon=True)
            self._thread = thread
            self._held = []
        if dead is not None:
            self._lost(held, RuntimeError("the trace writer thread ended unexpectedly; a new one took over"))
        try:
            thread.start()
        except BaseException as exc:  # no thread to be had now (resource limits): the next submit or flush retries
            with self._lock:
                if self._thread is thread:
                    self._thread = None
            self._log_once("start", "flowrl: could not start the trace writer thread (%s); runs stay queued", exc)

    def _start_io(self) -> None:
        """On the writer thread: bring the I/O threads up to `io_threads` (it stops each when it ends),
        replacing any that died."""
        with self._lock:
            self._workers = [t for t in self._workers if t.is_alive()]
            missing = self.io_threads - len(self._workers)
        for _ in range(missing):
            t = threading.Thread(target=self._write_loop, name=f"flowrl-trace-io-{len(self._workers)}", daemon=True)
            try:
                t.start()
            except BaseException as exc:  # fewer I/O threads (or none: the writer then writes itself)
                self._log_once("start-io", "flowrl: could not start a trace I/O thread (%s)", exc)
                break
            with self._lock:
                self._workers.append(t)

    # -- the writer thread and the I/O threads ----------------------------------------------------
    def _run(self) -> None:
        """The writer thread. Whatever a step raises (BaseException included: a mask or callback may raise
        SystemExit) fails only the run it was for (counted, logged) and the writer goes on; should the
        thread end anyway, what it held is counted as failed and the next submit or flush starts another."""
        held: list[_Item] = []  # taken off the queue and not yet finished nor handed to an I/O thread
        with self._lock:
            if self._thread is threading.current_thread():
                self._held = held
        stopped = False
        try:
            while not stopped:
                try:
                    stopped = self._round(held)
                except BaseException as exc:
                    self._lost(held, exc)
        finally:
            if not stopped:  # pragma: no cover - only when the guard above itself failed
                self._lost(held, RuntimeError("the trace writer thread ended"))
                with self._lock:
                    if self._thread is threading.current_thread():
                        self._thread = None
                    restart = bool(self._queue)
                if restart:
                    self._start()

    def _round(self, held: list[_Item]) -> bool:
        """Wait for runs, build and hand over all that are queued. True once closed and drained."""
        if len(self._workers) < self.io_threads or not all(t.is_alive() for t in self._workers):
            self._start_io()
        self._wake.wait()
        self._wake.clear()
        batch: list[tuple[ExecutionTrace, _Item]] = []
        item: _Item | None = None
        trace: ExecutionTrace | None = None
        while True:
            try:
                item = self._queue.popleft()
            except IndexError:
                break
            held.append(item)
            item.reg.taken += 1
            if isinstance(item.record, OutcomeRecord):  # said after its run was handed over: written here
                self._finished(item, self._save_outcomes(item.record.trace_id, item.record.outcomes, item.reg))
                continue
            trace = self._build(item.record, item.reg)
            if trace is None:
                self._finished(item, False)
                continue
            batch.append((trace, item))
            if len(batch) >= BATCH_MAX or not self._queue:
                self._hand_over(batch)
                batch = []
                held.clear()
        if batch:
            self._hand_over(batch)
        held.clear()
        item = trace = None  # do not hold the last run (nor its hook) while idle
        batch = []
        if self._gone:
            self._reap()
        with self._lock:
            if not (self._closed and not self._queue):
                return False
            self._thread = None
            workers, self._workers = self._workers, []
            self._cond.notify_all()
        for _ in workers:
            self._io.put(_STOP)  # after the traces already handed over
        _LIVE.discard(self)
        return True

    def _lost(self, items: list[_Item], exc: BaseException) -> None:
        """A failure outside the per-run guards: the runs in hand fail (counted, logged), the rest go on."""
        failed = [item for item in items if not item.done]
        items.clear()
        for item in failed:
            self._fail(item.reg, "the trace writer", exc)
            self._finished(item, False)
        if not failed:
            for reg in [self._own, *list(self._regs)]:
                reg.count("errors")
            self._log_once("writer", "flowrl: the trace writer failed (%r); it goes on", exc)
        if self._queue:
            self._wake.set()  # what is still queued is not left waiting for the next run

    def _log_once(self, kind: str, message: str, exc: BaseException) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(message + " (logged once)", exc, exc_info=exc)

    def _hand_over(self, batch: list[tuple[ExecutionTrace, _Item]]) -> None:
        if not self._workers:
            self._write_batch(batch)
            return
        while True:  # blocks only this thread, and only while every I/O thread is busy
            try:
                self._io.put(batch, timeout=1.0)
                return
            except queue.Full:
                self._start_io()  # in case one died

    def _write_loop(self) -> None:
        while True:
            batch = self._io.get()
            if batch is _STOP:
                return
            try:
                self._write_batch(batch)
            except BaseException as exc:  # this thread goes on; the batch's unwritten runs fail
                self._lost([item for _trace, item in batch], exc)
            batch = None  # do not hold the last traces (nor their hooks) while idle

    def _write_batch(self, batch: list[tuple[ExecutionTrace, _Item]]) -> None:
        """One trace: `TraceStore.write` (its own fsync). A backlog: `write_many`, one filesystem sync for
        the lot (same all-or-nothing guarantee per file); if that fails, each trace on its own."""
        write_many = getattr(self.store, "write_many", None)
        if len(batch) > 1 and write_many is not None:
            try:
                write_many([trace for trace, _item in batch])
            except BaseException as exc:
                self._batch_failed(batch, exc)  # then retried one by one below
            else:
                for trace, item in batch:
                    self._written(trace, item.reg)
                    self._finished(item, self._save_outcomes(trace.trace_id, trace.outcomes, item.reg, masked=True))
                return
        for trace, item in batch:
            self._finished(item, self._write(trace, item.reg))

    def _batch_failed(self, batch: list[tuple[ExecutionTrace, _Item]], exc: BaseException) -> None:
        for reg in {id(item.reg): item.reg for _trace, item in batch}.values():
            reg.count("batch_write_errors")
        if not self._batch_failure_logged:
            self._batch_failure_logged = True
            log.warning(
                "flowrl: writing %d traces at once to %s failed (%s); writing them one at a time "
                "(logged once; counted in stats.batch_write_errors)",
                len(batch),
                self.store.root,
                exc,
            )

    def _finished(self, item: _Item, ok: bool) -> None:
        """A run is done with (once: a second call for it is ignored)."""
        with self._cond:
            if item.done:
                return
            item.done = True
            self._done += 1
            if not ok:
                item.reg.failed += 1
            self._cond.notify_all()

    def _build(self, record: Any, reg: Registration) -> ExecutionTrace | None:
        try:
            data = build_trace(record) if isinstance(record, RunRecord) else record.build()
            if reg.redactor is not None:
                data = redact_trace(reg.redactor, data)
            return load_trace(complete_trace(data), origin="live capture")
        except BaseException as exc:  # SystemExit from a mask included: this run fails, the writer goes on
            reg.count("build_errors")
            self._fail(reg, "building a trace", exc)
            return None
        finally:
            if reg.redactor is not None:
                rs = reg.redactor.stats
                edges = reg.premask.stats.masked if reg.premask is not None else 0
                with reg.lock:
                    reg.stats.mask_failures = rs.mask_failures
                    reg.stats.secrets_masked = rs.masked + edges

    def _write(self, trace: ExecutionTrace, reg: Registration) -> bool:
        try:
            self.store.write(trace)
        except BaseException as exc:
            reg.count("write_errors")
            self._fail(reg, f"writing a trace to {self.store.root}", exc)
            return False
        self._written(trace, reg)
        return self._save_outcomes(trace.trace_id, trace.outcomes, reg, masked=True)

    def _save_outcomes(
        self, trace_id: str, outcomes: list[HostOutcome], reg: Registration, *, masked: bool = False
    ) -> bool:
        """Append the host's outcomes of one run to the store's side records, masked like the trace (those
        said during the run were masked with it: `masked`)."""
        if not outcomes:
            return True
        try:
            if reg.redactor is not None and not masked:
                clean = redact_outcomes(reg.redactor, [o.model_dump(mode="json") for o in outcomes])
                outcomes = [HostOutcome.model_validate(o) for o in clean]
            self.store.record_outcomes(trace_id, outcomes)
        except BaseException as exc:
            reg.count("outcome_errors")
            self._fail(reg, f"recording an outcome of {trace_id} in {self.store.root}", exc)
            return False
        reg.count("outcomes", len(outcomes))
        return True

    def _written(self, trace: ExecutionTrace, reg: Registration) -> None:
        with reg.lock:
            reg.stats.written += 1
            reg.stats.tool_calls += len(trace.tool_calls)
            reg.stats.llm_calls += len(trace.llm_calls)
        if reg.on_written is not None:
            try:
                reg.on_written(trace)
            except BaseException as exc:  # SystemExit included: it is the callback's, not the writer's
                self._fail(reg, "the hook's on_trace callback", exc)

    def _fail(self, reg: Registration, what: str, exc: BaseException) -> None:
        reg.count("errors")
        if reg.on_error is not None:
            try:
                reg.on_error(what, exc)
                return
            except BaseException:  # pragma: no cover
                pass
        log.warning("flowrl: %s failed: %r", what, exc)

    # -- waiting and closing ----------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record queued before this call is written (every registration's).

        True when they all were and nothing failed since the previous flush; False on timeout or when
        a run could not be built or written (see `stats`). Blocks the calling thread: from async code
        use `await asyncio.to_thread(hook.flush)`.
        """
        return self._flush(timeout, None)

    def _flush(self, timeout: float | None, reg: Registration | None) -> bool:
        if self._pid != os.getpid():
            self._reinit_after_fork()
        regs = [reg] if reg is not None else [self._own, *list(self._regs)]
        for r in regs:
            r._before_flush(timeout)
        with self._lock:
            target = self._accepted
            need_thread = self._done < target and not self._writer_running()
        if need_thread:
            self._start()
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(_CHECK_WRITER_S if remaining is None else min(remaining, _CHECK_WRITER_S))
                if self._done < target and self._writer_lost():  # it died (or never started) while we waited
                    self._start()
                    if not self._writer_running():  # and none can be started: do not wait for nothing
                        return False
            clean = True
            for r in regs:
                clean = clean and r.failed == r.failed_reported
                r.failed_reported = r.failed
        return self._flush_store() and clean

    def _flush_store(self) -> bool:
        """Make what was written durable where the store buffers (`SegmentStore.flush`; a `TraceStore` has none
        to do). A failure is logged and counted, and the traces stay in the store's buffer for the next flush."""
        flush = getattr(self.store, "flush", None)
        if flush is None:
            return True
        try:
            flush()
        except Exception as exc:
            self._own.count("write_errors")
            self._log_once("store-flush", "flowrl: flushing the store failed (%s)", exc)
            return False
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Write what is queued (waiting up to `timeout`), then stop the writer thread once the queue is
        empty. Later submits are dropped (counted). `timeout=0` never blocks."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout == 0:  # do not wait (and do not start a thread: this may run inside the GC)
            self._own._before_flush(0)
            ok = self._done >= self._accepted
        else:
            ok = self.flush(timeout)
        with self._lock:
            self._closed = True
            thread, workers = self._thread, list(self._workers)
            if thread is None:
                _LIVE.discard(self)
        self._wake.set()
        if thread is not None and thread is not threading.current_thread() and timeout != 0:
            for t in [thread, *workers]:  # the writer sends each I/O thread its stop on its way out
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return ok

    @property
    def closed(self) -> bool:
        return self._closed


class _Item:
    """A queued run: the record, its registration, and whether it is done with (written or failed)."""

    __slots__ = ("done", "record", "reg")

    def __init__(self, record: Any, reg: Registration) -> None:
        self.record, self.reg, self.done = record, reg, False


class OutcomeRecord:
    """Outcomes the host said about a run after it was handed to the writer (`Hook.record_outcome`)."""

    __slots__ = ("outcomes", "trace_id")

    def __init__(self, trace_id: str, outcomes: list[HostOutcome]) -> None:
        self.trace_id, self.outcomes = trace_id, outcomes
