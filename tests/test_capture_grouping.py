"""LLM client calls made outside any run, grouped into runs by conversation prefix (`flowrl/capture/grouping.py`).

No network: the OpenAI-compatible server of `test_capture_openai.py` answers (a tool call, then the final answer
once a tool result is in the request).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from flowrl.capture import (  # noqa: E402
    capture_llm_calls,
    client_patch,  # noqa: E402
    hook_into_agent,
)
from flowrl.capture.grouping import GROUPED  # noqa: E402
from flowrl.errors import ConfigError  # noqa: E402
from flowrl.trace.transcript import canonical_messages  # noqa: E402
from tests.fakes import flushed, stored  # noqa: E402
from tests.test_capture_openai import FINAL, TOOLS, PlainAgent, _client, _Server  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Conversation:
    """A plain script's conversation, one step at a time: ask, run the tool, ask again."""

    def __init__(self, client: Any, query: str, keep_sdk_message: bool = False) -> None:
        self.client = client
        self.keep_sdk_message = keep_sdk_message
        self.messages: list[Any] = [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": query},
        ]
        self.sent: list[Any] = []

    def step(self) -> Any:
        self.sent = list(self.messages)
        msg = self.client.chat.completions.create(model="fake-model", messages=self.messages, tools=TOOLS)
        msg = msg.choices[0].message
        if self.keep_sdk_message:
            self.messages.append(msg)  # the SDK's own message object, as many scripts do
        else:
            entry: dict[str, Any] = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in msg.tool_calls
                ]
            self.messages.append(entry)
        for call in msg.tool_calls or ():
            args = json.loads(call.function.arguments)
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        return msg


def _by_query(traces: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["user_query"]: t for t in traces}


def test_two_interleaved_conversations_become_two_traces(tmp_path, server) -> None:
    client = _client(server)
    with capture_llm_calls(tmp_path, clock=Clock()) as capture:
        a = Conversation(client, "What is 2 + 3?", keep_sdk_message=True)
        b = Conversation(client, "Please add 2 and 3.")
        assert a.step().tool_calls and b.step().tool_calls
        assert capture.open == 2
        assert a.step().content == FINAL
        assert b.step().content == FINAL
        assert capture.open == 2
        traces = flushed(capture)
        assert capture.open == 0
    assert len(traces) == 2
    got = _by_query(traces)
    for conv in (a, b):
        trace = got[conv.messages[1]["content"]]
        sent = canonical_messages(json.loads(json.dumps(conv.sent, default=_dump)))
        assert _turns(trace["messages"]) == _turns([*sent, {"role": "assistant", "content": FINAL}])
        if not conv.keep_sdk_message:
            assert trace["messages"] == [*sent, {"role": "assistant", "content": FINAL}]
        assert [m["role"] for m in trace["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert trace["metadata"]["grouped"] == GROUPED and trace["metadata"]["transcript"] == "llm_client"
        assert trace["llm_calls_count"] == 2 and trace["final_response"] == FINAL
        (call,) = trace["tool_calls"]
        assert (call["tool_name"], call["arguments"], call["result"]) == ("add", {"a": 2, "b": 3}, "5")
        assert trace["agent_name"] == "llm_client"
    assert capture.stats.captured == 2 and capture.stats.errors == 0


def _dump(value: Any) -> Any:
    return value.model_dump(exclude_none=True)


def _turns(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each message's role, content, tool calls and answered call (an SDK message's other fields aside)."""
    return [(m["role"], m.get("content") or None, m.get("tool_calls"), m.get("tool_call_id")) for m in messages]


def test_an_unrelated_call_starts_a_new_trace_and_a_follow_up_continues(tmp_path, server) -> None:
    client = _client(server)
    with capture_llm_calls(tmp_path, clock=Clock()) as capture:
        a = Conversation(client, "What is 2 + 3?")
        a.step()
        a.step()
        a.messages.append({"role": "user", "content": "Thanks. And 2 + 3 again?"})
        a.step()  # continues: its request starts with the last request and that call's reply
        assert capture.open == 1
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Something else"}])
        assert capture.open == 2
        traces = flushed(capture)
    got = _by_query(traces)
    assert set(got) == {"What is 2 + 3?", "Something else"}
    assert got["What is 2 + 3?"]["llm_calls_count"] == 3
    assert got["Something else"]["llm_calls_count"] == 1


def test_idle_timeout_finishes_a_conversation(tmp_path, server) -> None:
    client = _client(server)
    clock = Clock()
    with capture_llm_calls(tmp_path, idle_s=10, clock=clock) as capture:
        a = Conversation(client, "first")
        a.step()
        clock.now = 5.0
        assert capture.expire() == 0 and capture.open == 1
        clock.now = 20.0
        assert capture.expire() == 1 and capture.open == 0
        assert capture.flush(10)
        (trace,) = stored(capture.store)
        assert trace["user_query"] == "first" and trace["llm_calls_count"] == 1
        b = Conversation(client, "second")
        b.step()
        clock.now = 40.0
        a.step()  # checked lazily on a new call: "second" is finished; "first" was, so this starts a new run
        assert capture.open == 1 and capture.stats.captured == 2
        traces = flushed(capture)
    assert sorted(t["user_query"] for t in traces) == ["first", "first", "second"]


def test_flush_and_unhook_write_the_open_conversations(tmp_path, server) -> None:
    client = _client(server)
    capture = capture_llm_calls(tmp_path, clock=Clock())
    assert client_patch.patched("openai")
    Conversation(client, "one").step()
    assert len(flushed(capture)) == 1 and capture.open == 0
    Conversation(client, "two").step()
    assert capture.open == 1
    capture.unhook()
    assert not client_patch.patched("openai")
    assert sorted(t["user_query"] for t in stored(tmp_path)) == ["one", "two"]
    Conversation(client, "three").step()  # unhooked: not recorded
    assert len(stored(tmp_path)) == 2


def test_calls_inside_a_hooked_run_are_not_grouped(tmp_path, server) -> None:
    agent = PlainAgent(_client(server))
    with capture_llm_calls(tmp_path / "grouped", clock=Clock()) as capture:
        with hook_into_agent(agent, store=tmp_path / "runs", run_methods=["run"]) as hook:
            assert agent.run("What is 2 + 3?") == FINAL
            (trace,) = flushed(hook)
            assert "grouped" not in trace["metadata"] and trace["llm_calls_count"] == 2
            _client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "outside"}])
            assert hook.flush(5) and hook.stats.unattributed == 1
        (grouped,) = flushed(capture)
    assert grouped["user_query"] == "outside" and capture.stats.captured == 1


def test_one_capture_per_process_and_bad_options(tmp_path) -> None:
    with capture_llm_calls(tmp_path, clock=Clock()):
        with pytest.raises(ConfigError, match="already active"):
            capture_llm_calls(tmp_path)
    for bad in ({"idle_s": -1}, {"max_open": 0}, {"nope": 1}):
        with pytest.raises(ConfigError):
            capture_llm_calls(tmp_path, **bad)


def test_max_open_finishes_the_least_recently_used(tmp_path, server) -> None:
    client = _client(server)
    with capture_llm_calls(tmp_path, max_open=2, clock=Clock()) as capture:
        for query in ("q1", "q2", "q3"):
            Conversation(client, query).step()
        assert capture.open == 2 and capture.stats.captured == 1
        assert capture.flush(10)
        assert len(stored(tmp_path)) == 3


def test_a_streamed_conversation_continues_once_read(tmp_path, server) -> None:
    client = _client(server)
    with capture_llm_calls(tmp_path, clock=Clock()) as capture:
        agent = PlainAgent(client, stream=True)  # not hooked: a plain script's loop
        assert agent.run("What is 2 + 3?") == FINAL
        assert capture.open == 1
        (trace,) = flushed(capture)
    assert [m["role"] for m in trace["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert trace["llm_calls_count"] == 2 and trace["final_response"] == FINAL


def test_async_client_calls_are_grouped(tmp_path, server) -> None:
    import asyncio

    client = _client(server, openai.AsyncOpenAI)

    async def main() -> None:
        messages: list[Any] = [{"role": "user", "content": "async 2 + 3"}]
        first = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
        messages.append(first)
        messages.append({"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "5"})
        await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)

    with capture_llm_calls(tmp_path, clock=Clock()) as capture:
        asyncio.run(main())
        (trace,) = flushed(capture)
    assert trace["user_query"] == "async 2 + 3" and trace["llm_calls_count"] == 2
    assert trace["final_response"] == FINAL


def test_open_conversations_are_written_at_process_exit(tmp_path, server) -> None:
    import subprocess
    import sys

    script = f"""
import openai
from flowrl import capture_llm_calls
capture_llm_calls({str(tmp_path)!r})
client = openai.OpenAI(base_url={server.url!r}, api_key="sk-test-not-a-real-key", max_retries=0)
client.chat.completions.create(model="m", messages=[{{"role": "user", "content": "at exit"}}])
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    (trace,) = stored(tmp_path)
    assert trace["user_query"] == "at exit" and trace["metadata"]["grouped"] == GROUPED


@pytest.mark.parametrize("switch", ["1", "0"])
def test_flowrl_instrument_records_a_plain_scripts_calls(tmp_path, server, switch) -> None:
    """Under `flowrl-instrument` (FLOWRL_AUTOHOOK=1 and its site dir) a script that only uses the SDK gets traces;
    FLOWRL_AUTOHOOK_LLM_CALLS=0 turns that off."""
    import os
    import subprocess
    import sys

    from flowrl.autohook import SITE_DIR

    script = f"""
import openai
client = openai.OpenAI(base_url={server.url!r}, api_key="sk-test-not-a-real-key", max_retries=0)
client.chat.completions.create(model="m", messages=[{{"role": "user", "content": "instrumented"}}])
"""
    env = {
        **os.environ,
        "FLOWRL_AUTOHOOK": "1",
        "FLOWRL_STORE": str(tmp_path),
        "FLOWRL_AUTOHOOK_LLM_CALLS": switch,
        "PYTHONPATH": os.pathsep.join([str(SITE_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=env)
    traces = stored(tmp_path)
    if switch == "0":
        assert traces == []
    else:
        (trace,) = traces
        assert trace["user_query"] == "instrumented" and trace["metadata"]["grouped"] == GROUPED
