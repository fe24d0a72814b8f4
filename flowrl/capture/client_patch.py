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
from types import ModuleType
from typing import TYPE_CHECKING, Any

from flowrl.capture import _patch
from flowrl.capture.events import HookPort, LLMEvent
from flowrl.capture.recorder import current_llm

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.recorder import RunRecord

Target = tuple[Any, str, Callable[[list[bool]], Callable[..., Any]]]  # (owner, attribute, handler(live))


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


def set_grouper(grouper: Any) -> None:
    """The handle that groups the calls made outside any captured run (`grouping.CallCapture`), or None."""
    global _GROUPER
    _GROUPER = grouper


def grouper() -> Any:
    """The `grouping.CallCapture` active now (calls outside any captured run are grouped into it), or None."""
    return _GROUPER
