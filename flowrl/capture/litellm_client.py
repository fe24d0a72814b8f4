"""LLM-client capture: LiteLLM's `litellm.completion` / `litellm.acompletion`, recorded into the captured run they
are made in, the way `openai_client.py` records the OpenAI SDK's calls (with the machinery in `client_patch.py`,
the same events and readers).

    import litellm
    hook = hook_into_agent(agent, run_methods=["run"])   # llm_clients="auto": LiteLLM is patched too
    agent.run("...")   # every litellm.completion / await litellm.acompletion inside is one LLM call

What is patched: the `litellm` module's `completion` and `acompletion` (`stream=True` too), and
`CustomStreamWrapper.__next__`/`__anext__` (to see the chunks the host reads from a stream), once per process,
reference-counted with the other client patches (`client_patch.acquire`/`release`). flowrl never imports
LiteLLM (its import takes seconds): when it is not imported yet, a one-entry `sys.meta_path` finder waits for
the host to import it and patches it right after (then takes itself out). A name bound before the patch
(`from litellm import completion` before `hook_into_agent`, when litellm was already imported) keeps the
unpatched function.

One call, not two: while a recorded LiteLLM call runs, it is the open LLM call (`recorder.current_llm`), so
an OpenAI SDK call LiteLLM makes underneath (its Azure route goes through `chat.completions.create`) is
attached to it (`LLMEvent.inner`), and a LiteLLM call made inside it (a Router, a fallback) is not recorded
again. A LiteLLM call made inside a hooked LLM method is attached to that method's call.

The host's side per call: a shallow copy of `messages`, one `LLMEvent` (api "litellm.chat"), the call timed;
for a stream, the same `CustomStreamWrapper` is returned and each chunk the host reads (LiteLLM's own
`ModelResponseStream` object, unchanged) is appended to the event. Return values, exceptions and chunks pass
through unchanged; a failure while recording is counted (`capture_errors`) and the call goes on unrecorded.
The writer reads the events with `client_read.call_entry`/`seen_messages` (a `ModelResponse` has the chat
completion's shape; `tokens.py` reads its token ids).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from flowrl.capture import client_patch
from flowrl.capture.client_patch import ClientCall, ClientSpec, Target
from flowrl.capture.events import HookPort, LLMEvent
from flowrl.capture.recorder import current_llm, perf_counter

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.recorder import RunRecord

CHAT = "litellm.chat"
CLIENT = "litellm"
_POSITIONAL = ("model", "messages")  # litellm.completion(model, messages=[], ...)

# id(stream) -> (weak reference to a CustomStreamWrapper the host was handed, its event): the chunks it yields
_STREAMS: dict[int, tuple[Callable[[], Any], LLMEvent]] = {}


# -- what is patched ------------------------------------------------------------------------------------


def _module() -> ModuleType:
    module = sys.modules.get(CLIENT)
    if module is None:  # pragma: no cover - only called once it is imported
        raise ImportError("litellm is not imported")
    return module


def _stream_class(litellm: ModuleType) -> type | None:
    try:
        from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper

        return CustomStreamWrapper
    except ImportError:  # pragma: no cover - another layout: the top-level name
        found = getattr(litellm, "CustomStreamWrapper", None)
        return found if isinstance(found, type) else None


def targets() -> list[Target]:
    """(owner, attribute, handler factory) for LiteLLM; only called once `litellm` is imported."""
    litellm = _module()
    out: list[Target] = []
    if "completion" in vars(litellm):
        out.append((litellm, "completion", _sync_handler))
    if "acompletion" in vars(litellm):
        out.append((litellm, "acompletion", _async_handler))
    stream_cls = _stream_class(litellm)
    if stream_cls is not None:
        if "__next__" in vars(stream_cls):
            out.append((stream_cls, "__next__", _next_handler))
        if "__anext__" in vars(stream_cls):
            out.append((stream_cls, "__anext__", _anext_handler))
    if not out:
        raise ImportError("litellm has no completion/acompletion to patch")
    return out


# -- patching once LiteLLM is imported (flowrl never imports it) ------------------------------------------


class _Loader:
    """LiteLLM's own loader, telling flowrl once the module has run. The module keeps the original loader."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        except Exception:  # pragma: no cover - a module that refuses the attribute
            pass
        self._loader.exec_module(module)
        LAZY.disarm()
        client_patch.install_waiting(SPEC)


class _Lazy:
    """A `sys.meta_path` finder that answers nothing itself: for `litellm`, it asks the other finders and hands
    back their spec with its loader wrapped (`_Loader`). In `sys.meta_path` only while a hook waits."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def ready(self) -> bool:
        module = sys.modules.get(CLIENT)
        return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)

    def arm(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def disarm(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != CLIENT or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            self._busy.on = False
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module") or isinstance(loader, _Loader):
            return spec
        spec.loader = _Loader(loader)  # type: ignore[assignment]  # a Loader by its methods
        return spec

    def invalidate_caches(self) -> None:
        pass


LAZY = _Lazy()
SPEC = ClientSpec(CLIENT, targets, lambda: LAZY)  # what `flowrl.capture.clients` lists; flowrl never imports LiteLLM


# -- the host's side ----------------------------------------------------------------------------------


def record(rec: RunRecord, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LLMEvent | None:
    """The event of one LiteLLM call in run `rec`, or None: the run's hook does not capture LiteLLM, the run
    takes no more events, or this call is made inside a LiteLLM call already recorded (a Router's, a fallback)."""
    hook = rec.hook
    if CLIENT not in hook.llm_clients or not hook.active:
        return None
    open_llm = current_llm()
    if open_llm is not None and open_llm[1].api == CHAT and open_llm[1].duration is None:
        return None
    if args:
        kwargs = {**dict(zip(_POSITIONAL, args)), **kwargs}
    request = kwargs.get("messages")
    if request.__class__ is list:
        request = request[:]  # the host appends to its own list after the call: keep what was sent
    elif request is not None and not isinstance(request, tuple):
        request = None  # an iterable LiteLLM consumes: never iterated here
    stream = kwargs.get("stream") is True
    ev = LLMEvent(
        perf_counter(), kwargs, kwargs.get("model"), stream, None, None, None, None, None, None, CHAT, request,
        [] if stream else None,
    )  # fmt: skip
    return client_patch.attach(rec, ev)


def _record(rec: RunRecord, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LLMEvent | None:
    return record(rec, api, args, kwargs)  # `record` looked up per call: a test may replace it


def _sync_handler(live: list[bool]) -> Callable[..., Any]:
    # the open LLM call while it runs: an SDK call LiteLLM makes underneath attaches to this one
    return client_patch.call_handler(_CALL, live, is_open=True)


def _async_handler(live: list[bool]) -> Callable[..., Any]:
    return client_patch.call_handler(_CALL, live, is_async=True, is_open=True)


def _follow(hook: HookPort, ev: LLMEvent, out: Any, is_async: bool) -> None:
    try:  # a stream: its chunks are recorded as the host reads them (the patched __next__/__anext__)
        key = id(out)
        _STREAMS[key] = (weakref.ref(out, lambda _ref: _STREAMS.pop(key, None)), ev)
    except Exception as exc:  # not a CustomStreamWrapper that takes a weak reference: no answer to read
        ev.chunks = None
        hook.fail(f"{CHAT}: following a stream", exc)


_CALL = ClientCall(CLIENT, CHAT, _record, _follow, _POSITIONAL)


def _followed(instance: Any) -> LLMEvent | None:
    entry = _STREAMS.get(id(instance))
    if entry is None or entry[0]() is not instance:
        return None
    return entry[1]


def _next_handler(live: list[bool]) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ev = _followed(instance) if _STREAMS and live[0] else None
        if ev is None:
            return wrapped(*args, **kwargs)
        try:
            item = wrapped(*args, **kwargs)
        except BaseException:  # StopIteration too: the stream is done
            _ended(ev, id(instance))
            raise
        return _took(ev, item)

    return handler


def _anext_handler(live: list[bool]) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ev = _followed(instance) if _STREAMS and live[0] else None
        if ev is None:
            return wrapped(*args, **kwargs)
        return _anext(ev, id(instance), wrapped(*args, **kwargs))

    return handler


async def _anext(ev: LLMEvent, key: int, coro: Any) -> Any:
    try:
        item = await coro
    except BaseException:  # StopAsyncIteration too: the stream is done
        _ended(ev, key)
        raise
    return _took(ev, item)


def _took(ev: LLMEvent, item: Any) -> Any:
    """The host read chunk `item` of the stream of `ev`: kept, the call's time so far set. Returns `item`."""
    chunks = ev.chunks
    if chunks is not None:
        chunks.append(item)
    ev.duration = perf_counter() - ev.started
    return item


def _ended(ev: LLMEvent, key: int) -> None:
    ev.duration = perf_counter() - ev.started
    _STREAMS.pop(key, None)


__all__ = ["CHAT", "CLIENT", "LAZY", "record", "targets"]
