"""Class-level patches with an instance filter, the way OpenTelemetry instrumentors patch.

Each method is patched once, on the class that defines it, with a small dispatcher. The dispatcher
looks the receiver (or, for an engine, its `.agent`) up in `_HOOKS`; objects that are not hooked go
straight to the original method. Nothing is stored on the agent itself, so `copy.copy`,
`copy.deepcopy` and `pickle` of a hooked agent behave as before, and a copy is not captured.

Patches are reference-counted per (class, attribute): the last hook to let go puts the original
function back into the class `__dict__` (the same object as before). When another library wrapped the
method on top of flowrl's patch meanwhile, a wrapt wrapper directly above it is pointed at the original
function again (flowrl's patch spliced out of the chain, the other wrapper kept); a wrapper that cannot
be re-pointed (a plain `functools.wraps` closure holds flowrl's patch itself) keeps it, as a pass-through
that never dispatches again. That is logged once, as one warning line, and counted (`left_in_place()`);
nothing is raised. Either way, a released patch never dispatches again, whoever still holds it.

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
_LEFT_IN_PLACE: dict[str, int] = {}  # "module.Class.attr" -> released patches another wrapper still holds
_LOCK = threading.RLock()
_MAX_CHAIN = 64  # wrappers followed down from the class attribute when looking for flowrl's patch


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
        ref = (lambda a: lambda: a)(agent)
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

    def __init__(self, wrapped: Any, wrapper: Any, owner: type, live: list[bool]) -> None:
        super().__init__(wrapped, wrapper)
        self._self_flowrl_owner = owner
        self._self_flowrl_live = live  # the dispatcher's switch: [False] once released

    def _flowrl_retire(self) -> None:
        """From now on a plain pass-through to the original, whoever still holds this wrapper."""
        self._self_flowrl_live[0] = False

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


def _dispatcher(owner: type, attr: str, via: str | None, live: list[bool]) -> Callable[..., Any]:
    key = (via, attr)

    def dispatch(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if not live[0]:  # released: another wrapper may still call through us, but nothing is captured
            return wrapped(*args, **kwargs)
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
        live = [True]
        wrapper = _ClassWrapper(original, _dispatcher(owner, attr, via, live), owner, live)
        setattr(owner, attr, wrapper)
        _PATCHES[(owner, attr)] = [wrapper, 1]
        _refresh_shared()


def release(owner: type, attr: str) -> None:
    """One user fewer; the last one puts the original function back. Never raises."""
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
        wrapper._flowrl_retire()
        if vars(owner).get(attr) is wrapper:
            setattr(owner, attr, wrapper.__wrapped__)  # type: ignore[union-attr]  # wrapt's stub: Any | None
            return
        try:
            why = _splice_out(vars(owner).get(attr), wrapper)
        except Exception as exc:  # a wrapper that does not let itself be read or re-pointed
            why = f"{type(exc).__name__}: {exc}"
        if why:
            _left_in_place(owner, attr, why)


def _splice_out(top: Any, wrapper: _ClassWrapper) -> str:
    """Another library wrapped `owner.attr` on top of flowrl's `wrapper`: find `wrapper` under `top` (following
    `__wrapped__`) and point the wrapt wrapper just above it at the original function. Returns "" when done,
    else why not: `wrapper` is not found, or what sits just above it is not a wrapt proxy (a `functools.wraps`
    closure's `__wrapped__` is only metadata: setting it would change nothing)."""
    original = wrapper.__wrapped__
    above, current = None, top
    for _ in range(_MAX_CHAIN):
        if current is None:
            return "the method was replaced and flowrl's patch is not found under its __wrapped__ chain"
        # ours, or ours bound to the class (what `Class.attr` gave whoever wrapped it)
        if current is wrapper or (isinstance(current, _BoundWrapper) and current._self_parent is wrapper):
            break
        above, current = current, getattr(current, "__wrapped__", None)
    else:
        return f"more than {_MAX_CHAIN} wrappers on top of it"
    if above is None:
        return "the class holds flowrl's patch bound to the class, not the patch itself"
    if not isinstance(above, wrapt.BaseObjectProxy):
        return f"the wrapper just above it, a {type(above).__name__}, is not a wrapt wrapper (e.g. functools.wraps)"
    above.__wrapped__ = original
    return "" if above.__wrapped__ is original else f"the {type(above).__name__} above it kept its __wrapped__"


def _left_in_place(owner: type, attr: str, why: str) -> None:
    name = f"{owner.__module__}.{owner.__qualname__}.{attr}"
    _LEFT_IN_PLACE[name] = _LEFT_IN_PLACE.get(name, 0) + 1
    try:
        log.warning(
            "flowrl: %s was wrapped again on top of flowrl's patch and the patch could not be taken out (%s); "
            "it stays inside that wrapper as a pass-through and captures nothing",
            name,
            why,
        )
    except Exception:  # pragma: no cover - logging itself failed
        pass


def left_in_place() -> dict[str, int]:
    """Released patches that another library's wrapper still holds (inert pass-throughs), per method."""
    with _LOCK:
        return dict(_LEFT_IN_PLACE)
