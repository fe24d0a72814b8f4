"""What a framework adapter is made of: `guarded_call`, the one way it records a call; `PatchSpec`, one method to
patch; `Adapter`, the interface `hook_into_agent` uses (see `flowrl.capture.events` for the records).

A new framework adapter is a module with an `ADAPTER` object that satisfies `Adapter`, its handlers made with
`guarded_call` and `recorder.run_frame`/`recorder.leave_frame` around the host's run (see `generic.py`), and
one line in `hook.ADAPTERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from flowrl.capture.events import Event, HookPort, LLMEvent
from flowrl.capture.recorder import Frame, enter_llm, frame_of, leave_llm, timed

# record(frame, instance, args, kwargs) -> the event to time, already added to the run (or attached to its
# parent), or None when the run takes no more events
Record = Callable[["Frame", Any, tuple[Any, ...], dict[str, Any]], Event | None]
# proceed(frame, event, wrapped, instance, args, kwargs) -> the host's return value, the call timed into event
Proceed = Callable[["Frame", Any, Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


def guarded_call(hook: HookPort, where: str, record: Record, proceed: Proceed | None = None) -> Callable[..., Any]:
    """A wrapt handler for a tool or LLM method (see the module docstring). Without `proceed`, the host's
    coroutine is awaited and timed into the event (`recorder.timed`, no frame: nothing nests into the call)."""

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
        hook: HookPort,
        *,
        run_methods: list[str] | None,
        tool_methods: list[str] | None,
        llm_methods: list[str] | None,
    ) -> list[PatchSpec]:
        """The patches for this agent; the method lists are the user's (None: the adapter's defaults)."""
        ...


__all__ = ["Adapter", "PatchSpec", "guarded_call"]
