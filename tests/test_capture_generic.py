"""The generic adapter: any agent whose entry points and tools are methods."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from flowrl.capture import hook_into_agent
from flowrl.errors import ConfigError
from tests.fakes import flushed


class ToyAgent:
    name = "toy"

    async def a_run(self, query: str, session_id: str = "default") -> str:
        found = await self.call_tool("search", {"q": query})
        total = await self.call_tool("calc", expr="1+1")
        await self.complete(f"summarise {found} {total}", model="toy-model")
        try:
            await self.call_tool("broken", {})
        except ValueError:
            pass
        return f"{found}; {total}"

    async def call_tool(self, name: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
        await asyncio.sleep(0)
        if name == "broken":
            raise ValueError("tool broke")
        if name == "calc":
            return 2
        return f"results for {args['q']}"

    async def complete(self, prompt: str, model: str = "default") -> str:
        return f"LLM says: {prompt[:10]}"

    async def stream(self, query: str):
        for word in ("hello", " ", "world"):
            await asyncio.sleep(0)
            yield word

    def run_sync(self, query: str) -> str:
        return f"sync {query} {self.lookup('k')}"

    def lookup(self, key: str) -> str:
        return f"value:{key}"


def test_generic_agent_runs_and_tools_are_captured(tmp_path) -> None:
    agent = ToyAgent()
    hook = hook_into_agent(
        agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool"], llm_methods=["complete"]
    )
    try:
        answer = asyncio.run(agent.a_run("cats", session_id="g1"))
        (trace,) = flushed(hook)
    finally:
        hook.unhook()
    assert answer == "results for cats; 2"
    assert trace["agent_name"] == "toy" and trace["session_id"] == "g1" and trace["user_query"] == "cats"
    assert trace["final_response"] == answer and trace["metadata"]["adapter"] == "generic"
    assert trace["success"] is None  # no exception, but nothing says whether the task succeeded
    calls = trace["tool_calls"]
    assert [(c["tool_name"], c["arguments"], c["success"]) for c in calls] == [
        ("search", {"q": "cats"}, True),
        ("calc", {"expr": "1+1"}, True),
        ("broken", {}, False),
    ]
    assert calls[2]["error"] == "ValueError: tool broke" and calls[1]["result"] == "2"
    (llm,) = trace["llm_calls"]
    assert llm["model"] == "toy-model" and llm["output"].startswith("LLM says") and trace["llm_calls_count"] == 1
    roles = [m["role"] for m in trace["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    assert trace["messages"][1]["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "cats"}'}
    assert trace["messages"][-1] == {"role": "assistant", "content": answer}
    assert trace["metadata"]["transcript"] == "synthesized"


def test_generic_async_generator_run_method(tmp_path) -> None:
    agent = ToyAgent()
    with hook_into_agent(agent, store=tmp_path, run_methods=["stream"]) as hook:
        assert inspect.isasyncgenfunction(agent.stream)

        async def main():
            return [w async for w in agent.stream("greet")]

        assert asyncio.run(main()) == ["hello", " ", "world"]
        (trace,) = flushed(hook)
    assert trace["final_response"] == "hello world" and trace["status"] == "completed"


def test_generic_sync_methods(tmp_path) -> None:
    agent = ToyAgent()
    with hook_into_agent(agent, store=tmp_path, run_methods=["run_sync"], tool_methods=["lookup"]) as hook:
        assert agent.run_sync("q") == "sync q value:k"
        (trace,) = flushed(hook)
    (call,) = trace["tool_calls"]
    assert call["tool_name"] == "lookup" and call["arguments"] == {"key": "k"} and call["result"] == "value:k"


def test_generic_exception_marks_trace_failed_and_reraises(tmp_path) -> None:
    class Failing(ToyAgent):
        async def a_run(self, query: str, session_id: str = "default") -> str:
            await self.call_tool("search", {"q": query})
            raise KeyError("missing")

    agent = Failing()
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool"]) as hook:
        with pytest.raises(KeyError):
            asyncio.run(agent.a_run("x"))
        (trace,) = flushed(hook)
    assert trace["success"] is False and trace["status"] == "error" and len(trace["tool_calls"]) == 1


def test_error_string_result_is_a_failure(tmp_path) -> None:
    class Soft(ToyAgent):
        async def a_run(self, query: str, session_id: str = "default") -> str:
            return "Error: could not do it"

    agent = Soft()
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"]) as hook:
        asyncio.run(agent.a_run("x"))
        (trace,) = flushed(hook)
    assert trace["success"] is False


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "not a toolboxv2 FlowAgent"),
        ({"run_methods": ["nope"]}, "has no method 'nope'"),
        ({"run_methods": ["a_run"], "colour": "red"}, "unknown option"),
        ({"run_methods": ["a_run"], "queue_size": 0}, "queue_size"),
        ({"run_methods": ["a_run"], "mask": "not callable"}, "mask"),
        ({"run_methods": "a_run b"}, "method names"),
        ({"run_methods": ["a_run"], "adapter": "langchain"}, "adapter"),
    ],
)
def test_wrong_options_raise_config_error(tmp_path, options: dict[str, Any], message: str) -> None:
    agent = ToyAgent()
    before = dict(vars(ToyAgent))
    with pytest.raises(ConfigError, match=message):
        hook_into_agent(agent, store=tmp_path, **options)
    assert dict(vars(ToyAgent)) == before  # nothing left patched


def test_hook_none_or_a_class_is_refused() -> None:
    with pytest.raises(ConfigError):
        hook_into_agent(None)
    with pytest.raises(ConfigError):
        hook_into_agent(ToyAgent, run_methods=["a_run"])


def test_default_store_follows_flowrl_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWRL_HOME", str(tmp_path / "home"))
    agent = ToyAgent()
    with hook_into_agent(agent, run_methods=["a_run"], tool_methods=["call_tool"]) as hook:
        assert hook.store.root == tmp_path / "home" / "traces"
        asyncio.run(agent.a_run("where?"))
        assert len(flushed(hook)) == 1


def test_stream_that_raises_is_a_failed_trace_and_the_error_reaches_the_host(tmp_path) -> None:
    class Flaky(ToyAgent):
        async def stream(self, query: str):
            yield "partial"
            raise ERR

    agent = Flaky()
    with hook_into_agent(agent, store=tmp_path, run_methods=["stream"]) as hook:

        async def main():
            got = []
            with pytest.raises(RuntimeError) as info:
                async for item in agent.stream("q"):
                    got.append(item)
            return got, info.value

        got, err = asyncio.run(main())
        (trace,) = flushed(hook)
    assert got == ["partial"] and err is ERR
    assert (
        trace["success"] is False
        and trace["status"] == "error"
        and trace["metadata"]["error"] == "RuntimeError: mid-stream"
    )


ERR = RuntimeError("mid-stream")
