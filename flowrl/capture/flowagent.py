"""The toolboxv2 FlowAgent adapter (toolboxv2 0.1.28, the V2 agent; docs/reference/flowagent-0.1.28.md §1, §2, §7).

What is patched (on the classes, filtered to hooked agents):
- `FlowAgent.a_run`: called with `get_ctx=True`; the caller still gets exactly what it asked for.
  The transcript is `ctx.working_history[len_before:]`, where `len_before` is the length of the
  context this run resumes (auto-resume reuses a session's last context) or 0 for a fresh one.
- `FlowAgent.a_stream`: a relay over the chunk stream; `run_id` from `engine._session_last_run`.
- `ExecutionEngine._execute_tool_call(ctx, tool_call) -> (result_str, is_final)`: every tool call of
  the ReAct loop with its call id (think, load_tools, sub-agents included).
- `FlowAgent.arun_function(name, **kw)`: the real tool's own timing and exception; inside
  `_execute_tool_call` it is attached to that call, not recorded twice.
- `FlowAgent.a_run_llm_completion`: model, tokens, latency, output; a stream-mode result (an
  async-generator function) is wrapped so its output is recorded when it is consumed.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowrl.capture import generic
from flowrl.capture.adapter import PatchSpec, guarded_call
from flowrl.capture.events import HookPort, LLMEvent, ToolEvent
from flowrl.capture.recorder import (
    Frame,
    RunRecord,
    describe_exc,
    enter_frame,
    inside_run_of,
    leave_frame,
    perf_counter,
    relay,
    timed,
    wrap_stream_function,
)

ENGINE_TOOL = "_execute_tool_call"
TOOL_METHOD = "arun_function"
LLM_METHOD = "a_run_llm_completion"
STREAM_CHUNKS = frozenset({"tool_start", "tool_result", "final_answer", "done", "error", "max_iterations", "paused"})

_SIGNATURES: dict[Any, inspect.Signature] = {}


def is_flowagent(agent: Any) -> bool:
    cls = type(agent)
    return all(callable(getattr(cls, name, None)) for name in ("a_run", "_get_execution_engine", TOOL_METHOD))


def pending_commits(agent: Any) -> list[Any]:
    """The background commits a FlowAgent still runs for finished runs (`persist_blocking=False`: the session
    history and the run summary are written after `a_run` returned); empty for any other agent."""
    if not is_flowagent(agent):
        return []
    try:
        tasks = getattr(_engine(agent), "_pending_finalize_tasks", None) or {}
        return [t for t in tasks.values() if hasattr(t, "done") and not t.done()]
    except Exception:  # noqa: BLE001 - an engine that cannot be reached has nothing pending we can wait for
        return []


def _bind(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    func = getattr(wrapped, "__func__", wrapped)
    sig = _SIGNATURES.get(func)
    if sig is None:
        sig = _SIGNATURES[func] = inspect.signature(wrapped)
    return sig.bind(*args, **kwargs)


def _arg(bound: inspect.BoundArguments, name: str, default: Any) -> Any:
    if name in bound.arguments:
        return bound.arguments[name]
    param = bound.signature.parameters.get(name)
    return default if param is None or param.default is inspect.Parameter.empty else param.default


def _engine(agent: Any) -> Any:
    return getattr(agent, "_execution_engine_cache", None)  # read, never create: creating has side effects


def _last_context(agent: Any, session_id: Any) -> Any:
    engine = _engine(agent)
    if engine is None:
        return None, None
    run_id = (getattr(engine, "_session_last_run", None) or {}).get(session_id)
    ctx = (getattr(engine, "_active_executions", None) or {}).get(run_id) if run_id is not None else None
    return run_id, ctx


@dataclass(slots=True, frozen=True)
class Resumable:
    """The context a run in this session would resume, its transcript length and status (taken as the run
    starts: `RunRecord.pre`)."""

    ctx: Any = None
    length: int = 0
    status: Any = None


def _snapshot(agent: Any, session_id: Any) -> Resumable:
    _, ctx = _last_context(agent, session_id)
    if ctx is None:
        return Resumable()
    return Resumable(ctx, len(getattr(ctx, "working_history", None) or ()), getattr(ctx, "status", None))


def _status(ctx: Any) -> str | None:
    status = getattr(ctx, "status", None)
    return status if isinstance(status, str) or status is None else str(getattr(status, "value", status))


def _fill_from_ctx(rec: RunRecord, ctx: Any) -> None:
    rec.run_id = getattr(ctx, "run_id", None)
    rec.status = _status(ctx)
    pre = rec.pre if isinstance(rec.pre, Resumable) else Resumable()
    start = 0
    if pre.ctx is ctx and pre.ctx is not None:
        if pre.status == "running":  # FlowAgent answered through its sidecar; the context is another run's
            rec.meta["sidecar"] = True
            return
        rec.meta["resumed"] = True
        rec.meta["resumed_after_message"] = pre.length
        start = pre.length
    history = getattr(ctx, "working_history", None) or []
    rec.messages = [dict(m) if isinstance(m, dict) else m for m in history[start:]]


def _tokens(agent: Any) -> tuple[float, float, float] | None:
    try:
        values = (agent.total_tokens_in, agent.total_tokens_out, getattr(agent, "total_cost_accumulated", 0.0) or 0.0)
    except AttributeError:
        return None
    return values if all(isinstance(v, (int, float)) for v in values) else None


class TokenMarks:
    """One hooked agent's token counters as last attributed to an LLM call (`attribute`)."""

    __slots__ = ("mark",)

    def __init__(self) -> None:
        self.mark: tuple[float, ...] | None = None

    def attribute(self, ev: LLMEvent, before: Any, agent: Any) -> None:
        """Tokens of one LLM call = counter growth since the later of its start and the last attributed end.

        Exact for sequential calls; with overlapping calls each growth goes to the call that ends next."""
        after = _tokens(agent)
        if before is None or after is None:
            return
        mark = self.mark
        base = before if mark is None else tuple(max(b, m) for b, m in zip(before, mark))
        self.mark = after if mark is None else tuple(max(a, m) for a, m in zip(after, mark))
        delta = [a - b for a, b in zip(after, base)]
        if min(delta) < 0:
            return
        ev.tokens_in, ev.tokens_out = int(delta[0]), int(delta[1])
        ev.cost = delta[2] or None


def _ctx_in(out: Any) -> Any:
    """The ExecutionContext of an `a_run(..., get_ctx=True)` result `(answer, ctx)`, else None."""
    if isinstance(out, tuple) and len(out) == 2 and hasattr(out[1], "working_history"):
        return out[1]
    return None


def _finish(hook: HookPort, rec: RunRecord, agent: Any, ctx: Any) -> None:
    """Hand the run to the writer, or, when FlowAgent still has to commit it (its status stays
    "running" until the background commit of `persist_blocking=False` runs), when that commit is done."""
    try:
        if ctx is not None and rec.status == "running" and not rec.meta.get("sidecar"):
            engine = _engine(agent)
            task = (getattr(engine, "_pending_finalize_tasks", None) or {}).get(rec.run_id)
            if task is not None and hasattr(task, "add_done_callback") and not task.done():

                def refresh() -> None:
                    rec.status = _status(ctx)

                hook.defer(rec, task, refresh)
                return
    except Exception as exc:
        hook.fail("waiting for the run's commit", exc)
    hook.finish(rec)


# -- handlers -------------------------------------------------------------------------------------


def _new_run(
    hook: HookPort, method: str, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[inspect.BoundArguments, RunRecord, Any] | None:
    """The run a call of `method` starts: its bound arguments, record and session id. None: no run of its own
    (made inside one of this hook's runs), or the host's own call is wrong (let it fail exactly as it would).
    May raise: the handler counts it."""
    if inside_run_of(hook):
        return None
    try:
        bound = _bind(wrapped, args, kwargs)
    except TypeError:
        return None
    session_id = _arg(bound, "session_id", "default")
    return bound, RunRecord(hook, "flowagent", method, _arg(bound, "query", None), session_id), session_id


def _a_run_handler(hook: HookPort) -> Callable[..., Any]:
    def finish(rec: RunRecord, agent: Any, out: Any = None, exc: BaseException | None = None) -> None:
        ctx = None
        try:
            if exc is not None:
                rec.exc = describe_exc(exc)
                rec.status = "cancelled" if generic.is_cancel(exc) else "error"
            else:
                ctx = _ctx_in(out)
                rec.result = out if ctx is None else out[0]
                if ctx is not None:
                    _fill_from_ctx(rec, ctx)
        except Exception as err:
            hook.fail("a_run: reading the run's context", err)
        _finish(hook, rec, agent, ctx)

    async def run(rec: RunRecord, agent: Any, coro: Any, forced: bool) -> Any:
        token = enter_frame((rec, None))
        try:
            out = await coro
        except BaseException as exc:
            finish(rec, agent, exc=exc)
            raise
        finally:
            leave_frame(token)
        result = out[0] if forced and _ctx_in(out) is not None else out  # what the caller asked for
        finish(rec, agent, out)
        return result

    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            begun = _new_run(hook, "a_run", wrapped, args, kwargs)
            if begun is None:
                return wrapped(*args, **kwargs)
            bound, rec, session_id = begun
            rec.pre = _snapshot(instance, session_id)
            forced = "get_ctx" in bound.signature.parameters and not _arg(bound, "get_ctx", False)
            if forced:
                bound.arguments["get_ctx"] = True
            call_args, call_kwargs = bound.args, bound.kwargs
        except Exception as exc:
            hook.fail("a_run: starting a run", exc)
            return wrapped(*args, **kwargs)
        return run(rec, instance, wrapped(*call_args, **call_kwargs), forced)

    return handler


def _a_stream_handler(hook: HookPort) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            begun = _new_run(hook, "a_stream", wrapped, args, kwargs)
            if begun is None:
                return wrapped(*args, **kwargs)
            _, rec, session_id = begun
        except Exception as exc:
            hook.fail("a_stream: starting a run", exc)
            return wrapped(*args, **kwargs)
        agen = wrapped(*args, **kwargs)
        if not inspect.isasyncgen(agen):
            return agen
        return relay(agen, (rec, None), *_stream_callbacks(hook, rec, instance, session_id))

    return handler


def _stream_callbacks(hook: HookPort, rec: RunRecord, agent: Any, session_id: Any) -> tuple[Any, Any, Any]:
    def on_start() -> None:
        try:
            rec.pre = _snapshot(agent, session_id)
            rec.wall0, rec.perf0 = time.time(), perf_counter()  # the run starts when the stream is first read
        except Exception as exc:
            hook.fail("a_stream: reading the session's context", exc)

    def on_item(chunk: Any) -> None:
        try:
            if isinstance(chunk, dict) and chunk.get("type") in STREAM_CHUNKS and not rec.closed:
                rec.chunks.append((perf_counter(), chunk))
        except Exception as exc:
            hook.fail("a_stream: reading a chunk", exc)

    def on_end(error: BaseException | None, completed: bool) -> None:
        ctx = None
        try:
            run_id, ctx = _last_context(agent, session_id)
            if ctx is not None:
                _fill_from_ctx(rec, ctx)
            rec.run_id = rec.run_id or run_id
            kinds = {c.get("type") for _, c in rec.chunks}
            if "max_iterations" in kinds and rec.status in (None, "running", "completed"):
                rec.status = "max_iterations"
            if error is not None:
                rec.exc = describe_exc(error)
                rec.status = "cancelled" if generic.is_cancel(error) else "error"
            elif not completed:
                rec.meta["closed_early"] = True
        except Exception as exc:
            hook.fail("a_stream: reading the run's context", exc)
        _finish(hook, rec, agent, ctx)

    return on_start, on_item, on_end


def _engine_tool_handler(hook: HookPort) -> Callable[..., Any]:
    def record(frame: Frame, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ToolEvent | None:
        tool_call = args[1] if len(args) > 1 else kwargs.get("tool_call")
        ev = ToolEvent("engine", perf_counter(), None, None, (), None, None, tool_call)  # positional: the hot path
        return ev if frame[0].add(ev) else None

    def proceed(
        frame: Frame, ev: Any, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return timed(hook, (frame[0], ev), ev, wrapped(*args, **kwargs))  # arun_function nests into it

    return guarded_call(hook, ENGINE_TOOL, record, proceed)


def _function_handler(hook: HookPort) -> Callable[..., Any]:
    def record(frame: Frame, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ToolEvent | None:
        name = args[0] if args else kwargs.get("function_name")
        ev = ToolEvent("function", perf_counter(), name, None, (), kwargs)  # positional: the hot path
        parent = frame[1]
        if parent is not None and parent.source == "engine" and parent.inner is None:
            parent.inner = ev  # the same call seen one layer down (assemble merges it when the names match)
            return ev
        return ev if frame[0].add(ev) else None

    return guarded_call(hook, TOOL_METHOD, record)


def _llm_handler(hook: HookPort, marks: TokenMarks) -> Callable[..., Any]:
    def record(frame: Frame, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LLMEvent | None:
        stream = kwargs.get("stream")
        if stream is None:
            stream = getattr(instance, "stream", False)
        model = kwargs.get("model")
        if model is None:
            amd = getattr(instance, "amd", None)
            model = getattr(amd, f"{kwargs.get('model_preference', 'fast')}_llm_model", None)
        ev = LLMEvent(perf_counter(), kwargs, model, bool(stream))
        return ev if frame[0].add(ev) else None

    def proceed(
        frame: Frame, ev: Any, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            before = _tokens(instance)  # the counters as the call starts
        except Exception as exc:
            hook.fail("a_run_llm_completion: reading the token counters", exc)
            before = None

        def post(out: Any) -> Any:
            if callable(out) and inspect.isasyncgenfunction(out):

                def done(last: Any, error: BaseException | None, completed: bool) -> None:
                    try:
                        ev.output, ev.duration = last, perf_counter() - ev.started
                        if error is not None:
                            ev.error = describe_exc(error)
                        marks.attribute(ev, before, instance)
                    except Exception as exc:
                        hook.fail("a_run_llm_completion: finishing a stream", exc)

                return wrap_stream_function(out, done)
            marks.attribute(ev, before, instance)
            return out

        return timed(hook, None, ev, wrapped(*args, **kwargs), True, post)

    return guarded_call(hook, LLM_METHOD, record, proceed)


class FlowAgentAdapter:
    """toolboxv2's FlowAgent (0.1.28): runs, streams, the engine's tool calls, tools and LLM calls."""

    name = "flowagent"

    def detects(self, agent: Any) -> bool:
        return is_flowagent(agent)

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

        def default(names: tuple[str, ...]) -> list[str]:  # defaults only where this FlowAgent has them
            return [m for m in names if callable(getattr(cls, m, None))]

        runs = run_methods if run_methods is not None else default(("a_run", "a_stream"))
        tools = tool_methods if tool_methods is not None else default((TOOL_METHOD,))
        llms = llm_methods if llm_methods is not None else default((LLM_METHOD,))
        marks = TokenMarks()
        specs: list[PatchSpec] = []
        for name in runs:
            handler = {"a_run": _a_run_handler, "a_stream": _a_stream_handler}.get(name)
            specs.append(
                PatchSpec(cls, name, None, handler(hook) if handler else generic.run_handler(hook, name, "flowagent"))
            )
        for name in tools:
            specs.append(
                PatchSpec(
                    cls,
                    name,
                    None,
                    _function_handler(hook) if name == TOOL_METHOD else generic.tool_handler(hook, cls, name),
                )
            )
        for name in llms:
            specs.append(
                PatchSpec(
                    cls,
                    name,
                    None,
                    _llm_handler(hook, marks) if name == LLM_METHOD else generic.llm_handler(hook, cls, name),
                )
            )
        try:
            engine_cls = _engine_class(agent)
            if not callable(getattr(engine_cls, ENGINE_TOOL, None)):
                raise TypeError(f"{engine_cls.__name__} has no {ENGINE_TOOL}")
            specs.append(PatchSpec(engine_cls, ENGINE_TOOL, "agent", _engine_tool_handler(hook)))
        except Exception as exc:  # runs, LLM calls and arun_function are still captured
            hook.fail("finding the execution engine (tool calls will come from arun_function only)", exc)
        return specs


ADAPTER = FlowAgentAdapter()


def _engine_class(agent: Any) -> type:
    """The agent's ExecutionEngine class, without creating an engine when there is none yet: the
    existing engine's class, else `ExecutionEngine` beside the agent's class (FlowAgent imports it
    from `<package>.execution_engine` inside `_get_execution_engine`), else, as a last resort, the
    class of the engine `_get_execution_engine()` creates."""
    engine = _engine(agent)
    if engine is not None:
        return type(engine)
    owner = next((k for k in type(agent).__mro__ if "_get_execution_engine" in vars(k)), type(agent))
    found = getattr(sys.modules.get(owner.__module__), "ExecutionEngine", None)
    package = owner.__module__.rpartition(".")[0]
    if not isinstance(found, type) and package:
        try:
            found = getattr(importlib.import_module(f"{package}.execution_engine"), "ExecutionEngine", None)
        except ImportError:
            found = None
    if not isinstance(found, type):
        found = type(agent._get_execution_engine())
    return found
