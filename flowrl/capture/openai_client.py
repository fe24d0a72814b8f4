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

import importlib.util
import inspect
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from flowrl.capture import _patch
from flowrl.capture.client_read import CHAT, RESPONSES
from flowrl.capture.events import LLMEvent
from flowrl.capture.recorder import current_frame, current_llm, note_exc, perf_counter

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.hook import Hook
    from flowrl.capture.recorder import RunRecord

CLIENTS = ("openai", "litellm")  # what `llm_clients` may name (LiteLLM: `litellm_client.py`)

_LOCK = _patch._LOCK  # one lock for every class patch of the process
# client -> the hooks that use its patch; `_HOOKS_OF[client]` is a tuple, replaced (never changed) under _LOCK
_HOOKS_OF: dict[str, tuple[Any, ...]] = {}
# client -> [(owner, attribute, wrapper)] while patched
_PATCHED: dict[str, list[tuple[type, str, Any]]] = {}
# the `grouping.CallCapture` that records the calls made outside any captured run, while one is active
_GROUPER: Any = None


# -- which clients ------------------------------------------------------------------------------


def importable(client: str) -> bool:
    """Can the client library be imported here (without importing it)?"""
    try:
        return importlib.util.find_spec(client) is not None
    except (ImportError, ValueError):
        return False


def auto_clients() -> tuple[str, ...]:
    """`llm_clients="auto"`: every client library flowrl knows that is importable."""
    return tuple(c for c in CLIENTS if importable(c))


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


Target = tuple[Any, str, Callable[[list[bool]], Callable[..., Any]]]  # (owner, attribute, handler(live))


def _openai_patches() -> list[Target]:
    return [
        (owner, attr, partial(_async_handler if is_async else _sync_handler, api))
        for owner, attr, api, is_async in _openai_targets()
    ]


def _litellm_patches() -> list[Target]:
    import flowrl.capture.litellm_client as litellm_client

    return litellm_client.targets()


def _litellm_lazy() -> Any:
    import flowrl.capture.litellm_client as litellm_client

    return litellm_client.LAZY


# client -> what to patch (only called once the client library is imported)
_TARGETS: dict[str, Callable[[], list[Target]]] = {"openai": _openai_patches, "litellm": _litellm_patches}
# client -> its lazy patching (`ready()`: imported now; `arm()`/`disarm()`: patch it once it is imported). A client
# listed here is never imported by flowrl: a slow import (LiteLLM's) is the host's to make
_LAZY: dict[str, Callable[[], Any]] = {"litellm": _litellm_lazy}


# -- patching, reference-counted per client -----------------------------------------------------


def acquire(hook: Hook, clients: tuple[str, ...]) -> list[str]:
    """Patch each client's SDK classes (once per process) for `hook`; returns what is patched
    ("openai.Completions.create", ...). Raises ImportError when a client cannot be imported. A lazy client
    (`_LAZY`: LiteLLM) not imported yet is patched when the host imports it ("litellm (once imported)")."""
    names: list[str] = []
    with _LOCK:
        for client in clients:
            users = _HOOKS_OF.get(client, ())
            if hook in users:
                continue
            lazy = _LAZY[client]() if client in _LAZY else None
            if client not in _PATCHED:
                if lazy is not None and not lazy.ready():
                    lazy.arm()
                    _HOOKS_OF[client] = (*users, hook)
                    names.append(f"{client} (once imported)")
                    continue
                _PATCHED[client] = _install(client)
            _HOOKS_OF[client] = (*users, hook)
            names += [_name(owner, attr) for owner, attr, _ in _PATCHED[client]]
    return names


def _name(owner: Any, attr: str) -> str:
    if isinstance(owner, ModuleType):
        return f"{owner.__name__}.{attr}"
    return f"{owner.__module__.split('.')[0]}.{owner.__name__}.{attr}"


def install_waiting(client: str) -> None:
    """A lazy client was just imported: patch it for the hooks waiting for it. Never raises."""
    with _LOCK:
        users = _HOOKS_OF.get(client, ())
        if not users or client in _PATCHED:
            return
        try:
            _PATCHED[client] = _install(client)
        except Exception as exc:
            for hook in users:
                hook.fail(f"patching {client}", exc)


def release(hook: Hook) -> None:
    """Let go of every client patch `hook` holds; the last user puts the SDK's functions back. Never raises."""
    with _LOCK:
        for client, users in list(_HOOKS_OF.items()):
            if hook not in users:
                continue
            left = tuple(h for h in users if h is not hook)
            if left:
                _HOOKS_OF[client] = left
                continue
            del _HOOKS_OF[client]
            if client in _LAZY:
                try:
                    _LAZY[client]().disarm()
                except Exception:  # pragma: no cover - defensive: disarm does not raise
                    pass
            for owner, attr, wrapper in _PATCHED.pop(client, ()):
                _restore(owner, attr, wrapper)


def patched(client: str = "openai") -> bool:
    """Is the client's SDK patched now?"""
    return client in _PATCHED


def _install(client: str) -> list[tuple[type, str, Any]]:
    done: list[tuple[type, str, Any]] = []
    try:
        for owner, attr, make in _TARGETS[client]():
            original = vars(owner)[attr]
            live = [True]
            wrapper = _patch._ClassWrapper(original, make(live), owner, live)
            setattr(owner, attr, wrapper)
            done.append((owner, attr, wrapper))
    except BaseException:
        for owner, attr, wrapper in done:
            _restore(owner, attr, wrapper)
        raise
    return done


def _restore(owner: type, attr: str, wrapper: Any) -> None:
    """Put the original function back (the same object); when another library wrapped it on top of ours
    meanwhile, take ours out of that chain (as `_patch.release` does) or leave it as a pass-through."""
    wrapper._flowrl_retire()
    try:
        if vars(owner).get(attr) is wrapper:
            setattr(owner, attr, wrapper.__wrapped__)  # type: ignore[union-attr]  # wrapt: Any | None
            return
        why = _patch._splice_out(vars(owner).get(attr), wrapper)
    except Exception as exc:  # a wrapper that does not let itself be read or re-pointed
        why = f"{type(exc).__name__}: {exc}"
    if why:
        _patch._left_in_place(owner, attr, why)


# -- the host's side: one event per call ---------------------------------------------------------


def unattributed(client: str = "openai") -> None:
    """A client call outside any captured run: counted by every hook that has this client patched."""
    for hook in _HOOKS_OF.get(client, ()):
        hook.unattributed()


def attach(rec: RunRecord, ev: LLMEvent) -> LLMEvent | None:
    """Add a client call's event to run `rec`, or, made while a hooked LLM method of the same run is open
    (`recorder.current_llm`), attach it to that method's event: one LLM call, not two."""
    open_llm = current_llm()
    if open_llm is not None and open_llm[0] is rec and open_llm[1].duration is None:
        parent = open_llm[1]
        if parent.inner is None:
            parent.inner = [ev]
        else:
            parent.inner.append(ev)
        return ev
    return ev if rec.add(ev) else None


def record(rec: RunRecord, api: str, kwargs: dict[str, Any]) -> LLMEvent | None:
    """The event of one SDK call in run `rec` (added to the run, or attached to the hooked LLM method open
    in it), or None when the run's hook does not capture this client or the run takes no more events."""
    hook = rec.hook
    if "openai" not in hook.llm_clients or not hook._active:
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


def set_grouper(grouper: Any) -> None:
    """The handle that groups the calls made outside any captured run (`grouping.CallCapture`), or None."""
    global _GROUPER
    _GROUPER = grouper


def _begin(api: str, kwargs: dict[str, Any]) -> tuple[RunRecord, LLMEvent] | None:
    """The run and event a call is recorded into: the current run's; outside any run, its conversation's when
    calls are being grouped (`grouping.capture_llm_calls`). None: not recorded (a failure counted). Never
    raises."""
    frame = current_frame()
    if frame is None:
        unattributed()
        grouper = _GROUPER
        return None if grouper is None else grouper.begin(api, kwargs, lambda rec: record(rec, api, kwargs))
    rec = frame[0]
    try:
        ev = record(rec, api, kwargs)
    except Exception as exc:
        rec.hook.fail(f"{api}: recording a call", exc)
        return None
    return None if ev is None else (rec, ev)


def _sync_handler(api: str, live: list[bool]) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not live[0]:
            return wrapped(*args, **kwargs)
        begun = _begin(api, kwargs)
        if begun is None:
            return wrapped(*args, **kwargs)
        rec, ev = begun
        try:
            out = wrapped(*args, **kwargs)
        except BaseException as exc:
            note_exc(rec.hook, ev, exc)
            raise
        ev.duration = perf_counter() - ev.started
        ev.output = out
        if ev.chunks is not None:
            _tap(rec.hook, ev, out, False)
        return out

    return handler


def _async_handler(api: str, live: list[bool]) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not live[0]:
            return wrapped(*args, **kwargs)
        begun = _begin(api, kwargs)
        if begun is None:
            return wrapped(*args, **kwargs)
        rec, ev = begun
        try:
            coro = wrapped(*args, **kwargs)  # the SDK checks its arguments here, before any await
        except BaseException as exc:
            note_exc(rec.hook, ev, exc)
            raise
        return _timed(rec.hook, ev, coro)

    return handler


async def _timed(hook: Hook, ev: LLMEvent, coro: Any) -> Any:
    try:
        out = await coro
    except BaseException as exc:
        note_exc(hook, ev, exc)
        raise
    ev.duration = perf_counter() - ev.started
    ev.output = out
    if ev.chunks is not None:
        _tap(hook, ev, out, True)
    return out


def _tap(hook: Hook, ev: LLMEvent, stream: Any, is_async: bool) -> None:
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


__all__ = [
    "CHAT",
    "CLIENTS",
    "RESPONSES",
    "acquire",
    "attach",
    "auto_clients",
    "importable",
    "install_waiting",
    "patched",
    "release",
    "set_grouper",
    "unattributed",
]
