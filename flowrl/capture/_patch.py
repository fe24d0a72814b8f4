"""Class-level patches with an instance filter, the way OpenTelemetry instrumentors patch.

Each method is patched once, on the class that defines it, with a small dispatcher. The dispatcher
looks the receiver (or, for an engine, its `.agent`) up in `_HOOKS`; objects that are not hooked go
straight to the original method. Nothing is stored on the agent itself, so `copy.copy`,
`copy.deepcopy` and `pickle` of a hooked agent behave as before, and a copy is not captured.

Patches are reference-counted per (class, attribute): the last hook to let go puts the original
function back into the class `__dict__` (the same object as before).

These registries are process-wide by nature: a class can only be patched once.
"""

from __future__ import annotations

import copy
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import wrapt

log = logging.getLogger("flowrl.capture")

Handler = Callable[[Any, Any, tuple, dict], Any]

# id(agent) -> (weak reference to the agent, its Hook)
_HOOKS: dict[int, tuple[Callable[[], Any], Any]] = {}
# (class, attribute) -> [wrapper, number of hooks using it]
_PATCHES: dict[tuple[type, str], list[Any]] = {}
_SHARED_NAMES: set[str] = set()  # attribute names patched on more than one class
_OWNERS: dict[tuple[type, str], type | None] = {}  # (class, name) -> class that defines it (cache)
_LOCK = threading.RLock()


def lookup(obj: Any) -> Any:
    """The active Hook of `obj`, or None. This runs on every call of a patched method."""
    entry = _HOOKS.get(id(obj))
    if entry is not None and entry[0]() is obj:
        return entry[1]
    return None


def register(agent: Any, hook: Any, on_gone: Callable[[], None]) -> None:
    def gone(_ref: Any, key: int = id(agent)) -> None:
        with _LOCK:
            current = _HOOKS.get(key)
            if current is not None and current[1] is hook:
                del _HOOKS[key]
        on_gone()

    try:
        ref: Callable[[], Any] = weakref.ref(agent, gone)
    except TypeError:  # no weak references (e.g. __slots__ without __weakref__): keep it alive until unhook
        ref = (lambda a: (lambda: a))(agent)
    with _LOCK:
        _HOOKS[id(agent)] = (ref, hook)


def unregister(agent_id: int, hook: Any) -> None:
    with _LOCK:
        current = _HOOKS.get(agent_id)
        if current is not None and current[1] is hook:
            del _HOOKS[agent_id]


# -- wrappers that still copy and pickle like the methods they replace ------------------------


class _BoundWrapper(wrapt.BoundFunctionWrapper):
    def __reduce_ex__(self, protocol: Any) -> Any:
        instance = self._self_instance
        if instance is None or isinstance(instance, type):
            return (getattr, (self._self_parent._self_flowrl_owner, self.__name__))
        return (getattr, (instance, self.__name__))

    def __copy__(self) -> Any:
        instance = self._self_instance
        if instance is None or isinstance(instance, type):
            return self
        return getattr(instance, self.__name__)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        instance = self._self_instance
        if instance is None or isinstance(instance, type):
            return self
        return getattr(copy.deepcopy(instance, memo), self.__name__)


class _ClassWrapper(wrapt.FunctionWrapper):
    __bound_function_wrapper__ = _BoundWrapper

    def __init__(self, wrapped: Any, wrapper: Any, owner: type) -> None:
        super().__init__(wrapped, wrapper)
        self._self_flowrl_owner = owner

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (getattr, (self._self_flowrl_owner, self.__name__))

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


def owner_of(cls: type, attr: str) -> type | None:
    """The class in `cls`'s MRO whose `__dict__` defines `attr`."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            return klass
    return None


def _dispatcher(owner: type, attr: str, via: str | None) -> Callable[..., Any]:
    key = (via, attr)

    def dispatch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        target = instance if via is None else getattr(instance, via, None)
        entry = _HOOKS.get(id(target))
        if entry is None or entry[0]() is not target:
            return wrapped(*args, **kwargs)
        # A subclass override and its base both patched: only the override records; its super() call
        # passes through here (checked only when the name is patched on more than one class).
        if attr in _SHARED_NAMES and _resolve(type(instance), attr) is not owner:
            return wrapped(*args, **kwargs)
        handler = entry[1].handlers.get(key)
        if handler is None:
            return wrapped(*args, **kwargs)
        return handler(wrapped, instance, args, kwargs)

    return dispatch


def _resolve(cls: type, attr: str) -> type | None:
    found = _OWNERS.get((cls, attr))
    if found is None:
        found = _OWNERS[(cls, attr)] = owner_of(cls, attr)
    return found


def _refresh_shared() -> None:
    names = [attr for (_owner, attr) in _PATCHES]
    _SHARED_NAMES.clear()
    _SHARED_NAMES.update(n for n in names if names.count(n) > 1)
    _OWNERS.clear()


def acquire(owner: type, attr: str, via: str | None) -> None:
    """Patch `owner.attr` (once) with a dispatcher; count one more user."""
    with _LOCK:
        entry = _PATCHES.get((owner, attr))
        if entry is not None:
            entry[1] += 1
            return
        original = vars(owner)[attr]
        if isinstance(original, (staticmethod, classmethod)):
            raise TypeError(f"{owner.__name__}.{attr} is a {type(original).__name__}, not a method")
        wrapper = _ClassWrapper(original, _dispatcher(owner, attr, via), owner)
        setattr(owner, attr, wrapper)
        _PATCHES[(owner, attr)] = [wrapper, 1]
        _refresh_shared()


def release(owner: type, attr: str) -> None:
    """One user fewer; the last one puts the original function back."""
    with _LOCK:
        entry = _PATCHES.get((owner, attr))
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _PATCHES[(owner, attr)]
        _refresh_shared()
        wrapper = entry[0]
        if vars(owner).get(attr) is wrapper:
            setattr(owner, attr, wrapper.__wrapped__)
            return
        try:  # someone wrapped it again on top of us (with wrapt): splice ours out of the chain
            wrapt.unwrap_object(owner, attr, wrapper, missing_ok=True)
        except Exception:
            log.warning("flowrl: could not remove the patch on %s.%s (another wrapper sits on top of it); "
                        "it stays as a pass-through", owner.__name__, attr, exc_info=True)


def patched(owner: type, attr: str) -> bool:
    return (owner, attr) in _PATCHES
