"""LLM-client capture: LiteLLM's `completion`/`acompletion` inside a hooked agent's runs (`litellm_client.py`).

No network: LiteLLM is pointed at a small OpenAI-compatible server on 127.0.0.1 (`model="openai/..."`, and
`model="azure/..."`, whose route goes through the OpenAI SDK's `chat.completions.create`), its cost map is
read from the package (`LITELLM_LOCAL_MODEL_COST_MAP`), and every test refuses a connection to any other host.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map fetched at import
_REAL_CONNECT = socket.socket.connect
_OUTBOUND: list[Any] = []


def _local_only(self: socket.socket, address: Any) -> Any:
    host = address[0] if isinstance(address, tuple) else address
    if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
        _OUTBOUND.append(address)
        raise OSError(f"test_capture_litellm: no network ({address!r})")
    return _REAL_CONNECT(self, address)


socket.socket.connect = _local_only  # type: ignore[method-assign]  # while LiteLLM is imported
try:
    litellm = pytest.importorskip("litellm")
finally:
    socket.socket.connect = _REAL_CONNECT  # type: ignore[method-assign]

from flowrl.capture import client_patch, hook_into_agent  # noqa: E402
from flowrl.capture import litellm_client as lc  # noqa: E402
from flowrl.trace.transcript import canonical_messages  # noqa: E402
from tests.fakes import flushed  # noqa: E402
from tests.test_capture_openai import FINAL, TOOLS, _chat_chunks, _chat_reply  # noqa: E402


class _Server:
    """Chat completions on any path ending in /chat/completions (the query string, Azure's api-version, aside)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                path = self.path.split("?")[0]
                server.requests.append((path, body))
                if not path.endswith("/chat/completions") or "/nowhere" in path:
                    return self._send(json.dumps({"error": {"message": "no such path"}}), "application/json", 404)
                if body.get("stream"):
                    items = [*_chat_chunks(body), "[DONE]"]
                    sse = "".join(f"data: {i if isinstance(i, str) else json.dumps(i)}\n\n" for i in items)
                    return self._send(sse, "text/event-stream")
                self._send(json.dumps(_chat_reply(body)), "application/json")

            def _send(self, text: str, kind: str, status: int = 200) -> None:
                raw = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def last(self) -> dict[str, Any]:
        return self.requests[-1][1]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _OUTBOUND.clear()
    monkeypatch.setattr(socket.socket, "connect", _local_only)
    yield
    assert _OUTBOUND == [], f"a connection to another host was tried: {_OUTBOUND}"


def _kw(server: _Server, azure: bool = False) -> dict[str, Any]:
    if azure:  # LiteLLM's Azure route calls the OpenAI SDK's chat.completions.create underneath
        return {"model": "azure/fake-deploy", "api_base": server.url, "api_key": "x", "api_version": "2024-06-01"}
    return {"model": "openai/fake-model", "api_base": server.url, "api_key": "sk-test-not-a-real-key"}


def _sent(server: _Server) -> list[dict[str, Any]]:
    """The last request's messages as the trace holds them: the host's messages as LiteLLM got them (LiteLLM
    leaves out an assistant message's `content: None` when it sends them on: the same message)."""
    messages = canonical_messages(server.last()["messages"])
    for m in messages:
        if m.get("role") == "assistant" and "content" not in m:
            m["content"] = None
    return messages


def _add(a: float, b: float) -> str:
    return str(a + b)


def _call_dicts(calls: Any) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in calls or ()
    ]


class LiteAgent:
    """An agent on plain LiteLLM: ask, run the tool it asks for, send the result, until an answer."""

    def __init__(self, kw: dict[str, Any], stream: bool = False) -> None:
        self.kw = kw
        self.stream = stream
        self.seen_chunks: list[Any] = []

    def run(self, query: str) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": query},
        ]
        for _ in range(5):
            content, calls = self._ask(messages)
            if not calls:
                return str(content)
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            for call in calls:
                args = json.loads(call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": _add(**args)})
        return "gave up"

    def _ask(self, messages: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
        if not self.stream:
            msg = litellm.completion(messages=messages, tools=TOOLS, **self.kw).choices[0].message
            return msg.content, _call_dicts(msg.tool_calls)
        stream = litellm.completion(
            messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}, **self.kw
        )
        assert isinstance(stream, litellm.CustomStreamWrapper)
        text, calls = "", {}
        for chunk in stream:
            self.seen_chunks.append(chunk)
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for tc in delta.tool_calls or ():
                c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
        found = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()
        ]
        return text, found


class AsyncLiteAgent:
    def __init__(self, kw: dict[str, Any], stream: bool = False) -> None:
        self.kw = kw
        self.stream = stream
        self.seen_chunks: list[Any] = []

    async def _ask(self, messages: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
        if not self.stream:
            msg = (await litellm.acompletion(messages=messages, tools=TOOLS, **self.kw)).choices[0].message
            return msg.content, _call_dicts(msg.tool_calls)
        stream = await litellm.acompletion(messages=messages, tools=TOOLS, stream=True, **self.kw)
        text, calls = "", {}
        async for chunk in stream:
            self.seen_chunks.append(chunk)
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for tc in delta.tool_calls or ():
                c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
        return text, [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()
        ]

    async def a_run(self, query: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
        content, calls = await self._ask(messages)
        messages.append({"role": "assistant", "content": content or None, "tool_calls": calls})
        args = json.loads(calls[0]["function"]["arguments"])
        messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": _add(**args)})
        content, _ = await self._ask(messages)
        return str(content)


# -- the done-when case -------------------------------------------------------------------------------


def test_litellm_agent_yields_what_the_model_saw(tmp_path, server) -> None:
    agent = LiteAgent(_kw(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert "litellm.completion" in hook.methods
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert trace["messages"] == _sent(server) + [{"role": "assistant", "content": FINAL}]
    assert [m["role"] for m in trace["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert trace["metadata"]["transcript"] == "llm_client"
    (call,) = trace["tool_calls"]
    assert (call["tool_name"], call["arguments"], call["result"], call["call_id"], call["success"]) == (
        "add",
        {"a": 2, "b": 3},
        "5",
        "call_add_1",
        True,
    )
    first, second = trace["llm_calls"]
    assert (first["tokens_in"], first["tokens_out"], second["tokens_in"]) == (20, 7, 40)
    assert first["model"] == "fake-model-served" and first["api"] == "litellm.chat"
    assert first["tool_calls"][0]["function"]["name"] == "add" and second["output"] == FINAL
    assert (first["prompt_messages"], second["prompt_messages"]) == (2, 4)
    assert trace["total_tokens_in"] == 60 and trace["llm_calls_count"] == 2
    assert [t["function"]["name"] for t in trace["tools"]] == ["add"]
    assert trace["final_response"] == FINAL and hook.stats.capture_errors == 0


def test_async_acompletion(tmp_path, server) -> None:
    agent = AsyncLiteAgent(_kw(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"]) as hook:
        assert asyncio.run(agent.a_run("add 2 and 3")) == FINAL
        (trace,) = flushed(hook)
    assert trace["messages"] == _sent(server) + [{"role": "assistant", "content": FINAL}]
    assert [c["api"] for c in trace["llm_calls"]] == ["litellm.chat", "litellm.chat"]
    assert trace["tool_calls"][0]["result"] == "5" and hook.stats.capture_errors == 0


def _dumps(chunks: list[Any]) -> list[Any]:
    return [c.model_dump(exclude={"created", "id"}) for c in chunks]


def test_streaming_host_gets_every_chunk_unchanged(tmp_path, server) -> None:
    bare = LiteAgent(_kw(server), stream=True)
    assert bare.run("What is 2 + 3?") == FINAL  # unhooked: the reference
    agent = LiteAgent(_kw(server), stream=True)
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert [type(c) for c in agent.seen_chunks] == [type(c) for c in bare.seen_chunks]
    assert _dumps(agent.seen_chunks) == _dumps(bare.seen_chunks)
    assert trace["messages"] == _sent(server) + [{"role": "assistant", "content": FINAL}]
    first, second = trace["llm_calls"]
    assert first["stream"] and first["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert (first["tokens_in"], first["tokens_out"], second["output"]) == (11, 5, FINAL)


def test_async_streaming(tmp_path, server) -> None:
    bare = AsyncLiteAgent(_kw(server), stream=True)
    assert asyncio.run(bare.a_run("add")) == FINAL
    agent = AsyncLiteAgent(_kw(server), stream=True)
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"]) as hook:
        assert asyncio.run(agent.a_run("add")) == FINAL
        (trace,) = flushed(hook)
    assert _dumps(agent.seen_chunks) == _dumps(bare.seen_chunks)
    first, second = trace["llm_calls"]
    assert first["stream"] and first["tool_calls"][0]["function"]["name"] == "add" and second["output"] == FINAL
    assert trace["messages"][-1] == {"role": "assistant", "content": FINAL}


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_through_the_openai_sdk_is_one_call(tmp_path, server, stream) -> None:
    from openai.resources.chat.completions import Completions

    through_sdk: list[int] = []
    agent = LiteAgent(_kw(server, azure=True), stream=stream)
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert client_patch.patched("openai") and client_patch.patched("litellm")
        patch = vars(Completions)["create"]
        sdk_create = patch.__wrapped__

        def spy(*args: Any, **kwargs: Any) -> Any:
            through_sdk.append(1)
            return sdk_create(*args, **kwargs)

        patch.__wrapped__ = spy  # count the SDK calls LiteLLM makes (under flowrl's patch)
        try:
            assert agent.run("What is 2 + 3?") == FINAL
        finally:
            patch.__wrapped__ = sdk_create
        (trace,) = flushed(hook)
    if not stream:  # (this LiteLLM streams from Azure without `create`: then there is only its own call)
        assert len(through_sdk) == 2  # LiteLLM went through the patched SDK, twice
    assert [c["api"] for c in trace["llm_calls"]] == ["litellm.chat", "litellm.chat"]  # two calls, not four
    assert trace["llm_calls"][0]["tool_calls"][0]["function"]["name"] == "add"
    assert trace["messages"][-1] == {"role": "assistant", "content": FINAL}
    assert trace["tool_calls"][0]["result"] == "5" and hook.stats.capture_errors == 0


def test_async_litellm_through_the_sdk_is_one_call(tmp_path, server) -> None:
    agent = AsyncLiteAgent(_kw(server, azure=True))
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"]) as hook:
        assert asyncio.run(agent.a_run("What is 2 + 3?")) == FINAL
        (trace,) = flushed(hook)
    assert [c["api"] for c in trace["llm_calls"]] == ["litellm.chat", "litellm.chat"]
    assert trace["messages"][-1] == {"role": "assistant", "content": FINAL}


def test_call_outside_a_run_is_not_recorded(tmp_path, server) -> None:
    agent = LiteAgent(_kw(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_clients=["litellm"]) as hook:
        litellm.completion(messages=[{"role": "user", "content": "outside"}], **_kw(server))
        assert hook.flush(5)
        assert hook.stats.unattributed == 1 and hook.stats.captured == 0
        agent.run("inside")
        (trace,) = flushed(hook)
    assert len(trace["llm_calls"]) == 2


def test_host_exception_passes_through(tmp_path, server) -> None:
    class Bad:
        def run(self, query: str) -> Any:
            kw = {**_kw(server), "api_base": server.url.replace("/v1", "/nowhere")}
            return litellm.completion(messages=[{"role": "user", "content": query}], num_retries=0, **kw)

    agent = Bad()
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        with pytest.raises(litellm.exceptions.NotFoundError):
            agent.run("hi")
        (trace,) = flushed(hook)
    assert "NotFoundError" in trace["llm_calls"][0]["error"] and trace["status"] == "error"


def test_a_failure_while_recording_leaves_the_host_alone(tmp_path, server, monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("flowrl bug")

    agent = LiteAgent(_kw(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        monkeypatch.setattr(lc, "record", broken)
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert hook.stats.capture_errors == 2 and trace["llm_calls"] == []


def test_unhook_restores_litellms_functions(tmp_path, server) -> None:
    from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper

    before = (vars(litellm)["completion"], vars(litellm)["acompletion"], vars(CustomStreamWrapper)["__next__"])
    a, b = LiteAgent(_kw(server)), LiteAgent(_kw(server))
    hook_a = hook_into_agent(a, store=tmp_path / "a", run_methods=["run"])
    patch = vars(litellm)["completion"]
    assert patch is not before[0] and client_patch.patched("litellm")
    hook_b = hook_into_agent(b, store=tmp_path / "b", run_methods=["run"], llm_clients=["litellm"])
    assert vars(litellm)["completion"] is patch  # one patch, two users
    hook_a.unhook()
    assert vars(litellm)["completion"] is patch
    b.run("What is 2 + 3?")
    assert len(flushed(hook_b)) == 1
    hook_b.unhook()
    after = (vars(litellm)["completion"], vars(litellm)["acompletion"], vars(CustomStreamWrapper)["__next__"])
    assert after == before and all(x is y for x, y in zip(after, before, strict=True))  # the same objects
    assert not client_patch.patched("litellm")
    assert a.run("What is 2 + 3?") == FINAL  # unhooked: nothing recorded, nothing raised


def test_llm_clients_openai_only_leaves_litellm_alone(tmp_path, server) -> None:
    agent = LiteAgent(_kw(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_clients=["openai"]) as hook:
        assert not client_patch.patched("litellm")
        agent.run("What is 2 + 3?")
        (trace,) = flushed(hook)
    assert trace["llm_calls"] == [] and trace["metadata"]["transcript"] == "synthesized"


class MethodAgent:
    """An agent with its own LLM method (hooked by name) that calls LiteLLM: one LLM call, not two."""

    def __init__(self, kw: dict[str, Any]) -> None:
        self.kw = kw

    def complete(self, messages: list[dict[str, Any]]) -> Any:
        return litellm.completion(messages=messages, tools=TOOLS, **self.kw)

    def run(self, query: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
        calls = _call_dicts(self.complete(messages).choices[0].message.tool_calls)
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"})
        return str(self.complete(messages).choices[0].message.content)


def test_litellm_inside_a_hooked_llm_method_is_one_call(tmp_path, server) -> None:
    agent = MethodAgent(_kw(server, azure=True))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_methods=["complete"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    first, second = trace["llm_calls"]
    assert (first["tokens_in"], second["tokens_in"], first["api"]) == (10, 30, "litellm.chat")
    assert trace["messages"][-1] == {"role": "assistant", "content": FINAL}


def test_litellm_patched_once_the_host_imports_it(tmp_path, server, monkeypatch) -> None:
    """Not imported when the agent is hooked: flowrl does not import it, and patches it on the host's import."""
    import importlib.util
    import sys

    from flowrl.capture import litellm_client

    saved = {name: mod for name, mod in sys.modules.items() if name == "litellm"}
    monkeypatch.delitem(sys.modules, "litellm")
    agent = LiteAgent(_kw(server))
    try:
        with hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_clients=["litellm"]) as hook:
            assert "litellm (once imported)" in hook.methods and "litellm" not in sys.modules
            assert litellm_client.LAZY in sys.meta_path and not client_patch.patched("litellm")
            # what the host's `import litellm` runs (the package itself is not run again here: its loader is
            # LiteLLM's own, wrapped; we give it the already-built module back)
            spec = importlib.util.find_spec("litellm")
            assert spec is not None and isinstance(spec.loader, litellm_client._Loader)
            sys.modules["litellm"] = saved["litellm"]
            inner = spec.loader._loader
            monkeypatch.setattr(inner, "exec_module", lambda module: None, raising=False)
            spec.loader.exec_module(saved["litellm"])
            assert client_patch.patched("litellm") and litellm_client.LAZY not in sys.meta_path
            assert agent.run("What is 2 + 3?") == FINAL
            (trace,) = flushed(hook)
        assert [c["api"] for c in trace["llm_calls"]] == ["litellm.chat", "litellm.chat"]
        assert not client_patch.patched("litellm")
    finally:
        sys.modules["litellm"] = saved["litellm"]
        litellm_client.LAZY.disarm()
