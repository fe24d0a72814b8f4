"""LLM client calls made outside any captured run, grouped into runs by conversation prefix.

    capture = capture_llm_calls(store="traces/")     # patches the OpenAI SDK (and LiteLLM) for this process
    client.chat.completions.create(model=M, messages=messages)   # no agent, no run method: still a trace
    capture.flush(); capture.unhook()

A call made while no captured run is current (`recorder.current_frame()` is None) is given to the process's
one `CallCapture`, which assigns it to a conversation: the call continues an open conversation when its
request messages start with that conversation's last request messages plus that call's reply message (each
message compared in a canonical form, `_canonical`: role, content, tool calls, the call it answers; a last
call that failed or gave no reply is continued by a request that starts with its request); otherwise it
starts a new conversation. Each
conversation is one `RunRecord`, finished and handed to the writer when it has had no call for `idle_s`
seconds (checked on each new call, by a timer thread, and at `flush()`, `unhook()` and process exit, which
finish every open one), or when `max_open` conversations are open and a new one starts (the least recently
used is finished). Calls inside a hooked agent's runs never come here: their path is unchanged.

On the host's side per grouped call: the request messages put in canonical form and hashed once (a rolling
blake2b over the messages, so every prefix's digest comes from one pass), compared with at most `max_open`
digests; nothing is serialised for the trace and nothing is written there. A failure is counted
(`capture_errors`), logged, and the call goes on unrecorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flowrl.capture import client_patch, client_read
from flowrl.capture.client_read import RESPONSES
from flowrl.capture.collector import (
    attach,
)
from flowrl.capture.events import LLMEvent
from flowrl.capture.hook import Hook
from flowrl.capture.options import CaptureOptions, capture_options
from flowrl.capture.recorder import RunRecord, current_llm
from flowrl.errors import ConfigError
from flowrl.store.files import TraceStore
from flowrl.trace.transcript import content_text, field_of, responses_messages, tool_call_parts

GROUPED = "conversation_prefix"  # metadata.grouped of a grouped run
ADAPTER = "llm_client"
DEFAULT_IDLE_S = 30.0
DEFAULT_MAX_OPEN = 64

_ACTIVE_LOCK = threading.Lock()
_ACTIVE: list[CallCapture] = []  # the process's one active CallCapture, or none


def _digest_state() -> Any:
    return hashlib.blake2b(digest_size=16)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr, separators=(",", ":"))


def _canonical(message: Any) -> Any:
    """What a message is compared by: its role, content, tool calls (id, name, arguments as text) and the
    call a tool message answers. A dict and the SDK's own message object with the same turn compare equal,
    and so do a missing and an empty content."""
    content = field_of(message, "content")
    calls = field_of(message, "tool_calls") or ()
    parts = []
    for call in calls if isinstance(calls, (list, tuple)) else ():
        name, args, call_id = tool_call_parts(call)
        parts.append([call_id, name, args if isinstance(args, str) else _json(args)])
    return [
        field_of(message, "role"),
        "" if content is None else content if isinstance(content, str) else _json(content),
        parts,
        field_of(message, "tool_call_id"),
    ]


def _feed(state: Any, message: Any) -> None:
    """Add one message (`_canonical`) to a rolling digest."""
    state.update(_json(message).encode("utf-8", "surrogatepass"))
    state.update(b"\x1e")


def _request(api: str, kwargs: dict[str, Any]) -> list[Any] | None:
    """A call's request as chat messages, without consuming anything the SDK would (a generator: None)."""
    if api == RESPONSES:
        items = kwargs.get("input")
        if items is not None and not isinstance(items, (list, tuple, str)):
            return None
        return responses_messages(kwargs.get("instructions"), items)
    messages = kwargs.get("messages")
    return list(messages) if isinstance(messages, (list, tuple)) else None


class _Conversation:
    __slots__ = ("rec", "last", "state", "n", "expect", "need", "seen")

    def __init__(self, rec: RunRecord) -> None:
        self.rec = rec
        self.last: LLMEvent | None = None  # the last call's event
        self.state: Any = None  # the rolling digest after the last call's request messages
        self.n = 0  # how many messages that request held
        self.expect: bytes | None = None  # digest a continuing request's first `need` messages must have
        self.need = 0
        self.seen = 0.0  # the clock when the conversation was last used

    def settle(self) -> bool:
        """Work out what a continuing request must start with, once the last call is over. False while
        it is still in flight (then nothing continues it yet)."""
        if self.expect is not None:
            return True
        ev = self.last
        if ev is None or self.state is None or ev.duration is None:
            return False
        reply = client_read.read_call(ev)[0] if not ev.error else None
        state = self.state.copy()
        if reply is None:  # failed, or no reply: a retry repeats the request
            self.need = self.n
        else:
            _feed(state, _canonical(reply))
            self.need = self.n + 1
        self.expect = state.digest()
        return True

    def ended(self) -> float | None:
        """perf_counter when the last call ended (None: still in flight)."""
        ev = self.last
        if ev is None:
            return self.rec.perf0
        return None if ev.duration is None else ev.started + ev.duration


class CallCapture(Hook):
    """The handle `capture_llm_calls` returns: `flush()`, `unhook()`, `stats`, `open` (conversations not
    finished yet), `expire()` (finish the idle ones now), `with capture: ...`. A `Hook` with no agent."""

    def __init__(
        self, registration: Any, options: CaptureOptions, *, idle_s: float, max_open: int, clock: Callable[[], float]
    ) -> None:
        super().__init__(None, registration, options)
        self.idle_s = idle_s
        self.max_open = max_open
        self.clock = clock
        self._convs: dict[int, _Conversation] = {}  # id(rec) -> conversation, least recently used first
        self._glock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    # -- public ---------------------------------------------------------------------------------
    @property
    def open(self) -> int:
        """Conversations not finished yet."""
        return len(self._convs)

    def expire(self) -> int:
        """Finish the conversations idle for `idle_s` seconds or more; returns how many. Never raises."""
        try:
            with self._glock:
                return self._expire(self.clock())
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("finishing idle conversations", exc)
            return 0

    def unhook(self) -> None:
        """Stop grouping calls, put the SDK back (when no hook still uses it), finish every open
        conversation and write what is queued (up to `exit_timeout` seconds). Idempotent."""
        with self._lock:
            if not self._active:
                return
            self._active = False
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            client_patch.set_grouper(_ACTIVE[0] if _ACTIVE else None)
        self._stop.set()
        self._release_patches()
        self._finish_all()
        try:
            self.registration.close(self.registration.exit_timeout)
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("closing the writer", exc)

    def unattributed(self) -> None:
        """A call outside any run is this handle's to group: not counted as unattributed here."""

    def __repr__(self) -> str:
        state = "active" if self._active else "unhooked"
        return f"<flowrl CallCapture {self.agent_name!r} {state} open={self.open} {self.stats.as_dict()}>"

    # -- the host's side ----------------------------------------------------------------------
    def begin(
        self, api: str, kwargs: dict[str, Any], build: Callable[[RunRecord], LLMEvent | None]
    ) -> tuple[RunRecord, LLMEvent] | None:
        """The run and event of a call made outside any captured run (`build(rec)` makes the event in run
        `rec`), or None: not recorded. Never raises."""
        if not self._active:
            return None
        try:
            open_llm = current_llm()  # an SDK call a grouped LiteLLM call makes underneath: attached to it
            if open_llm is not None and open_llm[0] is not None and open_llm[0].hook is self:
                if open_llm[1].duration is None:
                    rec = open_llm[0]
                    ev = build(rec)
                    return None if ev is None else (rec, ev)
            request = _request(api, kwargs)
            canon = [] if request is None else [_canonical(m) for m in request]
            state = _digest_state()
            digests = [state.digest()]
            for message in canon:
                _feed(state, message)
                digests.append(state.digest())
            with self._glock:
                now = self.clock()
                self._expire(now)
                conv = self._match(digests) if request is not None else None
                fresh = conv is None
                if conv is None:
                    rec = RunRecord(self, ADAPTER, api, _first_user(canon), None)
                    rec.meta["grouped"] = GROUPED
                    conv = _Conversation(rec)
                ev = build(conv.rec)
                if ev is None:
                    if not fresh:
                        self._convs[id(conv.rec)] = self._convs.pop(id(conv.rec))
                    return None
                conv.last, conv.state, conv.n = ev, (state if request is not None else None), len(canon)
                conv.expect, conv.need, conv.seen = None, 0, now
                self._convs.pop(id(conv.rec), None)
                if fresh:
                    while len(self._convs) >= self.max_open:
                        self._end(next(iter(self._convs.values())))
                self._convs[id(conv.rec)] = conv  # most recently used last
            return conv.rec, ev
        except Exception as exc:
            self.fail(f"{api}: grouping a call", exc)
            return None

    def _match(self, digests: list[bytes]) -> _Conversation | None:
        """The open conversation the request continues (the longest one matched; the most recent on a tie)."""
        best: _Conversation | None = None
        m = len(digests) - 1
        for conv in self._convs.values():
            if not conv.settle() or conv.need > m or conv.need == 0:
                continue
            if digests[conv.need] == conv.expect and (best is None or conv.need >= best.need):
                best = conv
        return best

    # -- finishing ----------------------------------------------------------------------------
    def _expire(self, now: float) -> int:
        done = 0
        for conv in list(self._convs.values()):
            if conv.last is not None and conv.last.duration is None:
                continue  # a call still in flight (a stream being read)
            if now - conv.seen >= self.idle_s:
                self._end(conv)
                done += 1
        return done

    def _finish_all(self) -> None:
        try:
            with self._glock:
                for conv in list(self._convs.values()):
                    self._end(conv)
        except Exception as exc:  # pragma: no cover - defensive
            self.fail("finishing open conversations", exc)

    def _end(self, conv: _Conversation) -> None:
        """Finish a conversation's run and hand it to the writer (called under `_glock`). Never raises."""
        self._convs.pop(id(conv.rec), None)
        rec = conv.rec
        try:
            if rec.closed:
                return
            if conv.last is not None and not conv.last.error:
                reply = client_read.read_call(conv.last)[0]
                content = None if reply is None else reply.get("content")
                rec.result = None if content is None else content_text(content)
            elif conv.last is not None:
                rec.exc = conv.last.error
            rec.close()
            end = conv.ended()
            if end is not None:
                rec.duration = max(0.0, end - rec.perf0)  # the idle wait is not part of the run
            self.registration.captured(rec)
        except Exception as exc:
            self.fail("finishing a conversation", exc)

    def _release_deferred(self, timeout: float | None) -> None:
        """Before a flush (and at process exit): finish every open conversation."""
        self._finish_all()

    def _tick(self) -> None:
        interval = min(max(self.idle_s / 2.0, 0.05), 5.0)
        while not self._stop.wait(interval):
            if self._convs:
                self.expire()

    def _start_timer(self) -> None:
        self._timer = threading.Thread(target=self._tick, name="flowrl-llm-call-grouping", daemon=True)
        self._timer.start()


def _first_user(canon: list[Any]) -> str | None:
    """The first user message's content (`_canonical` form: [role, content, calls, id])."""
    for message in canon:
        if message[0] == "user":
            return str(message[1])
    return None


# capture_llm_calls' own options, and those it shares with hook_into_agent (checked as CaptureOptions)
OWN_OPTIONS = ("idle_s", "max_open", "clock")
SHARED_OPTIONS = (
    "llm_clients",
    "agent_name",
    "metadata",
    "mask",
    "redact",
    "max_chars",
    "max_events_per_run",
    "queue_size",
    "exit_timeout",
    "io_threads",
    "source",
    "on_trace",
)
OPTIONS = frozenset((*OWN_OPTIONS, *SHARED_OPTIONS))


def capture_llm_calls(store: TraceStore | str | os.PathLike[str] | None = None, **options: Any) -> CallCapture:
    """Record the LLM client calls made outside any hooked agent's run, each conversation as one trace.

    Options: `idle_s` (a conversation with no call for this long is finished, default 30), `max_open` (open
    conversations kept, default 64: a new one past that finishes the least recently used), `llm_clients`
    ("auto", the default, or ["openai"], ["litellm"]), `agent_name` (the traces' `agent_name`, default
    "llm_client"), `metadata`, `mask`, `redact`, `max_chars`, `max_events_per_run`, `queue_size`,
    `exit_timeout`, `io_threads`, `source`, `on_trace` (as for `hook_into_agent`), `clock` (a callable
    returning seconds, default `time.monotonic`: what `idle_s` is measured with).

    One per process: a second call while one is active raises `ConfigError` (unhook it first). Calls
    inside a hooked agent's runs are recorded into those runs, never here.
    """
    unknown = set(options) - OPTIONS
    if unknown:
        raise ConfigError(
            f"unknown option(s) for capture_llm_calls: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(OPTIONS))})"
        )
    idle_s = options.get("idle_s", DEFAULT_IDLE_S)
    if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) or not idle_s > 0:
        raise ConfigError(f"idle_s must be a positive number of seconds, not {idle_s!r}")
    max_open = options.get("max_open", DEFAULT_MAX_OPEN)
    if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
        raise ConfigError(f"max_open must be a positive integer, not {max_open!r}")
    clock = options.get("clock") or time.monotonic
    if not callable(clock):
        raise ConfigError("clock must be a callable returning seconds")
    shared = capture_options({k: v for k, v in options.items() if k in SHARED_OPTIONS})
    opts = replace(shared, adapter=ADAPTER, agent_name=str(shared.agent_name or ADAPTER))
    clients = opts.clients
    if not clients:
        raise ConfigError("capture_llm_calls: no LLM client library to capture (install openai or litellm)")
    with _ACTIVE_LOCK:
        if _ACTIVE:
            raise ConfigError("capture_llm_calls is already active in this process: unhook() it first")
    try:
        registration = attach(store, **opts.writer())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"capture_llm_calls: {exc}") from exc
    capture = CallCapture(registration, opts, idle_s=float(idle_s), max_open=max_open, clock=clock)
    with _ACTIVE_LOCK:
        if _ACTIVE:  # another thread, meanwhile
            registration.close(0)
            raise ConfigError("capture_llm_calls is already active in this process: unhook() it first")
        capture._active = True
        capture._install_clients(clients)
        if not capture.llm_clients:
            capture._active = False
            registration.close(0)
            raise ConfigError("capture_llm_calls: the LLM client library could not be patched (see the log)")
        capture.methods.append(f"grouping by {GROUPED}")
        _ACTIVE.append(capture)
        client_patch.set_grouper(capture)
    capture._start_timer()
    return capture


__all__ = ["GROUPED", "CallCapture", "capture_llm_calls"]
