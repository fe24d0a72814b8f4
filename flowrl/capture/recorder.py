"""Per-run recording state, carried in one context variable.

The hot path only appends small event records (`events.ToolEvent`, `events.LLMEvent`) to the current
`RunRecord`: no redaction, no serialisation, no I/O. The collector's writer thread turns a finished record
into a trace (`assemble.py`).

The context variable holds a `Frame`, `(run, event)`; adapters set it with `enter_frame` and reset it with
`leave_frame` (the variable itself stays private to this module):
- `run`: the `RunRecord` the current code belongs to (asyncio tasks copy it when they are created,
  so parallel tool calls and concurrent sessions each see their own run);
- `event`: the tool event in progress (a nested `arun_function` attaches to it instead of making a
  second record of the same call).

A token from `enter_frame` is always reset in the same coroutine frame, and never held across a
`yield`: stream relays set and reset it around each step of the wrapped generator.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import AsyncGenerator, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import wrapt

from flowrl.capture.events import ErrorText, HookPort, LLMEvent
from flowrl.trace.schema import new_trace_id

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.events import Event, ToolEvent

Frame = tuple["RunRecord", "ToolEvent | None"]
_FRAME: ContextVar[Frame | None] = ContextVar("flowrl_capture_frame", default=None)
enter_frame = _FRAME.set  # -> a token for leave_frame; always reset in the same coroutine frame
leave_frame = _FRAME.reset
current_frame = _FRAME.get

# The hooked LLM method in progress, as (its run, its event): an LLM client call made inside it (the OpenAI SDK
# patched by `openai_client.py`) attaches to that event instead of being a second LLM call. Set by
# `adapter.guarded_call` around a plain LLM method and by `timed` around an awaited one.
OpenLLM = tuple["RunRecord | None", LLMEvent]
_LLM: ContextVar[OpenLLM | None] = ContextVar("flowrl_capture_llm", default=None)
enter_llm = _LLM.set
leave_llm = _LLM.reset
current_llm = _LLM.get

perf_counter = time.perf_counter
_OUTCOMES_LOCK = threading.Lock()  # between the host adding an outcome and the writer taking them (rare)


class RunRecord:
    """What one captured run did, in plain Python values. Built on the host's loop, read by the writer."""

    __slots__ = (
        "hook",
        "adapter",
        "method",
        "query",
        "session_id",
        "wall0",
        "perf0",
        "events",
        "closed",
        "duration",
        "result",
        "exc",
        "status",
        "run_id",
        "messages",
        "chunks",
        "meta",
        "max_events",
        "overflow",
        "pre",
        "trace_id",
        "outcomes",
    )

    def __init__(self, hook: HookPort, adapter: str, method: str, query: Any, session_id: Any) -> None:
        self.hook = hook
        self.adapter = adapter
        self.method = method
        self.query = query
        self.session_id = session_id
        self.wall0 = time.time()
        self.perf0 = perf_counter()
        self.events: list[Event] = []
        self.closed = False
        self.duration: float | None = None
        self.result: Any = None
        self.exc: str | ErrorText | None = None
        self.status: str | None = None
        self.run_id: str | None = None
        self.messages: list[dict[str, Any]] | None = None
        self.chunks: list[tuple[float, dict[str, Any]]] = []  # (perf_counter, chunk) of a_stream
        self.meta: dict[str, Any] = {}
        self.max_events = hook.max_events
        self.overflow = 0
        self.pre: object = None  # the adapter's own state taken before the run (FlowAgent: the resumed context)
        self.trace_id = new_trace_id()  # known from the start: `flowrl.current_run()` hands it to the host
        self.outcomes: list[Any] | None = []  # the host's, said during the run; None once the writer took them

    def add(self, event: Event) -> bool:
        """Append an event unless the run is finished or over its event budget."""
        if self.closed:
            return False
        if len(self.events) >= self.max_events:
            self.overflow += 1
            return False
        self.events.append(event)
        return True

    def close(self) -> None:
        self.duration = perf_counter() - self.perf0
        self.closed = True

    def add_outcome(self, outcome: Any) -> bool:
        """Keep an outcome the host said during the run, to be written with it. False once the writer has
        taken the run's outcomes (the caller then records it on its own)."""
        with _OUTCOMES_LOCK:
            if self.outcomes is None:
                return False
            self.outcomes.append(outcome)
            return True

    def take_outcomes(self) -> list[Any]:
        """The outcomes said during the run (the writer's, once: later ones are recorded on their own)."""
        with _OUTCOMES_LOCK:
            outcomes, self.outcomes = self.outcomes or [], None
        return outcomes


def frame_of(hook: HookPort) -> Frame | None:
    """The current frame when it belongs to a run of this hook, else None. A call with no run around it
    at all is counted as unattributed (it is not recorded)."""
    frame = _FRAME.get()
    if frame is None:
        hook.unattributed()
        return None
    return frame if frame[0].hook is hook else None


def inside_run_of(hook: HookPort) -> bool:
    """True inside an open run of this hook: a run method called there (`run()` calling `a_run()`,
    `a_stream` calling `a_run`, a tool that runs the agent again) is part of that run."""
    frame = _FRAME.get()
    return frame is not None and frame[0].hook is hook and not frame[0].closed


# -- values kept as they came, for the writer to read -------------------------------------------

HOST_JOIN_CHARS = 4096  # an exception message longer than this is not joined to its type name on the host


def describe_exc(exc: BaseException) -> str | ErrorText:
    """`Type: message` of an exception, for the trace. O(1) on the host whatever the message: a long one
    (or one `str()` cannot give) is left to the writer. Never raises."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception as err:  # the writer says what it was: its lone argument, else the failure
        args = getattr(exc, "args", ())
        if isinstance(args, tuple) and len(args) == 1:
            return ErrorText(name, args[0])
        return f"{name}: <unserialisable {name}: str() raised {type(err).__name__}>"
    if not text:
        return name
    if len(text) > HOST_JOIN_CHARS:
        return ErrorText(name, text)
    return f"{name}: {text}"


async def timed(
    hook: HookPort,
    frame: Frame | None,
    ev: Event,
    coro: Any,
    keep: bool = True,
    post: Callable[[Any], Any] | None = None,
) -> Any:
    """Await the host's coroutine, timing it into `ev` (inside `frame` when given: only calls that
    others nest into need one) and keeping its return value (`ev.returned`) unless `keep` is False. The
    host's result and exceptions pass through unchanged; `post(result)` may return a replacement (a stream
    wrapper); its failure is counted and the original result returned."""
    token = None if frame is None else _FRAME.set(frame)
    ltoken = None
    if ev.__class__ is LLMEvent:  # an LLM method: client calls made while it runs attach to it
        run = _FRAME.get()
        ltoken = _LLM.set((None if run is None else run[0], ev))
    try:
        out = await coro
    except BaseException as exc:
        note_exc(hook, ev, exc)
        raise
    finally:
        if ltoken is not None:
            _LLM.reset(ltoken)
        if token is not None:
            _FRAME.reset(token)
    ev.duration = perf_counter() - ev.started
    if keep:
        ev.returned(out)
    if post is not None:
        try:
            return post(out)
        except Exception as exc:
            hook.fail("post-processing a call", exc)
    return out


def note_exc(hook: HookPort, ev: Event, exc: BaseException) -> None:
    try:
        ev.duration = perf_counter() - ev.started
        ev.error = describe_exc(exc)
    except Exception as err:  # pragma: no cover - defensive: describe_exc does not raise
        hook.fail("recording an exception", err)


# -- stream relays ------------------------------------------------------------------------------


async def relay(
    agen: Any,
    frame: Frame | None,
    on_start: Callable[[], None] | None,
    on_item: Callable[[Any], None] | None,
    on_end: Callable[[BaseException | None, bool], None],
) -> AsyncGenerator[Any, Any]:
    """Yield what `agen` yields, unchanged, and call back on start, on each item and at the end.

    The end callback runs on exhaustion, on an error, and on `aclose()`/`break`+garbage collection
    (then the wrapped generator is closed too, so its own `finally` runs). `asend` and `athrow` are
    forwarded. The run frame is set around each step of `agen`, never across our own `yield`.
    Callbacks must not raise (the caller's callbacks catch their own errors).
    """
    exhausted = False
    error: BaseException | None = None
    action, value = 0, None  # 0: next, 1: send, 2: throw
    try:
        if on_start is not None:
            on_start()
        while True:
            token = _FRAME.set(frame)
            try:
                if action == 0:
                    item = await agen.__anext__()
                elif action == 1:
                    item = await agen.asend(value)
                else:
                    item = await agen.athrow(value)
            except StopAsyncIteration:
                exhausted = True
                break
            finally:
                _FRAME.reset(token)
            if on_item is not None:
                on_item(item)
            try:
                sent = yield item
            except GeneratorExit:
                raise
            except BaseException as thrown:  # the consumer's athrow(): hand it to the wrapped generator
                action, value = 2, thrown
            else:
                action, value = (0, None) if sent is None else (1, sent)
    except GeneratorExit:
        raise
    except BaseException as exc:
        error = exc
        exhausted = True  # the wrapped generator is finished once it raised
        raise
    finally:
        if not exhausted:
            token = _FRAME.set(frame)
            try:
                await agen.aclose()
            finally:
                _FRAME.reset(token)
                on_end(error, False)
        else:
            on_end(error, error is None)


def wrap_stream_function(fn: Callable[..., Any], on_done: Callable[[Any, BaseException | None, bool], None]) -> Any:
    """Wrap an async-generator *function* (FlowAgent's stream mode returns one, uncalled).

    The result is a wrapt proxy of `fn` (same name, signature and `inspect.isasyncgenfunction`); calling
    it returns a relay over `fn(...)`. `on_done(last_item, error, completed)` runs once when that ends.
    """
    if not inspect.isasyncgenfunction(fn):
        return fn

    def call(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        agen = wrapped(*args, **kwargs)
        box: list[Any] = [None]

        def on_item(item: Any) -> None:
            box[0] = item

        def on_end(error: BaseException | None, completed: bool) -> None:
            on_done(box[0], error, completed)

        return relay(agen, _FRAME.get(), None, on_item, on_end)

    return wrapt.FunctionWrapper(fn, call)
