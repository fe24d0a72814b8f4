"""The machinery every LLM-client patch shares: patch a client library's functions once per process for the
hooks that ask (reference-counted; the last one to let go puts the originals back), attach a call's event to
its run, and group the calls made outside any run.

A client is a `ClientSpec` (its name, what to patch, and, for a library flowrl must not import itself, how to
wait for the host to import it); the clients are `openai_client.SPEC` and `litellm_client.SPEC`, listed once
in `flowrl.capture.clients`. This module knows none of them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import CoroutineType, ModuleType
from typing import TYPE_CHECKING, Any

from flowrl.capture import _patch
from flowrl.capture.events import HookPort, LLMEvent
from flowrl.capture.recorder import current_frame, current_llm, enter_llm, leave_llm, note_exc, perf_counter

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.recorder import RunRecord

Target = tuple[Any, str, Callable[[list[bool]], Callable[..., Any]]]  # (owner, attribute, handler(live))
# (run, api, args, kwargs) -> the call's event in that run, or None (not recorded); may raise (counted)
Record = Callable[["RunRecord", str, tuple[Any, ...], dict[str, Any]], "LLMEvent | None"]
# (hook, event, the stream the call returned, async?): record its items as the host reads them; never raises
Follow = Callable[[HookPort, LLMEvent, Any, bool], None]


@dataclass(frozen=True)
class ClientSpec:
    """One client library: `name` (what `llm_clients` names), `targets()` (what to patch; called once the library
    is imported) and `lazy()` (its import watcher: `ready()`, `arm()`, `disarm()`), None when flowrl may import it."""

    name: str
    targets: Callable[[], list[Target]]
    lazy: Callable[[], Any] | None = None


_LOCK = _patch._LOCK  # one lock for every class patch of the process
# client -> the hooks that use its patch; `_HOOKS_OF[client]` is a tuple, replaced (never changed) under _LOCK
_HOOKS_OF: dict[str, tuple[Any, ...]] = {}
# client -> [(owner, attribute, wrapper)] while patched
_PATCHED: dict[str, list[tuple[type, str, Any]]] = {}
# the `grouping.CallCapture` that records the calls made outside any captured run, while one is active
_GROUPER: Any = None


# -- which clients ------------------------------------------------------------------------------


# client -> its spec, as the first hook to patch it gave it
_SPECS: dict[str, ClientSpec] = {}


def importable(client: str) -> bool:
    """Can the client library be imported here (without importing it)?"""
    try:
        return importlib.util.find_spec(client) is not None
    except (ImportError, ValueError):
        return False


# -- patching, reference-counted per client -----------------------------------------------------


def acquire(hook: HookPort, clients: list[ClientSpec]) -> list[str]:
    """Patch each client's SDK classes (once per process) for `hook`; returns what is patched
    ("openai.Completions.create", ...). Raises ImportError when a client cannot be imported. A lazy client
    (one with `lazy`: LiteLLM) not imported yet is patched when the host imports it ("litellm (once imported)")."""
    names: list[str] = []
    with _LOCK:
        for spec in clients:
            client = spec.name
            users = _HOOKS_OF.get(client, ())
            if hook in users:
                continue
            _SPECS[client] = spec
            lazy = spec.lazy() if spec.lazy is not None else None
            if client not in _PATCHED:
                if lazy is not None and not lazy.ready():
                    lazy.arm()
                    _HOOKS_OF[client] = (*users, hook)
                    names.append(f"{client} (once imported)")
                    continue
                _PATCHED[client] = _install(spec)
            _HOOKS_OF[client] = (*users, hook)
            names += [_name(owner, attr) for owner, attr, _ in _PATCHED[client]]
    return names


def _name(owner: Any, attr: str) -> str:
    if isinstance(owner, ModuleType):
        return f"{owner.__name__}.{attr}"
    return f"{owner.__module__.split('.')[0]}.{owner.__name__}.{attr}"


def install_waiting(spec: ClientSpec) -> None:
    """A lazy client was just imported: patch it for the hooks waiting for it. Never raises."""
    client = spec.name
    with _LOCK:
        users = _HOOKS_OF.get(client, ())
        if not users or client in _PATCHED:
            return
        try:
            _PATCHED[client] = _install(spec)
        except Exception as exc:
            for hook in users:
                hook.fail(f"patching {client}", exc)


def release(hook: HookPort) -> None:
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
            lazy = _SPECS[client].lazy
            if lazy is not None:
                try:
                    lazy().disarm()
                except Exception:  # pragma: no cover - defensive: disarm does not raise
                    pass
            for owner, attr, wrapper in _PATCHED.pop(client, ()):
                _restore(owner, attr, wrapper)


def patched(client: str) -> bool:
    """Is the client's SDK patched now?"""
    return client in _PATCHED


def _install(spec: ClientSpec) -> list[tuple[type, str, Any]]:
    done: list[tuple[type, str, Any]] = []
    try:
        for owner, attr, make in spec.targets():
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


def unattributed(client: str) -> None:
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


@dataclass(frozen=True, slots=True)
class ClientCall:
    """One kind of client call: its client's name, its `api` (the event's), how its event is made (`record`),
    how a stream it returns is followed (`follow`), and the names of its positional parameters (`positional`:
    the grouper sees a request by name)."""

    client: str
    api: str
    record: Record
    follow: Follow
    positional: tuple[str, ...] = ()


def call_handler(
    call: ClientCall, live: list[bool], *, is_async: bool = False, is_open: bool = False
) -> Callable[..., Any]:
    """The wrapper of one client function (sync, or async: it returns a coroutine): `begin` finds the run and
    makes the event; the call is timed (a coroutine, also one a sync function hands back, when it is awaited),
    its result or exception noted, and a stream's items followed (`call.follow`). `is_open`: the call is the
    open LLM call while it runs (`recorder.enter_llm`), so client calls made underneath attach to it."""
    follow = call.follow

    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not live[0]:
            return wrapped(*args, **kwargs)
        begun = begin(call, args, kwargs)
        if begun is None:
            return wrapped(*args, **kwargs)
        rec, ev = begun
        token = enter_llm(begun) if is_open and not is_async else None
        try:
            out = wrapped(*args, **kwargs)  # an async SDK checks its arguments here, before any await
        except BaseException as exc:
            note_exc(rec.hook, ev, exc)
            raise
        finally:
            if token is not None:
                leave_llm(token)
        if is_async or out.__class__ is CoroutineType:  # LiteLLM's completion(..., acompletion=True)
            return _awaited(rec, ev, out, follow, is_open)
        return returned(rec.hook, ev, out, follow, False)

    return handler


def begin(call: ClientCall, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[RunRecord, LLMEvent] | None:
    """The run and event a call is recorded into: the current run's; outside any run, its conversation's when
    calls are being grouped (`grouping.capture_llm_calls`). None: not recorded (a failure counted). Never
    raises."""
    frame = current_frame()
    api = call.api
    if frame is None:
        unattributed(call.client)
        grouping = _GROUPER
        if grouping is None:
            return None
        named = {**dict(zip(call.positional, args)), **kwargs} if args else kwargs
        return grouping.begin(api, named, lambda rec: call.record(rec, api, args, kwargs))
    rec = frame[0]
    try:
        ev = call.record(rec, api, args, kwargs)
    except Exception as exc:
        rec.hook.fail(f"{api}: recording a call", exc)
        return None
    return None if ev is None else (rec, ev)


async def _awaited(rec: RunRecord, ev: LLMEvent, coro: Any, follow: Follow, is_open: bool) -> Any:
    token = enter_llm((rec, ev)) if is_open else None
    try:
        out = await coro
    except BaseException as exc:
        note_exc(rec.hook, ev, exc)
        raise
    finally:
        if token is not None:
            leave_llm(token)
    return returned(rec.hook, ev, out, follow, True)


def returned(hook: HookPort, ev: LLMEvent, out: Any, follow: Follow, is_async: bool) -> Any:
    """A recorded call returned `out`: timed, kept, and, for a stream, its items followed. Returns `out`."""
    ev.duration = perf_counter() - ev.started
    ev.output = out
    if ev.chunks is not None:
        follow(hook, ev, out, is_async)
    return out


def set_grouper(grouper: Any) -> None:
    """The handle that groups the calls made outside any captured run (`grouping.CallCapture`), or None."""
    global _GROUPER
    _GROUPER = grouper


def grouper() -> Any:
    """The `grouping.CallCapture` active now (calls outside any captured run are grouped into it), or None."""
    return _GROUPER
