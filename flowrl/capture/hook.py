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
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from flowrl.capture import _patch, flowagent, generic
from flowrl.capture import clients as clients_table
from flowrl.capture import options as options_table
from flowrl.capture.adapter import Adapter, PatchSpec
from flowrl.capture.collector import (
    CaptureStats,
    OutcomeRecord,
    Registration,
    TraceCollector,
    as_store,
    attach,
    store_key,
)
from flowrl.capture.options import CaptureOptions
from flowrl.capture.recorder import RunRecord
from flowrl.errors import ConfigError
from flowrl.store.files import TRACE_ID, TraceStore
from flowrl.trace.outcomes import HostOutcome, make_outcome

log = logging.getLogger("flowrl.capture")

OPTIONS = frozenset(options_table.NAMES)  # what hook_into_agent accepts: CaptureOptions' fields
_WARN_FIRST = 3


class Hook:
    """A live capture on one agent. Use `flush()`, `unhook()`, `stats`, or `with hook: ...`.

    A thin registration on the process's collector for its store (`collector.attach`): the writer
    thread is shared with every other hook on that store; the stats, masking and metadata are its own."""

    def __init__(self, agent: Any, registration: Registration, options: CaptureOptions) -> None:
        self.registration = registration
        self.options = options  # what it was hooked with, checked (a re-hook must match them)
        self.adapter = options.adapter
        self.agent_name = options.agent_name
        self.metadata = dict(options.metadata)
        self.source = options.source
        self.max_events = options.max_events_per_run
        self.handlers: dict[tuple[str | None, str], Callable[..., Any]] = {}
        self.methods: list[str] = []
        self.llm_clients: frozenset[str] = frozenset()  # client libraries whose calls in its runs it records
        self._patches: list[tuple[type, str]] = []
        self._agent_id = id(agent)
        self._active = False
        self._fail_counts: dict[str, int] = {}
        self._lock = threading.RLock()  # reentrant: the garbage collector's callback may come in under it
        self._deferred: dict[int, tuple[RunRecord, Callable[[], Any], Any]] = {}
        registration.on_error = self._log_failure
        registration.on_written = options.on_trace
        registration.before_flush = self._release_deferred

    # -- public ---------------------------------------------------------------------------------
    @property
    def collector(self) -> TraceCollector:
        """The collector this hook shares with every other hook on its store."""
        return cast(TraceCollector, self.registration.collector)  # the registry made it (`collector.register`)

    @property
    def stats(self) -> CaptureStats:
        return self.registration.stats

    @property
    def store(self) -> TraceStore:
        return self.registration.store

    @property
    def active(self) -> bool:
        return self._active

    @property
    def queued(self) -> int:
        return self.registration.queued

    def flush(self, timeout: float | None = None) -> bool:
        """Block until the runs finished so far are written. True when all were written in time."""
        try:
            return self.registration.flush(timeout)
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("flush", exc)
            return False

    def unhook(self) -> None:
        """Stop capturing and put the agent's class back as it was (when no other hook still uses it);
        then write what is queued (up to `exit_timeout` seconds) and let go of the collector (the last
        hook on a store stops its threads). Idempotent."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        _patch.unregister(self._agent_id, self)
        self._release_patches()
        try:
            self.registration.close(self.registration.exit_timeout)
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("closing the writer", exc)

    def record_outcome(
        self,
        trace_id: str,
        outcome: HostOutcome | None = None,
        *,
        reference: Any = None,
        success: bool | None = None,
        rewards: Mapping[str, float] | None = None,
        feedback: str | None = None,
        source: str = "app",
    ) -> bool:
        """Say how a run went, any time after it (its id: `flowrl.current_run().trace_id`, or a stored trace's).
        Appended to the store's side records by the writer thread (masked like traces), so it survives
        re-scoring; no file I/O here. Never raises: a bad value is counted (`stats.outcome_errors`), logged, and
        False returned. `flush()` waits for it like a run."""
        if outcome is None:
            outcome = self.make_outcome(
                reference=reference, success=success, rewards=rewards, feedback=feedback, source=source
            )
            if outcome is None:
                return False
        if not isinstance(trace_id, str) or not TRACE_ID.match(trace_id):
            self._bad_outcome(ConfigError(f"trace id {trace_id!r}: not one of flowrl's"))
            return False
        try:
            return self.registration.submit(OutcomeRecord(trace_id, [outcome]))
        except Exception as exc:  # pragma: no cover - defensive
            self._bad_outcome(exc)
            return False

    def make_outcome(self, **fields: Any) -> HostOutcome | None:
        """A checked outcome, or None (counted and logged) when a value cannot be one."""
        try:
            return make_outcome(**fields)
        except Exception as exc:
            self._bad_outcome(exc)
            return None

    def _bad_outcome(self, exc: BaseException) -> None:
        try:
            self.registration.count("outcome_errors")
            self.registration.count("errors")
            if not isinstance(exc, ConfigError):
                self._log_failure("recording an outcome", exc)
                return
            n = self._fail_counts["outcome"] = self._fail_counts.get("outcome", 0) + 1
            if n <= _WARN_FIRST or n % 1000 == 0:  # the host's value: one line, no traceback
                log.warning("flowrl: an outcome was not recorded (%d so far): %s", n, exc)
        except Exception:  # pragma: no cover - logging itself failed
            pass

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
            self.registration.count("capture_errors")
            self.registration.count("errors")
            self._log_failure(where, exc)
        except Exception:  # pragma: no cover - logging itself failed
            pass

    def _log_failure(self, where: str, exc: BaseException) -> None:
        n = self._fail_counts[where] = self._fail_counts.get(where, 0) + 1
        if n <= _WARN_FIRST or n % 1000 == 0:
            log.warning(
                "flowrl capture: %s failed (%d so far); the agent is not affected: %r",
                where,
                n,
                exc,
                exc_info=exc if n == 1 else None,
            )

    def unattributed(self) -> None:
        self.registration.count("unattributed")

    def finish(self, rec: RunRecord) -> None:
        """Close a run and hand it to the writer. Never raises."""
        try:
            if rec.closed:
                return
            rec.close()
            self.registration.captured(rec)
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
    def _install(self, agent: Any, specs: list[PatchSpec]) -> None:
        try:
            for cls, attr, via, handler in ((p.owner, p.attr, p.via, p.handler) for p in specs):
                owner = _patch.owner_of(cls, attr)
                if owner is None:
                    raise ConfigError(
                        f"{cls.__name__} has no method {attr!r}: check run_methods/tool_methods/llm_methods"
                    )
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

    def _install_clients(self, clients: tuple[str, ...]) -> None:
        """Patch the LLM client libraries (`openai_client`, `litellm_client`; process-wide, reference-counted). A
        failure is counted and logged: the agent's own methods are still captured."""
        if not clients:
            return
        try:
            self.methods += clients_table.acquire(self, clients)
            self.llm_clients = frozenset(clients)
        except Exception as exc:
            self.fail("patching the LLM client library", exc)

    def _release_patches(self) -> None:
        if self.llm_clients:
            self.llm_clients = frozenset()
            try:
                clients_table.release(self)
            except Exception as exc:  # pragma: no cover - defensive: release does not raise
                self.fail("unpatching the LLM client library", exc)
        patches, self._patches = self._patches, []
        for owner, attr in patches:
            try:
                _patch.release(owner, attr)
            except Exception as exc:  # pragma: no cover - defensive
                self.fail(f"unpatching {owner.__name__}.{attr}", exc)

    def _agent_gone(self) -> None:
        """The agent was garbage-collected without unhook(): let go of the class and of the collector
        (what is queued is still written). Never blocks and takes no registry lock: this runs inside
        the garbage collector, possibly while the interpreter shuts down."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        self._release_patches()
        self.registration.abandon()


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


def hook_into_agent(agent: Any, store: TraceStore | str | os.PathLike[str] | None = None, **options: Any) -> Hook:
    """Start capturing every run of `agent` as one trace in `store` (default: `TraceStore.default()`).

    Options: the fields of `flowrl.capture.options.CaptureOptions`, declared there once with their defaults:
    `run_methods`, `tool_methods`, `llm_methods` (method names; defaults for a FlowAgent),
    `adapter` ("auto", "flowagent", "generic"), `mask` (callable str -> str, applied after the built-in
    secret patterns), `queue_size` (this hook's runs waiting for the writer, default 1024), `agent_name`,
    `metadata` (dict added to every trace), `redact` (default True), `max_chars` (longer strings keep
    head and tail), `max_events_per_run` (default 10000), `exit_timeout` (seconds to write at exit and
    on unhook, default 5), `io_threads` (threads doing the fsynced writes, default 8; 0 writes on the
    writer thread itself; hooks on one store share them, and the largest number asked for runs),
    `source` (the traces' `source`, default "live"; online training rollouts use "train"), `on_trace`
    (callable given each trace once it is written, on the writer thread; what it raises is caught,
    counted in `stats.errors` and logged, never raised into the agent), `llm_clients` ("auto", the
    default: the OpenAI SDK and LiteLLM, each when it is importable; ["openai"], ["litellm"]; [] for none: the
    client calls made inside the agent's runs are recorded as its LLM calls, with what the model saw as the
    trace's `messages`; LiteLLM is never imported by flowrl: patched now when the host has imported it, else
    as soon as the host imports it).

    Every hook on one store shares the process's one collector for it (one writer thread and its I/O
    threads). Hooking an agent that is already hooked returns its existing Hook when the store and the
    options given match the ones it was hooked with, and raises `ConfigError` naming the ones that
    differ otherwise (unhook it first to hook it with others).
    """
    options_table.check_names(options)
    if agent is None or isinstance(agent, type):
        raise ConfigError("hook_into_agent needs an agent instance, not None or a class")
    with _patch._LOCK:
        existing = _already_hooked(agent, store, options)
    if existing is not None:
        return existing
    given = options_table.capture_options(options)
    opts = replace(given, adapter=_adapter(agent, given.adapter), agent_name=_agent_name(agent, given.agent_name))
    if opts.adapter == "generic" and not opts.run_methods:
        raise ConfigError(
            f"{type(agent).__name__} is not a toolboxv2 FlowAgent: name its entry points, "
            "e.g. hook_into_agent(agent, run_methods=['a_run'], tool_methods=['call_tool'])"
        )
    try:  # outside _patch._LOCK: whoever holds that lock never waits for the collectors' registry
        registration = attach(store, **opts.writer())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"hook_into_agent: {exc}") from exc
    try:
        with _patch._LOCK:
            existing = _already_hooked(agent, store, options)  # by another thread, meanwhile
            if existing is None:
                hook = Hook(agent, registration, opts)
                specs = ADAPTERS[opts.adapter].plan(
                    agent,
                    hook,
                    run_methods=_listed(opts.run_methods),
                    tool_methods=_listed(opts.tool_methods),
                    llm_methods=_listed(opts.llm_methods),
                )
                hook._install(agent, specs)
                hook._install_clients(opts.clients)
    except BaseException:
        registration.close(0)
        raise
    if existing is not None:
        registration.close(0)
        return existing
    log.info("flowrl: capturing %s (%s) into %s", hook.agent_name, ", ".join(hook.methods), hook.store.root)
    return hook


def _listed(names: tuple[str, ...] | None) -> list[str] | None:
    return list(names) if names is not None else None


def _already_hooked(agent: Any, store: Any, options: dict[str, Any]) -> Hook | None:
    """The agent's active Hook when the store and options given match it; ConfigError when they do not."""
    existing = _patch.lookup(agent)
    if existing is None or not existing.active:
        return None
    differ = _differences(existing, agent, store, options)
    if differ:
        raise ConfigError(
            f"{type(agent).__name__} is already hooked (into {existing.store.root}) with other options: "
            f"{'; '.join(differ)}. Call hook.unhook() first to hook it with these, or call "
            "hook_into_agent with the same options (or none) to get its Hook"
        )
    log.debug("flowrl: %r is already hooked; returning its Hook", type(agent).__name__)
    return existing


# name -> the adapter (imported when first used); the ones that detect their agents are asked in this order,
# and an agent none of them knows gets the generic adapter (which needs run_methods)
ADAPTERS: dict[str, Adapter] = {"flowagent": flowagent.ADAPTER, "generic": generic.ADAPTER}  # one line an adapter


def _adapter(agent: Any, adapter: Any) -> str:
    if adapter == "auto":
        adapter = next((name for name, known in ADAPTERS.items() if known.detects(agent)), "generic")
    if adapter not in ADAPTERS:
        raise ConfigError(f"adapter must be 'auto' or one of {', '.join(repr(n) for n in ADAPTERS)}, not {adapter!r}")
    return adapter


def _differences(hook: Hook, agent: Any, store: Any, options: dict[str, Any]) -> list[str]:
    """What a second `hook_into_agent` on a hooked agent asks for that its Hook does not do. Only the
    store and the options given are compared (`store=None` and a missing option ask for nothing)."""
    out = []
    if store is not None:
        try:
            wanted = store_key(as_store(store))
        except TypeError as exc:
            raise ConfigError(f"hook_into_agent: {exc}") from exc
        if wanted != store_key(hook.store):
            out.append(f"store {wanted} (hooked into {hook.store.root})")
    for key, given in sorted(options.items()):
        if key == "adapter":
            value = _adapter(agent, given)
        elif key == "agent_name":
            value = _agent_name(agent, given)
        else:
            value = options_table.checked(key, given)
        have = getattr(hook.options, key)
        try:
            same = have is value or bool(have == value)
        except Exception:  # a value that cannot be compared (e.g. an array in metadata)
            same = False
        if not same:
            out.append(key if key in ("mask", "metadata", "on_trace") else f"{key}={value!r} (hooked with {have!r})")
    return out
