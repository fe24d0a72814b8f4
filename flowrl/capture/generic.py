"""The adapter for any agent: name its entry points and tools.

    hook_into_agent(agent, run_methods=["a_run"], tool_methods=["call_tool"], llm_methods=["complete"])

- a run method is one trace per call. The query is the first positional argument or the keyword
  `query`/`prompt`/`input`/`message`/`task`/`text`; the session is the keyword `session_id`/`session`.
  Coroutine methods, async-generator methods (a relay finishes the trace when the stream ends or is
  closed) and plain methods all work.
- a tool method is one tool call of the current run. A first parameter called name/tool/tool_name/
  function_name names the tool (`call_tool("search", {...})`), otherwise the method's name does; the
  arguments are stored by parameter name. A raised exception is a failed call (re-raised unchanged).
- an LLM method is one LLM call (latency, output, `model=` keyword if given).

There is no transcript to read, so `messages` is rebuilt from the query, the tool calls and the
answer (`metadata.transcript = "synthesized"`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from flowrl.capture.adapter import PatchSpec, guarded_call
from flowrl.capture.events import Event, HookPort, LLMEvent, TextParts, ToolEvent
from flowrl.capture.recorder import (
    Frame,
    RunRecord,
    describe_exc,
    enter_frame,
    inside_run_of,
    leave_frame,
    note_exc,
    perf_counter,
    relay,
    timed,
)

QUERY_KEYS = ("query", "prompt", "input", "message", "task", "text")
SESSION_KEYS = ("session_id", "session")


def _query(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for key in QUERY_KEYS:
        if key in kwargs:
            return kwargs[key]
    return args[0] if args else None


def _session(kwargs: dict[str, Any]) -> Any:
    for key in SESSION_KEYS:
        if kwargs.get(key) is not None:
            return kwargs[key]
    return "default"


def run_handler(hook: HookPort, method: str, adapter: str = "generic") -> Callable[..., Any]:
    def finish(rec: RunRecord, out: Any = None, exc: BaseException | None = None) -> None:
        try:
            if exc is not None:
                rec.exc = describe_exc(exc)
                rec.status = "cancelled" if is_cancel(exc) else "error"
            else:
                rec.result = out
                rec.status = rec.status or "completed"
            rec.meta["transcript"] = "synthesized"
        except Exception as err:
            hook.fail(f"{method}: recording the result", err)
        hook.finish(rec)

    async def run_coro(rec: RunRecord, frame: Frame, coro: Any) -> Any:
        token = enter_frame(frame)
        try:
            out = await coro
        except BaseException as exc:
            finish(rec, exc=exc)
            raise
        finally:
            leave_frame(token)
        finish(rec, out)
        return out

    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            if inside_run_of(hook):  # run() -> a_run() on the same agent: one run, one trace
                return wrapped(*args, **kwargs)
            rec = RunRecord(hook, adapter, method, _query(args, kwargs), _session(kwargs))
            frame: Frame = (rec, None)
        except Exception as exc:
            hook.fail(f"{method}: starting a run", exc)
            return wrapped(*args, **kwargs)
        token = enter_frame(frame)  # a plain method runs now; a coroutine's body runs when awaited
        try:
            out = wrapped(*args, **kwargs)
        except BaseException as exc:
            finish(rec, exc=exc)
            raise
        finally:
            leave_frame(token)
        if inspect.iscoroutine(out):
            return run_coro(rec, frame, out)
        if inspect.isasyncgen(out):
            return _relay_run(rec, frame, out, finish)
        finish(rec, out)
        return out

    return handler


def _relay_run(rec: RunRecord, frame: Frame, agen: Any, finish: Callable[..., None]) -> Any:
    """A streamed run: the answer is the text chunks joined, or the last item when they are not text."""
    texts: list[str] = []
    state: dict[str, Any] = {"last": None, "mixed": False}

    def on_item(item: Any) -> None:
        state["last"] = item
        if isinstance(item, str):
            texts.append(item)
        else:
            state["mixed"] = True

    def on_end(error: BaseException | None, completed: bool) -> None:
        if not completed and error is None:
            rec.meta["closed_early"] = True
        finish(rec, TextParts(texts) if texts and not state["mixed"] else state["last"], error)  # joined by the writer

    return relay(agen, frame, None, on_item, on_end)


def is_cancel(exc: BaseException) -> bool:
    import asyncio

    return isinstance(exc, asyncio.CancelledError)


def call_handler(
    hook: HookPort, method: str, kind: str, sig: inspect.Signature | None = None, is_coro: bool = False
) -> Callable[..., Any]:
    """A tool (`kind="tool"`) or LLM (`kind="llm"`) method of a generic agent. `sig` (without `self`)
    lets the writer name the arguments; `is_coro` (an `async def` method) skips what only plain
    methods need."""

    def record(frame: Frame, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Event | None:
        ev: Event
        if kind == "tool":
            ev = ToolEvent("generic", perf_counter(), None, method, args, kwargs, sig)  # positional: the hot path
        else:
            ev = LLMEvent(perf_counter(), kwargs, kwargs.get("model"), bool(kwargs.get("stream")))
        return ev if frame[0].add(ev) else None

    def proceed(
        frame: Frame,
        ev: Event,
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        token = enter_frame((frame[0], ev if isinstance(ev, ToolEvent) else None))
        try:
            out = wrapped(*args, **kwargs)
        except BaseException as exc:
            note_exc(hook, ev, exc)
            raise
        finally:
            leave_frame(token)
        if inspect.iscoroutine(out):
            return timed(hook, None, ev, out)
        ev.duration = perf_counter() - ev.started
        ev.returned(out)
        return out

    # an `async def` method: calling it only creates the coroutine, whose body runs inside `timed`
    return guarded_call(hook, method, record, None if is_coro else proceed)


class GenericAdapter:
    """Any agent whose run, tool and LLM methods are named (`hook_into_agent(agent, run_methods=[...])`)."""

    name = "generic"

    def detects(self, agent: Any) -> bool:
        return False  # never without being told the methods

    def plan(
        self,
        agent: Any,
        hook: HookPort,
        *,
        run_methods: list[str] | None,
        tool_methods: list[str] | None,
        llm_methods: list[str] | None,
    ) -> list[PatchSpec]:
        cls = type(agent)
        specs = [PatchSpec(cls, name, None, run_handler(hook, name)) for name in run_methods or ()]
        specs += [PatchSpec(cls, name, None, tool_handler(hook, cls, name)) for name in tool_methods or ()]
        specs += [PatchSpec(cls, name, None, llm_handler(hook, cls, name)) for name in llm_methods or ()]
        return specs


def tool_handler(hook: HookPort, cls: type, name: str) -> Callable[..., Any]:
    return call_handler(hook, name, "tool", method_signature(cls, name), is_coroutine_method(cls, name))


def llm_handler(hook: HookPort, cls: type, name: str) -> Callable[..., Any]:
    return call_handler(hook, name, "llm", None, is_coroutine_method(cls, name))


ADAPTER = GenericAdapter()


def is_coroutine_method(cls: type, name: str) -> bool:
    return inspect.iscoroutinefunction(getattr(cls, name, None))


def method_signature(cls: type, name: str) -> inspect.Signature | None:
    """The signature of `cls.name` without `self` (None when it cannot be read)."""
    try:
        sig = inspect.signature(getattr(cls, name))
    except (AttributeError, TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    return sig.replace(parameters=params)
