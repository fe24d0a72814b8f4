"""`hook_into_agent` and the `Hook` handle it returns.

    hook = hook_into_agent(agent)                 # a toolboxv2 FlowAgent: everything is automatic
    hook = hook_into_agent(agent, run_methods=["a_run"], tool_methods=["call_tool"])  # any agent
    with hook_into_agent(agent, store="traces/") as hook:
        await agent.a_run("...")
    hook.flush(); hook.stats.written

Guarantees: the host's return values and exceptions pass through unchanged; a failure inside flowrl
is counted in `Hook.stats` and logged, never raised into the host (wrong options given to
`hook_into_agent` itself raise `ConfigError`); the host's loop does no file I/O.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from flowrl.capture import _patch
from flowrl.capture.collector import (
    DEFAULT_EXIT_TIMEOUT,
    DEFAULT_IO_THREADS,
    DEFAULT_QUEUE_SIZE,
    CaptureStats,
    TraceCollector,
)
from flowrl.capture.recorder import RunRecord
from flowrl.errors import ConfigError
from flowrl.store import TraceStore

log = logging.getLogger("flowrl.capture")

DEFAULT_MAX_EVENTS = 10_000
OPTIONS = frozenset({
    "run_methods", "tool_methods", "llm_methods", "mask", "queue_size", "agent_name", "adapter", "redact",
    "max_chars", "max_events_per_run", "exit_timeout", "metadata", "io_threads",
})
_WARN_FIRST = 3


class Hook:
    """A live capture on one agent. Use `flush()`, `unhook()`, `stats`, or `with hook: ...`."""

    def __init__(self, agent: Any, collector: TraceCollector, *, adapter: str, agent_name: str | None,
                 metadata: dict[str, Any] | None = None, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.collector = collector
        self.adapter = adapter
        self.agent_name = agent_name
        self.metadata = dict(metadata or {})
        self.max_events = max_events
        self.handlers: dict[tuple[str | None, str], Callable[..., Any]] = {}
        self.methods: list[str] = []
        self._patches: list[tuple[type, str]] = []
        self._agent_id = id(agent)
        self._active = False
        self._fail_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.token_mark: tuple[float, ...] | None = None  # adapters: agent token counters last attributed
        self._deferred: dict[int, tuple[RunRecord, Callable[[], Any], Any]] = {}
        collector.on_error = self._log_failure
        collector.before_flush = self._release_deferred

    # -- public ---------------------------------------------------------------------------------
    @property
    def stats(self) -> CaptureStats:
        return self.collector.stats

    @property
    def store(self) -> TraceStore:
        return self.collector.store

    @property
    def active(self) -> bool:
        return self._active

    @property
    def queued(self) -> int:
        return self.collector.queued

    def flush(self, timeout: float | None = None) -> bool:
        """Block until the runs finished so far are written. True when all were written in time."""
        try:
            return self.collector.flush(timeout)
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("flush", exc)
            return False

    def unhook(self) -> None:
        """Stop capturing and put the agent's class back as it was (when no other hook still uses it);
        then write what is queued (up to `exit_timeout` seconds) and stop the writer thread. Idempotent."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        _patch.unregister(self._agent_id, self)
        self._release_patches()
        try:
            self.collector.close(self.collector.exit_timeout)
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("closing the writer", exc)

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.unhook()

    def __repr__(self) -> str:
        state = "active" if self._active else "unhooked"
        return f"<flowrl Hook {self.adapter} {self.agent_name!r} {state} {self.stats.as_dict()}>"

    # -- used by adapters -------------------------------------------------------------------------
    def fail(self, where: str, exc: BaseException) -> None:
        """Count and log a failure inside flowrl. Never raises."""
        try:
            self.collector.count("capture_errors")
            self.collector.count("errors")
            self._log_failure(where, exc)
        except Exception:  # pragma: no cover - logging itself failed
            pass

    def _log_failure(self, where: str, exc: BaseException) -> None:
        n = self._fail_counts[where] = self._fail_counts.get(where, 0) + 1
        if n <= _WARN_FIRST or n % 1000 == 0:
            log.warning("flowrl capture: %s failed (%d so far); the agent is not affected: %r", where, n, exc,
                        exc_info=exc if n == 1 else None)

    def unattributed(self) -> None:
        self.collector.count("unattributed")

    def finish(self, rec: RunRecord) -> None:
        """Close a run and hand it to the writer. Never raises."""
        try:
            if rec.closed:
                return
            rec.close()
            if rec.overflow:
                self.collector.count("events_over_limit", rec.overflow)
            self.collector.count("captured")
            self.collector.submit(rec)
        except Exception as exc:
            self.fail("finishing a run", exc)

    def defer(self, rec: RunRecord, task: Any, refresh: Callable[[], Any]) -> None:
        """Finish `rec` when the host's `task` is done (FlowAgent commits a run's final status in a
        background task after `a_run` returned). `refresh()` then reads the final status into `rec`.
        `flush()`, `unhook()` and process exit finish what is still waiting, as it is."""
        key = id(rec)
        try:
            loop = task.get_loop()
        except Exception:
            loop = None
        with self._lock:
            self._deferred[key] = (rec, refresh, loop)
        try:
            task.add_done_callback(lambda _task: self._finish_deferred(key, settled=True))
        except Exception as exc:
            self.fail("waiting for the run's commit", exc)
            self._finish_deferred(key, settled=False)

    def _finish_deferred(self, key: int, settled: bool) -> None:
        with self._lock:
            entry = self._deferred.pop(key, None)
        if entry is None:
            return
        rec, refresh, _loop = entry
        try:
            refresh()
            if not settled:
                rec.meta["commit_pending"] = True
        except Exception as exc:
            self.fail("reading the run's final status", exc)
        self.finish(rec)

    def _release_deferred(self, timeout: float | None) -> None:
        """Before a flush: give pending commits a moment (only when their loop runs in another thread:
        called on the loop itself, waiting would block them), then finish every run still waiting."""
        if not self._deferred:
            return
        loops = [entry[2] for entry in list(self._deferred.values())]
        if not _on_event_loop() and any(loop is not None and loop.is_running() for loop in loops):
            deadline = time.monotonic() + min(2.0, timeout if timeout is not None else 2.0)
            while self._deferred and time.monotonic() < deadline:
                time.sleep(0.005)
        for key in list(self._deferred):
            self._finish_deferred(key, settled=False)

    # -- installing ---------------------------------------------------------------------------------
    def _install(self, agent: Any, specs: list[tuple[type, str, str | None, Callable[..., Any]]]) -> None:
        try:
            for cls, attr, via, handler in specs:
                owner = _patch.owner_of(cls, attr)
                if owner is None:
                    raise ConfigError(f"{cls.__name__} has no method {attr!r}: check run_methods/tool_methods/llm_methods")
                try:
                    _patch.acquire(owner, attr, via)
                except TypeError as exc:
                    raise ConfigError(f"cannot hook {owner.__name__}.{attr}: {exc}") from exc
                self._patches.append((owner, attr))
                self.handlers[(via, attr)] = handler
                self.methods.append(f"{owner.__name__}.{attr}")
        except BaseException:
            self._release_patches()
            raise
        self._active = True
        _patch.register(agent, self, self._agent_gone)

    def _release_patches(self) -> None:
        patches, self._patches = self._patches, []
        for owner, attr in patches:
            try:
                _patch.release(owner, attr)
            except Exception as exc:  # pragma: no cover - defensive
                self.fail(f"unpatching {owner.__name__}.{attr}", exc)

    def _agent_gone(self) -> None:
        """The agent was garbage-collected without unhook(): let go of the class and stop the writer
        once it has written what is queued. Never blocks: this runs inside the garbage collector,
        possibly while the interpreter shuts down."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        self._release_patches()
        self.collector.close(timeout=0)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _agent_name(agent: Any, given: str | None) -> str:
    if given:
        return str(given)
    amd = getattr(agent, "amd", None)
    name = getattr(amd, "name", None) if amd is not None else None
    if not name:
        name = getattr(agent, "name", None)
    return str(name) if isinstance(name, str) and name else type(agent).__name__


def _names(value: Any, option: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    names = list(value)
    if not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ConfigError(f"{option} must be a list of method names, got {value!r}")
    return names


def hook_into_agent(agent: Any, store: TraceStore | str | os.PathLike[str] | None = None, **options: Any) -> Hook:
    """Start capturing every run of `agent` as one trace in `store` (default: `TraceStore.default()`).

    Options: `run_methods`, `tool_methods`, `llm_methods` (method names; defaults for a FlowAgent),
    `adapter` ("auto", "flowagent", "generic"), `mask` (callable str -> str, applied after the built-in
    secret patterns), `queue_size` (runs waiting for the writer, default 1024), `agent_name`,
    `metadata` (dict added to every trace), `redact` (default True), `max_chars` (longer strings keep
    head and tail), `max_events_per_run` (default 10000), `exit_timeout` (seconds to write at exit and
    on unhook, default 5), `io_threads` (threads doing the fsynced writes, default 8; 0 writes on the
    writer thread itself).

    Hooking an agent that is already hooked returns its existing Hook (the new options are ignored).
    """
    from flowrl.capture import flowagent, generic

    unknown = set(options) - OPTIONS
    if unknown:
        raise ConfigError(f"unknown option(s) for hook_into_agent: {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(OPTIONS))})")
    if agent is None or isinstance(agent, type):
        raise ConfigError("hook_into_agent needs an agent instance, not None or a class")
    with _patch._LOCK:
        existing = _patch.lookup(agent)
        if existing is not None and existing.active:
            log.debug("flowrl: %r is already hooked; returning its Hook", type(agent).__name__)
            return existing
        adapter = options.get("adapter", "auto")
        if adapter == "auto":
            adapter = "flowagent" if flowagent.is_flowagent(agent) else "generic"
        if adapter not in ("flowagent", "generic"):
            raise ConfigError(f"adapter must be 'auto', 'flowagent' or 'generic', not {adapter!r}")
        run_methods = _names(options.get("run_methods"), "run_methods")
        tool_methods = _names(options.get("tool_methods"), "tool_methods")
        llm_methods = _names(options.get("llm_methods"), "llm_methods")
        if adapter == "generic" and not run_methods:
            raise ConfigError(f"{type(agent).__name__} is not a toolboxv2 FlowAgent: name its entry points, "
                              "e.g. hook_into_agent(agent, run_methods=['a_run'], tool_methods=['call_tool'])")
        max_events = options.get("max_events_per_run", DEFAULT_MAX_EVENTS)
        if not isinstance(max_events, int) or max_events < 0:
            raise ConfigError(f"max_events_per_run must be a non-negative integer, not {max_events!r}")
        mask = options.get("mask")
        if mask is not None and not callable(mask):
            raise ConfigError("mask must be a callable taking and returning a str")
        try:
            collector = TraceCollector(
                store, mask=mask, queue_size=options.get("queue_size", DEFAULT_QUEUE_SIZE),
                redact=bool(options.get("redact", True)), max_chars=options.get("max_chars", 65536),
                exit_timeout=float(options.get("exit_timeout", DEFAULT_EXIT_TIMEOUT)),
                io_threads=options.get("io_threads", DEFAULT_IO_THREADS))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"hook_into_agent: {exc}") from exc
        hook = Hook(agent, collector, adapter=adapter, agent_name=_agent_name(agent, options.get("agent_name")),
                    metadata=options.get("metadata"), max_events=max_events)
        module = flowagent if adapter == "flowagent" else generic
        try:
            specs = module.plan(agent, hook, run_methods=run_methods, tool_methods=tool_methods,
                                llm_methods=llm_methods)
            hook._install(agent, specs)
        except BaseException:
            collector.close(0)
            raise
    log.info("flowrl: capturing %s (%s) into %s", hook.agent_name, ", ".join(hook.methods), collector.store.root)
    return hook
