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

The writer thread (`assemble.py`) reads the events back with `call_entry` (one `llm_calls` entry) and
`seen_messages` (what the model saw: a call's request messages plus its response message, OpenAI chat
format). The Responses API's items are read into chat messages here: `instructions` is a system message,
`function_call` items are assistant tool calls, `function_call_output` items are tool messages.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from flowrl.capture import _patch
from flowrl.capture.events import LLMEvent
from flowrl.capture.recorder import current_frame, current_llm, note_exc, perf_counter
from flowrl.transcript import content_text, field_of, responses_messages, tool_call_parts

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.hook import Hook
    from flowrl.capture.recorder import RunRecord
    from flowrl.capture.values import Values

CHAT = "openai.chat"
RESPONSES = "openai.responses"
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


def _grouped(api: str, kwargs: dict[str, Any]) -> tuple[RunRecord, LLMEvent] | None:
    """A call outside any captured run: its conversation's run and its event when calls are being grouped
    (`grouping.capture_llm_calls`), else None (not recorded). Never raises."""
    grouper = _GROUPER
    if grouper is None:
        return None
    return grouper.begin(api, kwargs, lambda rec: record(rec, api, kwargs))


def _sync_handler(api: str, live: list[bool]) -> Callable[..., Any]:
    def handler(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not live[0]:
            return wrapped(*args, **kwargs)
        frame = current_frame()
        if frame is None:
            unattributed()
            begun = _grouped(api, kwargs)
            if begun is None:
                return wrapped(*args, **kwargs)
            rec, ev = begun
        else:
            rec = frame[0]
            try:
                got = record(rec, api, kwargs)
            except Exception as exc:
                rec.hook.fail(f"{api}: recording a call", exc)
                got = None
            if got is None:
                return wrapped(*args, **kwargs)
            ev = got
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
        frame = current_frame()
        if frame is None:
            unattributed()
            begun = _grouped(api, kwargs)
            if begun is None:
                return wrapped(*args, **kwargs)
            rec, ev = begun
        else:
            rec = frame[0]
            try:
                got = record(rec, api, kwargs)
            except Exception as exc:
                rec.hook.fail(f"{api}: recording a call", exc)
                got = None
            if got is None:
                return wrapped(*args, **kwargs)
            ev = got
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


# -- the writer's side: reading the events back ---------------------------------------------------


def _plain_response(out: Any) -> Any:
    """The response a call returned: the SDK object, or the JSON body of a raw response
    (`with_raw_response`, LiteLLM's route into the SDK) when its body has been read."""
    if out is None or field_of(out, "choices") is not None or field_of(out, "output") is not None:
        return out
    http = getattr(out, "http_response", None)
    if http is None:
        return out
    try:
        body = http.content  # raises when the body was not read: then there is nothing to read
        return json.loads(body) if isinstance(body, (bytes, str)) else None
    except Exception:
        return None


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    tin = field_of(usage, "prompt_tokens")
    tout = field_of(usage, "completion_tokens")
    if tin is None and tout is None:  # the Responses API's names
        tin, tout = field_of(usage, "input_tokens"), field_of(usage, "output_tokens")
    return (
        tin if isinstance(tin, int) and not isinstance(tin, bool) else None,
        tout if isinstance(tout, int) and not isinstance(tout, bool) else None,
    )


def _call_dict(call: Any) -> dict[str, Any]:
    name, args, call_id = tool_call_parts(call)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _chat_message(out: Any) -> dict[str, Any] | None:
    choices = field_of(out, "choices")
    if not isinstance(choices, (list, tuple)) or not choices:
        return None
    msg = field_of(choices[0], "message")
    if msg is None:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": field_of(msg, "content")}
    calls = field_of(msg, "tool_calls")
    if calls:
        message["tool_calls"] = [_call_dict(c) for c in calls]
    return message


def _chat_stream(chunks: list[Any]) -> tuple[dict[str, Any] | None, Any, Any]:
    """(assistant message, usage, model) of a chat completion stream, from the chunks the host read."""
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = model = None
    for chunk in chunks:
        model = field_of(chunk, "model") or model
        usage = field_of(chunk, "usage") or usage
        choices = field_of(chunk, "choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            continue
        delta = field_of(choices[0], "delta")
        if delta is None:
            continue
        text = field_of(delta, "content")
        if isinstance(text, str):
            texts.append(text)
        for part in field_of(delta, "tool_calls") or ():
            index = field_of(part, "index")
            call = calls.setdefault(
                index if isinstance(index, int) else len(calls), {"id": None, "name": "", "args": []}
            )
            call["id"] = field_of(part, "id") or call["id"]
            fn = field_of(part, "function")
            if fn is not None:
                call["name"] += field_of(fn, "name") or ""
                piece = field_of(fn, "arguments")
                if isinstance(piece, str):
                    call["args"].append(piece)
    if not texts and not calls:
        return None, usage, model
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "".join(c["args"])}}
            for _, c in sorted(calls.items())
        ]
    return message, usage, model


def _responses_message(out: Any) -> dict[str, Any] | None:
    items = field_of(out, "output")
    if not isinstance(items, (list, tuple)) or not items:
        return None
    found = [m for m in responses_messages(None, items) if m.get("role") == "assistant"]
    if not found:
        return None
    message = found[0]
    for extra in found[1:]:
        message["content"] = content_text(message.get("content")) + content_text(extra.get("content")) or None
        message.setdefault("tool_calls", []).extend(extra.get("tool_calls") or [])
    return message


def _responses_stream(chunks: list[Any]) -> tuple[Any, str | None]:
    """(the final Response object, else None; the text deltas read) of a Responses stream."""
    final = None
    texts: list[str] = []
    for event in chunks:
        kind = field_of(event, "type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = field_of(event, "response")
        elif kind == "response.output_text.delta":
            delta = field_of(event, "delta")
            if isinstance(delta, str):
                texts.append(delta)
    return final, ("".join(texts) if texts else None)


def read_call(ev: LLMEvent) -> tuple[dict[str, Any] | None, Any, Any, Any]:
    """(response message, usage, served model, the response object to read token ids from) of a client event."""
    if ev.api == RESPONSES:
        out = ev.output
        if ev.chunks is not None:
            out, text = _responses_stream(list(ev.chunks))
            if out is None:
                return ({"role": "assistant", "content": text} if text else None), None, None, None
        out = _plain_response(out)
        return _responses_message(out), field_of(out, "usage"), field_of(out, "model"), None
    if ev.chunks is not None:
        message, usage, model = _chat_stream(list(ev.chunks))
        return message, usage, model, None  # a stream's chunks each hold only their own ids
    out = _plain_response(ev.output)
    if out is None:
        return None, None, None, None
    return _chat_message(out), field_of(out, "usage"), field_of(out, "model"), out


def request_messages(ev: LLMEvent) -> list[Any] | None:
    """What the call sent, as chat messages (None when the request was not a list the host handed over)."""
    request = ev.request
    if ev.api == RESPONSES:
        if request is None and not ev.kwargs.get("instructions"):
            return None
        return responses_messages(ev.kwargs.get("instructions"), request)
    return list(request) if isinstance(request, (list, tuple)) else None


def seen_messages(ev: LLMEvent, earlier: Sequence[LLMEvent] = ()) -> list[Any] | None:
    """What the model saw and said in this call: its request messages plus its response message. A Responses
    call that continues a conversation kept on the server (`previous_response_id`) is preceded by what that
    earlier response saw and said, when the earlier call is among `earlier` (the run's client calls before it);
    its own `instructions` replace the earlier ones, as the server does."""
    messages = request_messages(ev)
    if messages is None:
        return None
    previous = ev.kwargs.get("previous_response_id") if ev.api == RESPONSES else None
    if isinstance(previous, str) and previous:
        before = [e for e in earlier if e is not ev]
        found = next((e for e in reversed(before) if _response_id(e) == previous), None)
        if found is not None:
            chain = seen_messages(found, before[: before.index(found)]) or []
            if ev.kwargs.get("instructions"):
                chain = [m for m in chain if not (isinstance(m, dict) and m.get("role") == "system")]
                messages = [messages[0], *chain, *messages[1:]]
            else:
                messages = [*chain, *messages]
    message = read_call(ev)[0]
    return messages if message is None else [*messages, message]


def _response_id(ev: LLMEvent) -> str | None:
    """The id of the response a Responses call got (its streamed final response's, for a stream)."""
    if ev.api != RESPONSES:
        return None
    out = _responses_stream(list(ev.chunks))[0] if ev.chunks is not None else _plain_response(ev.output)
    rid = field_of(out, "id") if out is not None else None
    return rid if isinstance(rid, str) else None


def call_entry(ev: LLMEvent, v: Values) -> dict[str, Any]:
    """The `llm_calls` entry of a client event."""
    from flowrl.capture.tokens import stream_token_info, token_info

    message, usage, served, out = read_call(ev)
    tokens_in, tokens_out = _usage(usage)
    model = served or ev.model
    entry: dict[str, Any] = {
        "model": None if model is None else v.text(model),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "latency_ms": None if ev.duration is None else round(ev.duration * 1000.0, 3),
        "output": None,
        "stream": bool(ev.stream),
        "api": ev.api,
    }
    if message is not None:
        content = message.get("content")
        entry["output"] = None if content is None else v.text(content_text(content))
        calls = message.get("tool_calls")
        if calls:
            entry["tool_calls"] = [
                {
                    "id": None if c["id"] is None else v.text(c["id"]),
                    "type": "function",
                    "function": {
                        "name": v.text(c["function"]["name"]),
                        "arguments": v.text(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
    request = ev.request
    if isinstance(request, (list, tuple)) and ev.api != RESPONSES:  # a chat request: the SDK's or LiteLLM's
        entry["prompt_messages"] = len(request)
    if ev.error:
        entry["error"] = v.text(ev.error)
    if out is not None:
        tokens = token_info(out)
    elif ev.chunks and ev.api != RESPONSES:  # a streamed chat completion: its chunks' ids, in order
        tokens = stream_token_info(list(ev.chunks))
    else:
        tokens = None
    if tokens is not None:
        entry.update(tokens.fields())
    return entry


def merged_entry(method_entry: dict[str, Any], inner: list[LLMEvent], v: Values) -> dict[str, Any]:
    """A hooked LLM method's entry with the client call(s) made inside it: the method's own figures stand
    (its latency covers the whole method; its token counts, cost and output where it has them); the client
    call (the last one that did not fail) adds what the method lacks, the token ids and its `api`."""
    ev = next((e for e in reversed(inner) if not e.error), inner[-1])
    client = call_entry(ev, v)
    out = dict(method_entry)
    for key, value in client.items():
        if key == "latency_ms" or value is None:
            continue
        if out.get(key) is None or key not in out:
            out[key] = value
    if len(inner) > 1:
        out["client_calls"] = len(inner)
    return out


def client_events(ev: LLMEvent) -> list[LLMEvent]:
    """The client events an LLM event stands for: itself when it is one, else the ones attached to it."""
    if ev.api is not None:
        return [ev]
    return list(ev.inner or ())


def tools_of(ev: LLMEvent) -> list[Any]:
    """The tools a client call offered, in the chat shape (a Responses function tool is flat)."""
    tools = ev.kwargs.get("tools") if isinstance(ev.kwargs, Mapping) else None
    if not isinstance(tools, (list, tuple)):
        return []
    out = []
    for tool in tools:
        if (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and "function" not in tool
            and isinstance(tool.get("name"), str)
        ):
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": fn})
        else:
            out.append(tool)
    return out


__all__ = [
    "CHAT",
    "CLIENTS",
    "RESPONSES",
    "acquire",
    "attach",
    "auto_clients",
    "call_entry",
    "client_events",
    "importable",
    "install_waiting",
    "merged_entry",
    "patched",
    "release",
    "request_messages",
    "seen_messages",
    "set_grouper",
    "tools_of",
    "unattributed",
]
