"""LLM-client capture: the OpenAI Python SDK's calls, recorded into the captured run they are made in.

    hook = hook_into_agent(agent, run_methods=["run"])   # llm_clients="auto": the SDK is patched too
    agent.run("...")   # every client.chat.completions.create / client.responses.create inside is recorded

What is patched: `Completions.create`, `AsyncCompletions.create` (chat completions, `stream=True` too),
`Responses.create` and `AsyncResponses.create` (the Responses API, `stream=True` too), once per process, on
the SDK's classes, by the first hook that asks for them (option `llm_clients`); the last hook to let go puts
the original functions back (the same objects). Which run a call belongs to is the capture context variable
(`recorder.current_frame`, ART's `capture_auto_trajectory` model), not the client: a call made while a
captured run's frame is current is recorded into that run, whoever's client made it; a call outside any run
is not recorded (counted in `unattributed` by every hook that patches the SDK). A call made while a hooked
LLM method of the same run is open (`recorder.current_llm`) is not a second LLM call: it is attached to that
method's event (`LLMEvent.inner`), and the writer reads its request and response from there.

The host's side does only this per call: a shallow copy of the request's message list (the host appends to
its own list afterwards), one `LLMEvent` appended to the run, the call timed; for a stream, the same
`Stream` object is returned, its item iterator wrapped so each item the host reads is appended to the event
(the items are the SDK's own objects, unchanged). Return values, exceptions and stream items pass through
unchanged; a failure while recording is counted (`capture_errors`), logged, and the call goes on unrecorded.

The writer thread (`assemble.py`) reads the events back with `client_read.py` (`call_entry`, `seen_messages`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from flowrl.capture import client_patch
from flowrl.capture.client_patch import ClientCall, ClientSpec, Target, attach
from flowrl.capture.client_read import CHAT, RESPONSES
from flowrl.capture.events import HookPort, LLMEvent
from flowrl.capture.recorder import perf_counter

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.recorder import RunRecord


def _openai_targets() -> list[tuple[type, str, str, bool]]:
    """(class, attribute, api, async) for the OpenAI SDK; what this SDK version lacks is left out."""
    targets: list[tuple[type, str, str, bool]] = []
    try:
        from openai.resources.chat.completions import AsyncCompletions, Completions

        targets += [(Completions, "create", CHAT, False), (AsyncCompletions, "create", CHAT, True)]
    except ImportError:  # pragma: no cover - a very old SDK
        pass
    try:
        from openai.resources.responses import AsyncResponses, Responses

        targets += [(Responses, "create", RESPONSES, False), (AsyncResponses, "create", RESPONSES, True)]
    except ImportError:  # pragma: no cover - an SDK before the Responses API
        pass
    return targets


def record(rec: RunRecord, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LLMEvent | None:
    """The event of one SDK call in run `rec` (added to the run, or attached to the hooked LLM method open
    in it), or None when the run's hook does not capture this client or the run takes no more events."""
    hook = rec.hook
    if "openai" not in hook.llm_clients or not hook.active:
        return None
    request = kwargs.get("messages") if api is CHAT else kwargs.get("input")
    if request.__class__ is list:
        request = request[:]  # the host appends to its own list after the call: keep what was sent
    elif request is not None and not isinstance(request, (str, tuple)):
        request = None  # an iterable the SDK consumes (a generator): never iterated here
    stream = kwargs.get("stream") is True
    ev = LLMEvent(
        perf_counter(), kwargs, kwargs.get("model"), stream, None, None, None, None, None, None, api, request,
        [] if stream else None,
    )  # fmt: skip
    return attach(rec, ev)


def _record(rec: RunRecord, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LLMEvent | None:
    return record(rec, api, args, kwargs)  # `record` looked up per call: a test may replace it


def _patches() -> list[Target]:
    return [
        (owner, attr, partial(_async_handler if is_async else _sync_handler, api))
        for owner, attr, api, is_async in _openai_targets()
    ]


SPEC = ClientSpec("openai", _patches)  # what `flowrl.capture.clients` lists


def _sync_handler(api: str, live: list[bool]) -> Callable[..., Any]:
    return client_patch.call_handler(ClientCall("openai", api, _record, _tap), live)


def _async_handler(api: str, live: list[bool]) -> Callable[..., Any]:
    return client_patch.call_handler(ClientCall("openai", api, _record, _tap), live, is_async=True)


def _tap(hook: HookPort, ev: LLMEvent, stream: Any, is_async: bool) -> None:
    """Record each item of an SDK `Stream`/`AsyncStream` as the host reads it: the same stream object, its
    item iterator wrapped. A stream of another shape is left alone (its items are not recorded). Never raises."""
    try:
        inner = getattr(stream, "_iterator", None)
        if is_async and inspect.isasyncgen(inner):
            stream._iterator = _atap(inner, ev)
        elif not is_async and inspect.isgenerator(inner):
            stream._iterator = _stap(inner, ev)
        else:
            ev.chunks = None  # nothing to read the answer from
    except Exception as exc:
        ev.chunks = None
        hook.fail(f"{ev.api}: following a stream", exc)


def _stap(inner: Any, ev: LLMEvent) -> Any:
    chunks = ev.chunks
    assert chunks is not None
    try:
        for item in inner:
            chunks.append(item)
            yield item
    finally:
        ev.duration = perf_counter() - ev.started


async def _atap(inner: Any, ev: LLMEvent) -> Any:
    chunks = ev.chunks
    assert chunks is not None
    try:
        async for item in inner:
            chunks.append(item)
            yield item
    finally:
        ev.duration = perf_counter() - ev.started


__all__ = ["CHAT", "RESPONSES", "SPEC", "record"]
