"""Capture's records: what an adapter records during a run, and what the recording side needs of a hook.

- **events**, appended to the run's `RunRecord` on the host's side: a `ToolEvent` per tool call, an `LLMEvent`
  per model call. Plain slotted records holding the host's values as they came; nothing is copied, masked or
  serialised on the host (the writer thread does that in `assemble.py`, the only reader of events);
- `ErrorText` and `TextParts`: an exception's text and a streamed answer's chunks, joined on the writer thread;
- **`HookPort`**: the hook's settings and callbacks that the recorder, the adapters and the writer use.

This module imports nothing of capture's: everything else of it is above it. How an adapter records a call
(`guarded_call`, `PatchSpec`, `Adapter`) is `flowrl.capture.adapter`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

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


class ErrorText:
    """An exception's `Type: message`, joined on the writer thread (`values.Values.text`): joining a long
    message on the host would copy all of it there. `message` is the text, or, when `str(exc)` raised,
    the exception's lone argument (the writer says what it was)."""

    __slots__ = ("message", "name")

    def __init__(self, name: str, message: Any) -> None:
        self.name = name
        self.message = message

    def __repr__(self) -> str:
        return f"ErrorText({self.name!r}, <{type(self.message).__name__}>)"


class TextParts:
    """A streamed answer's text chunks, joined (or cut to `max_chars`) on the writer thread."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[str]) -> None:
        self.parts = parts


class HookPort(Protocol):
    """What the recording side (the recorder, the adapters, the client patches, the writer's `assemble`) needs
    of a `flowrl.capture.hook.Hook`: its settings, and where a failure, a finished run or an outcome goes. The
    hook satisfies it; the modules below the hook name only this, so none of them imports the hook."""

    agent_name: str | None
    source: str
    metadata: dict[str, Any]
    max_events: int
    llm_clients: frozenset[str]

    @property
    def active(self) -> bool:
        """Is the hook installed (not yet unhooked)?"""
        ...

    def fail(self, where: str, exc: BaseException) -> None: ...

    def unattributed(self) -> None: ...

    def finish(self, rec: Any) -> None: ...

    def defer(self, rec: Any, task: Any, refresh: Callable[[], Any]) -> None: ...


__all__ = ["ErrorText", "Event", "HookPort", "LLMEvent", "TextParts", "ToolEvent"]
