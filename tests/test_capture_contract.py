"""The promises capture makes to its host: nothing it does changes what the host sees."""

from __future__ import annotations

import asyncio
import copy
import pickle
import threading
import time
import traceback
from typing import Any

import pytest

from flowrl.capture import Hook, hook_into_agent
from flowrl.store.files import TraceStore
from tests.fakes import flushed, stored
from tests.fakes.fake_flowagent import ExecutionEngine, FlowAgent, make_agent, tc, turn


class Boom(Exception):
    pass


class PlainAgent:
    """Any agent with coroutine methods."""

    def __init__(self) -> None:
        self.calls = 0

    async def a_run(self, query: str, session_id: str = "default") -> str:
        self.calls += 1
        if query == "explode":
            raise ERROR
        if query == "sleep":
            await asyncio.sleep(10)
        result = await self.call_tool("search", {"q": query})
        return f"answer to {query}: {result}"

    async def call_tool(self, name: str, args: dict[str, Any]) -> str:
        if name == "broken":
            raise ERROR
        await asyncio.sleep(0)
        return f"{name} found {args}"


ERROR = Boom("the host's own error")


def script(agent: FlowAgent, query: str, *calls: dict[str, Any], answer: str = "ok") -> None:
    agent.router.script(
        query, [*(turn(c) for c in calls), turn(tc("fa", "final_answer", {"answer": answer, "success": True}))]
    )


def test_host_exception_propagates_unchanged(tmp_path) -> None:
    agent = PlainAgent()
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool"])
    try:
        with pytest.raises(Boom) as info:
            asyncio.run(agent.a_run("explode"))
        assert info.value is ERROR
        assert "raise ERROR" in "".join(traceback.format_tb(info.tb))  # the original frame is still there
        with pytest.raises(Boom) as info2:
            asyncio.run(agent.call_tool("broken", {}))  # outside a run: passes straight through
        assert info2.value is ERROR
        (trace,) = flushed(hook)
    finally:
        hook.unhook()
    assert trace["success"] is False and trace["status"] == "error"
    assert trace["metadata"]["error"] == "Boom: the host's own error"
    assert hook.stats.errors == 0


def test_cancelled_error_propagates_unchanged(tmp_path) -> None:
    agent = PlainAgent()
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["a_run"])

    async def main():
        task = asyncio.ensure_future(agent.a_run("sleep"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    try:
        assert asyncio.run(main()) is True
        (trace,) = flushed(hook)
    finally:
        hook.unhook()
    assert trace["status"] == "cancelled" and trace["success"] is False


def test_return_values_are_unchanged(tmp_path) -> None:
    bare, hooked = make_agent("same"), make_agent("same")
    for agent in (bare, hooked):
        script(agent, "Weather?", tc(1, "get_weather", {"city": "Rome"}), answer="Rome: 21C")
    with hook_into_agent(hooked, store=tmp_path):
        got = asyncio.run(hooked.a_run("Weather?", session_id="r", persist_blocking=True))
    assert got == asyncio.run(bare.a_run("Weather?", session_id="r", persist_blocking=True)) == "Rome: 21C"


def test_hooking_twice_captures_once(tmp_path) -> None:
    agent = make_agent()
    first = hook_into_agent(agent, store=tmp_path)
    second = hook_into_agent(agent, store=tmp_path)  # same options (another store raises: test_capture_collector)
    try:
        assert second is first
        wrapper = vars(FlowAgent)["a_run"]
        assert not hasattr(wrapper.__wrapped__, "__wrapped__")  # one wrapper, not a stack
        script(agent, "Once", tc(1, "get_weather", {"city": "Oslo"}))
        asyncio.run(agent.a_run("Once", session_id="o", persist_blocking=True))
        (trace,) = flushed(first)
        assert len(trace["tool_calls"]) == 1
        assert first.stats.captured == 1
    finally:
        first.unhook()
    assert not (tmp_path / "elsewhere").exists()


def test_concurrent_sessions_do_not_mix_tool_calls(tmp_path) -> None:
    agent = make_agent()
    sessions = [f"s{i}" for i in range(6)]
    for i, sid in enumerate(sessions):
        script(
            agent,
            f"query {sid}",
            tc(f"{sid}-a", "slow_lookup", {"key": f"{sid}-x", "delay": 0.001 * (6 - i)}),
            tc(f"{sid}-b", "slow_lookup", {"key": f"{sid}-y", "delay": 0.001 * i}),
            answer=f"done {sid}",
        )

    async def main():
        return await asyncio.gather(
            *(agent.a_run(f"query {sid}", session_id=sid, persist_blocking=True) for sid in sessions)
        )

    with hook_into_agent(agent, store=tmp_path) as hook:
        answers = asyncio.run(main())
        traces = flushed(hook)
    assert answers == [f"done {sid}" for sid in sessions]
    assert len(traces) == len(sessions)
    for trace in traces:
        sid = trace["session_id"]
        assert trace["user_query"] == f"query {sid}"
        assert sorted(c["call_id"] for c in trace["tool_calls"]) == [f"{sid}-a", f"{sid}-b"]
        assert all(c["arguments"]["key"].startswith(f"{sid}-") for c in trace["tool_calls"])
        assert all(m.get("tool_call_id", sid).startswith(sid) for m in trace["messages"])


def _class_state(cls: type) -> dict[str, Any]:
    return dict(vars(cls))


def test_unhook_restores_agent_exactly(tmp_path) -> None:
    agent, other = make_agent("a"), make_agent("b")
    engine = agent._get_execution_engine()
    before_agent = dict(vars(agent))
    before_engine = dict(vars(engine))
    before_classes = {cls: _class_state(cls) for cls in (FlowAgent, ExecutionEngine)}

    hook_a = hook_into_agent(agent, store=tmp_path / "a")
    hook_b = hook_into_agent(other, store=tmp_path / "b")
    assert vars(FlowAgent)["a_run"] is not before_classes[FlowAgent]["a_run"]  # patched on the class
    assert dict(vars(agent)).keys() == before_agent.keys()  # nothing stored on the instance
    script(agent, "Q", tc(1, "get_weather", {"city": "X"}))
    asyncio.run(agent.a_run("Q", session_id="u", persist_blocking=True))

    hook_a.unhook()
    hook_a.unhook()  # idempotent
    assert not hook_a.active
    # the other agent's hook still works; the class stays patched for it
    script(other, "Q2", tc(2, "get_weather", {"city": "Y"}))
    asyncio.run(other.a_run("Q2", session_id="u", persist_blocking=True))
    assert len(flushed(hook_b)) == 1
    script(agent, "Q3", tc(3, "get_weather", {"city": "Z"}))
    asyncio.run(agent.a_run("Q3 #new-ctx", session_id="u", persist_blocking=True))
    assert len(stored(tmp_path / "a")) == 1  # nothing captured after unhook

    hook_b.unhook()
    for cls, state in before_classes.items():
        assert _class_state(cls) == state, cls  # the very same function objects
        assert all(vars(cls)[k] is v for k, v in state.items())
    # the same attributes holding the same objects (counters the agent itself bumped aside)
    assert vars(agent).keys() == before_agent.keys()
    assert all(vars(agent)[k] is v for k, v in before_agent.items() if not isinstance(v, (int, float)))
    assert vars(engine).keys() == before_engine.keys()
    assert all(vars(engine)[k] is v for k, v in before_engine.items() if not isinstance(v, (int, float)))


def test_other_instances_of_the_class_are_not_captured(tmp_path) -> None:
    hooked, plain = make_agent("hooked"), make_agent("plain")
    with hook_into_agent(hooked, store=tmp_path) as hook:
        script(plain, "P", tc(1, "get_weather", {"city": "P"}), answer="plain answer")
        assert asyncio.run(plain.a_run("P", session_id="p", persist_blocking=True)) == "plain answer"
        assert flushed(hook) == []
        assert hook.stats.captured == 0 and hook.stats.unattributed == 0


def test_deepcopy_and_pickle_of_hooked_agent_work(tmp_path) -> None:
    agent = make_agent("copyable")
    with hook_into_agent(agent, store=tmp_path) as hook:
        script(agent, "Before copy", tc(1, "get_weather", {"city": "Rome"}))
        asyncio.run(agent.a_run("Before copy", session_id="c", persist_blocking=True))
        clones = {
            "copy": copy.copy(agent),
            "deepcopy": copy.deepcopy(agent),
            "pickle": pickle.loads(pickle.dumps(agent)),
        }
        method = pickle.loads(pickle.dumps(agent.a_run))  # a bound method of a hooked class pickles too
        assert method.__self__ is not agent and type(method.__self__) is FlowAgent
        assert copy.deepcopy(agent.a_run).__self__ is not agent
        assert copy.copy(agent.a_run).__self__ is agent
        for name, clone in clones.items():
            assert clone is not agent and clone.amd.name == "copyable", name
            script(clone, f"On the {name}", tc(2, "get_weather", {"city": "Oslo"}), answer=name)
            assert asyncio.run(clone.a_run(f"On the {name} #new-ctx", session_id="c", persist_blocking=True)) == name
        traces = flushed(hook)
    assert [t["user_query"] for t in traces] == ["Before copy"]  # a copy is a new agent: not captured


def test_secrets_are_masked_before_persisting(tmp_path) -> None:
    secrets = {
        "openai": "sk-proj-" + "Q7fZ2kLm9XwP4tRv8YbN3cHs6JdE1gUa",
        "anthropic": "sk-ant-api03-" + "abcdefghijklmnopqrstuvwx",
        "github": "ghp_" + "A" * 36,
        "aws_id": "AKIA" + "ABCDEFGHIJKLMNOP",
        "aws_secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "google": "AIza" + "B" * 35,
        "slack": "xoxb-" + "1234567890-abcdef",
        "bearer": "abcdefghijklmnop.qrstuvwxyz",
        "url_password": "hunter2secret",
        "email": "alice@example.com",
    }
    query = (
        f"Use {secrets['openai']} and {secrets['anthropic']}; token {secrets['github']}; "
        f"aws_secret_access_key={secrets['aws_secret']} id {secrets['aws_id']}; mail {secrets['email']}"
    )
    agent = make_agent()
    hook = hook_into_agent(agent, store=tmp_path, mask=lambda s: s.replace(secrets["email"], "[EMAIL]"))
    script(
        agent,
        query,
        tc(
            1,
            "get_weather",
            {"city": f"https://bob:{secrets['url_password']}@db.example.com", "api_key": secrets["google"]},
        ),
        tc(2, "slow_lookup", {"key": f"Authorization: Bearer {secrets['bearer']} {secrets['slack']}", "delay": 0}),
        answer=f"done with {secrets['openai']}",
    )
    try:
        asyncio.run(agent.a_run(query, session_id="secret", persist_blocking=True))
        (trace,) = flushed(hook)
    finally:
        hook.unhook()
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    leaked = [name for name, value in secrets.items() if value.encode() in raw]
    assert leaked == []
    assert "[REDACTED:openai_key]" in trace["user_query"] and "[EMAIL]" in trace["user_query"]
    assert trace["tool_calls"][0]["arguments"]["api_key"] == "[REDACTED:secret_key_name]"
    assert hook.stats.secrets_masked >= 8


def test_writes_happen_on_the_writer_thread_not_the_event_loop(tmp_path, monkeypatch) -> None:
    threads: list[str] = []
    real_write = TraceStore.write

    def spy(self, trace):
        threads.append(threading.current_thread().name)
        return real_write(self, trace)

    monkeypatch.setattr(TraceStore, "write", spy)
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        script(agent, "T", tc(1, "get_weather", {"city": "T"}))

        async def main():
            await agent.a_run("T", session_id="t", persist_blocking=True)
            return list(threads)  # nothing written while the loop ran the agent

        assert asyncio.run(main()) == []
        assert len(flushed(hook)) == 1
    assert len(threads) == 1 and threads[0].startswith("flowrl-trace-")  # the writer's I/O thread


def test_subclass_override_calling_super_is_captured_once(tmp_path) -> None:
    class MyAgent(FlowAgent):
        async def a_run(self, query: str, *args: Any, **kwargs: Any) -> Any:
            return await super().a_run(query, *args, **kwargs)

    base = make_agent("base")
    sub = MyAgent(base.amd)
    sub.add_tool(base.tool_manager.tools["get_weather"])
    with hook_into_agent(base, store=tmp_path / "base"), hook_into_agent(sub, store=tmp_path / "sub") as hook:
        script(sub, "Sub run", tc(1, "get_weather", {"city": "S"}))
        assert asyncio.run(sub.a_run("Sub run", session_id="s", persist_blocking=True)) == "ok"
        traces = flushed(hook)
    assert len(traces) == 1 and [c["call_id"] for c in traces[0]["tool_calls"]] == ["call_1"]
    assert "a_run" not in vars(MyAgent) or not hasattr(vars(MyAgent)["a_run"], "__wrapped__")


def test_run_inside_a_run_of_the_same_agent_is_one_trace(tmp_path) -> None:
    class Wrapped(PlainAgent):
        async def run(self, query: str) -> str:
            return await self.a_run(query)

    agent = Wrapped()
    with hook_into_agent(agent, store=tmp_path, run_methods=["run", "a_run"], tool_methods=["call_tool"]) as hook:
        assert asyncio.run(agent.run("nested")).startswith("answer to nested")
        traces = flushed(hook)
    assert len(traces) == 1 and traces[0]["metadata"]["method"] == "run"
    assert [c["tool_name"] for c in traces[0]["tool_calls"]] == ["search"]


def test_calls_outside_a_run_are_counted_not_recorded(tmp_path) -> None:
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        assert asyncio.run(agent.arun_function("get_weather", city="Nowhere")) == "Weather in Nowhere: 21C, sunny"
        assert flushed(hook) == []
        assert hook.stats.unattributed == 1 and hook.stats.captured == 0


def test_context_manager_unhooks_and_writes(tmp_path) -> None:
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        assert isinstance(hook, Hook) and hook.active
        script(agent, "CM", tc(1, "get_weather", {"city": "C"}))
        asyncio.run(agent.a_run("CM", session_id="cm", persist_blocking=True))
    assert not hook.active and hook.stats.written == 1
    assert len(stored(tmp_path)) == 1
    assert "flowrl-trace-writer" not in [t.name for t in threading.enumerate() if t.is_alive()] or hook.collector.closed


def test_agent_collected_without_unhook_lets_go_of_the_class(tmp_path) -> None:
    import gc

    before = dict(vars(FlowAgent))
    agent = make_agent("short-lived")
    hook = hook_into_agent(agent, store=tmp_path)
    script(agent, "Last words", tc(1, "get_weather", {"city": "G"}))
    asyncio.run(agent.a_run("Last words", session_id="g", persist_blocking=True))
    del agent
    gc.collect()
    assert not hook.active
    assert dict(vars(FlowAgent)) == before
    deadline = time.monotonic() + 10
    while hook.stats.written < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [t["user_query"] for t in stored(tmp_path)] == ["Last words"]


def test_flush_on_the_loop_with_a_commit_pending_does_not_hang(tmp_path) -> None:
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        script(agent, "Pending", tc(1, "get_weather", {"city": "P"}))

        async def main():
            await agent.a_run("Pending", session_id="p")  # FlowAgent commits in a background task
            started = time.monotonic()
            ok = hook.flush(10)  # called on the loop's own thread: the commit cannot run meanwhile
            return ok, time.monotonic() - started

        ok, waited = asyncio.run(main())
        assert ok and waited < 1
        (trace,) = stored(tmp_path)
    assert trace["status"] == "running" and trace["metadata"]["commit_pending"] is True


def test_calls_past_the_event_limit_are_counted(tmp_path) -> None:
    agent = PlainAgent()
    with hook_into_agent(
        agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool"], max_events_per_run=0
    ) as hook:
        asyncio.run(agent.a_run("many"))
        (trace,) = flushed(hook)
    assert trace["tool_calls"] == [] and trace["metadata"]["events_over_limit"] == 1
    assert hook.stats.events_over_limit == 1


def test_hooking_does_not_create_the_engine(tmp_path) -> None:
    agent = make_agent("lazy")
    assert agent._execution_engine_cache is None
    with hook_into_agent(agent, store=tmp_path) as hook:
        assert agent._execution_engine_cache is None  # FlowAgent creates it on the first run, as before
        assert "ExecutionEngine._execute_tool_call" in hook.methods
        script(agent, "First", tc(1, "get_weather", {"city": "L"}))
        asyncio.run(agent.a_run("First", session_id="l", persist_blocking=True))
        (trace,) = flushed(hook)
    assert [c["call_id"] for c in trace["tool_calls"]] == ["call_1"] and trace["tool_calls"][0]["layer"] == "engine"


def test_flowagent_like_class_in_a_top_level_module_is_hooked_fully(tmp_path) -> None:
    """No `<package>.execution_engine` to look in: the engine's class comes from the agent itself."""
    import types

    module = types.ModuleType("toplevel_agent")
    exec(
        "class Engine:\n"
        "    def __init__(self, agent): self.agent = agent\n"
        "    async def _execute_tool_call(self, ctx, tc): return 'ok', False\n"
        "class Agent:\n"
        "    def __init__(self): self._execution_engine_cache = None\n"
        "    def _get_execution_engine(self):\n"
        "        if self._execution_engine_cache is None: self._execution_engine_cache = Engine(self)\n"
        "        return self._execution_engine_cache\n"
        "    async def a_run(self, query, session_id='default', get_ctx=False):\n"
        "        return await self._get_execution_engine()._execute_tool_call(None, {'id': 'c1', 'name': 't'})\n"
        "    async def arun_function(self, function_name, **kw): return None\n",
        module.__dict__,
    )
    agent = module.Agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        assert hook.adapter == "flowagent" and "Engine._execute_tool_call" in hook.methods
        assert hook.stats.errors == 0
        assert asyncio.run(agent.a_run("q")) == ("ok", False)
        (trace,) = flushed(hook)
    assert [c["call_id"] for c in trace["tool_calls"]] == ["c1"]
