"""Capture's internal protocol: what an adapter records during a run, and the one way it records a call.

An adapter (one small file per framework: `flowagent.py`, `generic.py`) maps a framework's methods onto three
things, all defined here:

- **events**, appended to the run's `RunRecord` on the host's side: a `ToolEvent` per tool call, an `LLMEvent`
  per model call. Plain slotted records holding the host's values as they came; nothing is copied, masked or
  serialised on the host (the writer thread does that in `assemble.py`, the only reader of events);
- **`guarded_call`**, the handler every adapter's tool and LLM patches are made with: outside a run of this
  hook it calls the host's method and nothing else; inside one it records an event (a failure there is
  counted and the call goes on unrecorded), then hands the call to the adapter's `proceed`, which times it
  (`recorder.timed`). The host's result and exceptions pass through unchanged;
- **`Adapter`**, the interface `hook_into_agent` uses: `detects(agent)` and `plan(...)`, the list of
  `PatchSpec`s to install.

A new framework adapter is a module with an `ADAPTER` object that satisfies `Adapter`, its handlers made with
`guarded_call` and `recorder.run_frame`/`recorder.leave_frame` around the host's run (see `generic.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.hook import Hook
    from flowrl.capture.recorder import ErrorText, Frame

ToolSource = str  # "engine" (FlowAgent's _execute_tool_call), "function" (arun_function), "generic"


@dataclass(slots=True, eq=False)
class ToolEvent:
    """One tool call. `source` says which layer saw it:

    - "engine": `tool_call` is the model's tool call (name, arguments, id); `result` the engine's return value;
    - "function": `name` and `kwargs` as the function layer got them; `result` the tool's raw return value;
    - "generic": `method`, `args`, `kwargs` and `signature` of the named tool method (`assemble` names the tool
      and its arguments from them); `result` its raw return value.

    `inner` is the same call seen one layer down (FlowAgent's `arun_function` inside `_execute_tool_call`).
    Adapters build it with positional arguments on the hot path (keywords cost 0.2 µs more per call here)."""

    source: ToolSource
    started: float
    name: Any = None
    method: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    signature: inspect.Signature | None = None
    tool_call: Any = None
    inner: ToolEvent | None = None
    duration: float | None = None
    result: Any = None
    error: str | ErrorText | None = None

    def returned(self, value: Any) -> None:
        self.result = value


@dataclass(slots=True, eq=False)
class LLMEvent:
    """One model call: its keyword arguments as given (the tools offered are read from them), the model name,
    whether it streams, and what it returned (`output`); tokens and cost where the adapter can attribute them.

    A call recorded at the LLM client (`openai_client.py`) also has `api` (which API: "openai.chat",
    "openai.responses"), `request` (a shallow copy of the request's `messages`, or the Responses `input`, as
    sent: the host may append to its own list afterwards) and, for a stream, `chunks` (the items the host
    was handed, appended as it reads them). A client call made inside a hooked LLM method of the same run is
    not a second call: it is kept in the method's `inner` list, and the writer reads the request and response
    from it. Built with positional arguments on the hot path."""

    started: float
    kwargs: dict[str, Any]
    model: Any = None
    stream: bool = False
    duration: float | None = None
    output: Any = None
    error: str | ErrorText | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None
    api: str | None = None
    request: Any = None
    chunks: list[Any] | None = None
    inner: list[LLMEvent] | None = None

    def returned(self, value: Any) -> None:
        self.output = value


Event = ToolEvent | LLMEvent

# record(frame, instance, args, kwargs) -> the event to time, already added to the run (or attached to its
# parent), or None when the run takes no more events
Record = Callable[["Frame", Any, tuple[Any, ...], dict[str, Any]], Event | None]
# proceed(frame, event, wrapped, instance, args, kwargs) -> the host's return value, the call timed into event
Proceed = Callable[["Frame", Any, Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


def guarded_call(hook: Hook, where: str, record: Record, proceed: Proceed | None = None) -> Callable[..., Any]:
    """A wrapt handler for a tool or LLM method (see the module docstring). Without `proceed`, the host's
    coroutine is awaited and timed into the event (`recorder.timed`, no frame: nothing nests into the call)."""
    from flowrl.capture.recorder import enter_llm, frame_of, leave_llm, timed

    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        frame = frame_of(hook)
        if frame is None:
            return wrapped(*args, **kwargs)
        try:
            event = record(frame, instance, args, kwargs)
        except Exception as exc:
            hook.fail(f"{where}: recording a call", exc)
            event = None
        if event is None:
            return wrapped(*args, **kwargs)
        if proceed is None:  # the common case, inline: one call fewer on the hot path
            return timed(hook, None, event, wrapped(*args, **kwargs))
        if event.__class__ is not LLMEvent:
            return proceed(frame, event, wrapped, instance, args, kwargs)
        token = enter_llm((frame[0], event))  # a plain LLM method: the client calls it makes attach to it
        try:
            return proceed(frame, event, wrapped, instance, args, kwargs)
        finally:
            leave_llm(token)

    return handler


@dataclass(frozen=True, slots=True)
class PatchSpec:
    """One method to patch: `owner.attr`, with `handler`. `via` names the attribute of the patched object that
    leads to the hooked agent (FlowAgent's engine: "agent"); None when the object is the agent itself."""

    owner: type
    attr: str
    via: str | None
    handler: Callable[..., Any]


class Adapter(Protocol):
    """A framework adapter: which agents it knows, and what to patch on one."""

    name: str

    def detects(self, agent: Any) -> bool:
        """Is this a kind of agent this adapter knows without being told its methods?"""
        ...

    def plan(
        self,
        agent: Any,
        hook: Hook,
        *,
        run_methods: list[str] | None,
        tool_methods: list[str] | None,
        llm_methods: list[str] | None,
    ) -> list[PatchSpec]:
        """The patches for this agent; the method lists are the user's (None: the adapter's defaults)."""
        ...


__all__ = ["Adapter", "Event", "LLMEvent", "PatchSpec", "ToolEvent", "guarded_call"]
