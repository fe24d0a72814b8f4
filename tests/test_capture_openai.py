"""LLM-client capture: the OpenAI SDK's calls inside a hooked agent's runs (`flowrl/capture/openai_client.py`).

No network: a small OpenAI-compatible server on 127.0.0.1 answers chat completions (a tool call, then the final
answer once a tool result is in the request; SSE when `stream` is set) and the Responses API.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from flowrl.capture import client_patch, hook_into_agent  # noqa: E402
from flowrl.capture import openai_client as oc  # noqa: E402
from flowrl.trace.transcript import canonical_messages  # noqa: E402
from tests.fakes import flushed  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]
FINAL = "The sum is 5."


# -- the fake server ------------------------------------------------------------------------------------


class _Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                server.requests.append((self.path, body))
                if not self.path.startswith("/v1/"):
                    return self._json({"error": {"message": "no such path", "type": "not_found"}}, 404)
                if self.path.endswith("/chat/completions"):
                    if body.get("stream"):
                        return self._sse([*_chat_chunks(body), "[DONE]"])
                    return self._json(_chat_reply(body))
                if self.path.endswith("/responses"):
                    if body.get("stream"):
                        return self._sse(_responses_events(body), named=True)
                    return self._json(_responses_reply(body))
                self._json({"error": {"message": "no such path"}}, 404)

            def _json(self, data: Any, status: int = 200) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _sse(self, items: list[Any], named: bool = False) -> None:
                parts = []
                for item in items:
                    data = item if isinstance(item, str) else json.dumps(item)
                    head = f"event: {item['type']}\n" if named and isinstance(item, dict) else ""
                    parts.append(f"{head}data: {data}\n\n")
                raw = "".join(parts).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def last(self, suffix: str) -> dict[str, Any]:
        return next(body for path, body in reversed(self.requests) if path.endswith(suffix))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _answered(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" for m in messages)


def _chat_reply(body: dict[str, Any]) -> dict[str, Any]:
    n = len(body["messages"])
    if _answered(body["messages"]):
        message: dict[str, Any] = {"role": "assistant", "content": FINAL}
        finish = "stop"
    else:
        call = {"id": "call_add_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model-served",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 10 * n, "completion_tokens": 7, "total_tokens": 10 * n + 7},
    }


def _chat_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "fake-model-served"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    if _answered(body["messages"]):
        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": piece}) for piece in ("The sum ", "is ", "5.")]
        out.append(chunk({}, "stop"))
    else:
        out = [
            chunk(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_add_1",
                            "type": "function",
                            "function": {"name": "add", "arguments": ""},
                        }
                    ],
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 2, '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"b": 3}'}}]}),
            chunk({}, "tool_calls"),
        ]
    out.append({**base, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}})
    return out


def _responses_reply(body: dict[str, Any]) -> dict[str, Any]:
    items = body.get("input")
    answered = isinstance(items, list) and any(i.get("type") == "function_call_output" for i in items)
    if answered:
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": FINAL, "annotations": []}],
            }
        ]
    else:
        output = [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_r1",
                "name": "add",
                "arguments": '{"a": 2, "b": 3}',
                "status": "completed",
            }
        ]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "fake-model-served",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 21,
            "output_tokens": 4,
            "total_tokens": 25,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _responses_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    final = _responses_reply(body)
    return [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {**final, "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": FINAL,
            "logprobs": [],
        },
        {"type": "response.completed", "sequence_number": 2, "response": final},
    ]


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


def _client(server: _Server, cls: Any = None) -> Any:
    return (cls or openai.OpenAI)(base_url=server.url, api_key="sk-test-not-a-real-key", max_retries=0)


# -- the agents ---------------------------------------------------------------------------------------


def _add(a: float, b: float) -> str:
    return str(a + b)


class PlainAgent:
    """An agent on the plain OpenAI SDK: ask, run the tool it asks for, send the result, until an answer."""

    def __init__(self, client: Any, stream: bool = False) -> None:
        self.client = client
        self.stream = stream
        self.seen_chunks: list[Any] = []

    def run(self, query: str) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": query},
        ]
        for _ in range(5):
            msg = self._ask(messages)
            if not msg["tool_calls"]:
                return str(msg["content"])
            messages.append({"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]})
            for call in msg["tool_calls"]:
                args = json.loads(call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": _add(**args)})
        return "gave up"

    def _ask(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.stream:
            resp = self.client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
            m = resp.choices[0].message
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in m.tool_calls or ()
            ]
            return {"content": m.content, "tool_calls": calls}
        stream = self.client.chat.completions.create(
            model="fake-model", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
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
        return {
            "content": text,
            "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls.values()
            ],
        }


class AsyncAgent:
    def __init__(self, client: Any) -> None:
        self.client = client

    async def a_run(self, query: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
        resp = await self.client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        call = resp.choices[0].message.tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]})
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": _add(**json.loads(call.function.arguments))}
        )
        resp = await self.client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        return str(resp.choices[0].message.content)


class ResponsesAgent:
    def __init__(self, client: Any, stream: bool = False) -> None:
        self.client = client
        self.stream = stream

    def run(self, query: str) -> str:
        items: list[Any] = [{"role": "user", "content": query}]
        tools = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]
        resp = self.client.responses.create(model="fake-model", instructions="Add.", input=items, tools=tools)
        call = resp.output[0]
        items += [
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": _add(**json.loads(call.arguments))},
        ]
        if self.stream:
            events = list(self.client.responses.create(model="fake-model", input=items, tools=tools, stream=True))
            return str(events[-1].response.output_text)
        resp = self.client.responses.create(model="fake-model", instructions="Add.", input=items, tools=tools)
        return str(resp.output_text)


# -- the done-when case -------------------------------------------------------------------------------


def test_plain_sdk_agent_yields_what_the_model_saw(tmp_path, server) -> None:
    agent = PlainAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    sent = server.last("/chat/completions")["messages"]
    assert trace["messages"] == canonical_messages(sent) + [{"role": "assistant", "content": FINAL}]
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
    assert first["model"] == "fake-model-served" and first["api"] == "openai.chat"
    assert first["tool_calls"][0]["function"]["name"] == "add" and second["output"] == FINAL
    assert (first["prompt_messages"], second["prompt_messages"]) == (2, 4)
    assert trace["total_tokens_in"] == 60 and trace["llm_calls_count"] == 2
    assert [t["function"]["name"] for t in trace["tools"]] == ["add"]
    assert trace["final_response"] == FINAL and trace["user_query"] == "What is 2 + 3?"
    assert hook.stats.capture_errors == 0


def test_async_client(tmp_path, server) -> None:
    agent = AsyncAgent(_client(server, openai.AsyncOpenAI))
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"]) as hook:
        assert asyncio.run(agent.a_run("add 2 and 3")) == FINAL
        (trace,) = flushed(hook)
    sent = server.last("/chat/completions")["messages"]
    assert trace["messages"] == canonical_messages(sent) + [{"role": "assistant", "content": FINAL}]
    assert len(trace["llm_calls"]) == 2 and trace["tool_calls"][0]["result"] == "5"


def test_streaming_host_gets_every_chunk_unchanged(tmp_path, server) -> None:
    bare = PlainAgent(_client(server), stream=True)
    assert bare.run("What is 2 + 3?") == FINAL  # unhooked: the reference
    agent = PlainAgent(_client(server), stream=True)
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert [type(c) for c in agent.seen_chunks] == [type(c) for c in bare.seen_chunks]
    assert [c.model_dump() for c in agent.seen_chunks] == [c.model_dump() for c in bare.seen_chunks]
    sent = server.last("/chat/completions")["messages"]
    assert trace["messages"] == canonical_messages(sent) + [{"role": "assistant", "content": FINAL}]
    first, second = trace["llm_calls"]
    assert first["stream"] and first["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert (first["tokens_in"], first["tokens_out"], second["output"]) == (11, 5, FINAL)


def test_stream_object_is_the_sdks_own(tmp_path, server) -> None:
    class One:
        def __init__(self, client: Any) -> None:
            self.client = client

        def run(self, query: str) -> Any:
            return self.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": query}], stream=True
            )

    agent = One(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        stream = agent.run("hi")
        assert isinstance(stream, openai.Stream)
        chunks = list(stream)  # read after the run ended: still the SDK's chunks, still recorded
        assert chunks and all(type(c).__name__ == "ChatCompletionChunk" for c in chunks)
        (trace,) = flushed(hook)
    assert trace["llm_calls"][0]["tool_calls"][0]["function"]["name"] == "add"


def test_responses_api(tmp_path, server) -> None:
    agent = ResponsesAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert trace["messages"] == [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_r1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_r1", "content": "5"},
        {"role": "assistant", "content": FINAL},
    ]
    assert trace["metadata"]["transcript"] == "llm_client"
    assert trace["tool_calls"][0]["tool_name"] == "add" and trace["tool_calls"][0]["result"] == "5"
    first, second = trace["llm_calls"]
    assert first["api"] == "openai.responses" and (first["tokens_in"], first["tokens_out"]) == (21, 4)
    assert first["tool_calls"][0]["id"] == "call_r1" and second["output"] == FINAL
    assert trace["tools"][0] == {
        "type": "function",
        "function": {"name": "add", "parameters": TOOLS[0]["function"]["parameters"]},
    }


def test_responses_stream(tmp_path, server) -> None:
    agent = ResponsesAgent(_client(server), stream=True)
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    last = trace["llm_calls"][-1]
    assert last["stream"] and last["output"] == FINAL and last["tokens_in"] == 21
    assert trace["messages"][-1] == {"role": "assistant", "content": FINAL}
    assert trace["messages"][-2] == {"role": "tool", "tool_call_id": "call_r1", "content": "5"}


def test_call_outside_a_run_is_not_recorded(tmp_path, server) -> None:
    agent = PlainAgent(_client(server))
    client = _client(server)
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "outside"}])
        assert hook.flush(5)
        assert hook.stats.unattributed == 1 and hook.stats.captured == 0
        agent.run("inside")
        (trace,) = flushed(hook)
    assert len(trace["llm_calls"]) == 2


def test_a_failure_while_recording_leaves_the_host_alone(tmp_path, server, monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("flowrl bug")

    agent = PlainAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        monkeypatch.setattr(oc, "record", broken)
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert hook.stats.capture_errors == 2 and trace["llm_calls"] == []
    assert trace["metadata"]["transcript"] == "synthesized"


def test_host_exception_passes_through(tmp_path, server) -> None:
    class Bad:
        def __init__(self, client: Any) -> None:
            self.client = client

        def run(self, query: str) -> Any:
            return self.client.chat.completions.create(model="m", messages=[{"role": "user", "content": query}])

    agent = Bad(openai.OpenAI(base_url=server.url.replace("/v1", "/nowhere"), api_key="x", max_retries=0))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        with pytest.raises(openai.NotFoundError):
            agent.run("hi")
        (trace,) = flushed(hook)
    assert "NotFoundError" in trace["llm_calls"][0]["error"] and trace["status"] == "error"


def test_unhook_restores_the_sdk_and_two_hooks_share_one_patch(tmp_path, server) -> None:
    from openai.resources.chat.completions import AsyncCompletions, Completions
    from openai.resources.responses import AsyncResponses, Responses

    classes = (Completions, AsyncCompletions, Responses, AsyncResponses)
    before = [vars(c)["create"] for c in classes]
    a, b = PlainAgent(_client(server)), PlainAgent(_client(server))
    hook_a = hook_into_agent(a, store=tmp_path / "a", run_methods=["run"])
    patch = vars(Completions)["create"]
    assert patch is not before[0] and client_patch.patched("openai")
    hook_b = hook_into_agent(b, store=tmp_path / "b", run_methods=["run"])
    assert vars(Completions)["create"] is patch  # one patch, two users
    assert "openai.Completions.create" in hook_b.methods
    hook_a.unhook()
    assert vars(Completions)["create"] is patch  # b still uses it
    b.run("What is 2 + 3?")
    assert len(flushed(hook_b)) == 1
    hook_b.unhook()
    assert [vars(c)["create"] for c in classes] == before  # the same objects
    assert not client_patch.patched("openai")
    a.run("What is 2 + 3?")  # unhooked: nothing recorded, nothing raised


def test_llm_clients_off_and_bad_values(tmp_path, server) -> None:
    from flowrl.errors import ConfigError

    agent = PlainAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_clients=[]) as hook:
        assert not client_patch.patched("openai")
        agent.run("What is 2 + 3?")
        (trace,) = flushed(hook)
    assert trace["llm_calls"] == [] and trace["metadata"]["transcript"] == "synthesized"
    with pytest.raises(ConfigError, match="unknown client"):
        hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_clients=["anthropic"])


def test_secret_in_a_message_is_masked(tmp_path, server) -> None:
    secret = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0"
    agent = PlainAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        agent.run(f"What is 2 + 3? my key is {secret}")
        (trace,) = flushed(hook)
    raw = json.dumps(trace)
    assert secret not in raw
    assert "[REDACTED" in trace["messages"][1]["content"]


class MethodAgent:
    """An agent with its own LLM method (hooked by name) that calls the SDK: one LLM call, not two."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def complete(self, messages: list[dict[str, Any]], model: str = "fake-model") -> Any:
        return self.client.chat.completions.create(model=model, messages=messages, tools=TOOLS)

    async def a_complete(self, messages: list[dict[str, Any]], model: str = "fake-model") -> Any:
        return self.client.chat.completions.create(model=model, messages=messages, tools=TOOLS)

    def run(self, query: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
        call = self.complete(messages).choices[0].message.tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
        return str(asyncio.run(self.a_complete(messages)).choices[0].message.content)


def test_sdk_call_inside_a_hooked_llm_method_is_one_call(tmp_path, server) -> None:
    agent = MethodAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"], llm_methods=["complete", "a_complete"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    first, second = trace["llm_calls"]
    assert (first["tokens_in"], second["tokens_in"], first["api"], second["api"]) == (
        10,
        30,
        "openai.chat",
        "openai.chat",
    )
    assert trace["metadata"]["transcript"] == "llm_client"
    assert trace["messages"][-1] == {"role": "assistant", "content": FINAL}


def test_a_conversation_kept_on_the_server_is_rebuilt_from_the_runs_earlier_call(tmp_path, server) -> None:
    """`previous_response_id`: the second request sends only the tool's output; the trace still holds what the
    model saw, the earlier call's messages and reply first."""

    class ChainedAgent:
        def __init__(self, client: Any) -> None:
            self.client = client

        def run(self, query: str) -> str:
            tools = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]
            first = self.client.responses.create(
                model="fake-model", instructions="Add.", input=[{"role": "user", "content": query}], tools=tools
            )
            call = first.output[0]
            output = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
            resp = self.client.responses.create(
                model="fake-model", instructions="Add.", previous_response_id=first.id, input=[output], tools=tools
            )
            return str(resp.output_text)

    agent = ChainedAgent(_client(server))
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert agent.run("What is 2 + 3?") == FINAL
        (trace,) = flushed(hook)
    assert [m["role"] for m in trace["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert trace["messages"][2]["tool_calls"][0]["id"] == "call_r1"
    assert trace["tool_calls"][0]["tool_name"] == "add" and trace["tool_calls"][0]["result"] == "5"
