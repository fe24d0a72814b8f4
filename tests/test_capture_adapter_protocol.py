"""Issue 15: capture's protocol is typed, so a third framework adapter is one small file. This test is one: a
made-up framework ("Crew") whose runs are `kickoff(task)` and whose tools are `use(tool, **args)`, captured
through the same events, handler factory and adapter interface the FlowAgent and generic adapters use."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowrl.capture import hook as hook_module
from flowrl.capture import hook_into_agent
from flowrl.capture.adapter import Adapter, PatchSpec, guarded_call
from flowrl.capture.events import ToolEvent
from flowrl.capture.generic import run_handler
from flowrl.capture.recorder import Frame, perf_counter, timed


class Crew:
    async def use(self, tool: str, **args: Any) -> str:
        if tool == "fail":
            raise RuntimeError("tool broke")
        return f"{tool} -> {sorted(args.items())}"

    async def kickoff(self, task: str) -> str:
        first = await self.use("search", q=task)
        try:
            await self.use("fail")
        except RuntimeError:
            pass
        return f"done: {first}"


class CrewAdapter:
    name = "crew"

    def detects(self, agent: Any) -> bool:
        return isinstance(agent, Crew)

    def plan(
        self,
        agent: Any,
        hook: Any,
        *,
        run_methods: list[str] | None,
        tool_methods: list[str] | None,
        llm_methods: list[str] | None,
    ) -> list[PatchSpec]:
        def record(frame: Frame, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ToolEvent | None:
            ev = ToolEvent("function", perf_counter(), name=args[0], kwargs=kwargs)
            return ev if frame[0].add(ev) else None

        def proceed(frame: Frame, ev: Any, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            return timed(hook, None, ev, wrapped(*args, **kwargs))

        return [
            PatchSpec(Crew, "kickoff", None, run_handler(hook, "kickoff", "crew")),
            PatchSpec(Crew, "use", None, guarded_call(hook, "Crew.use", record, proceed)),
        ]


@pytest.fixture
def crew_adapter(monkeypatch: pytest.MonkeyPatch) -> CrewAdapter:
    adapter = CrewAdapter()
    _typed: Adapter = adapter  # a Protocol: satisfied by shape, nothing to inherit
    monkeypatch.setitem(hook_module.ADAPTERS, "crew", adapter)
    return adapter


def test_a_new_framework_adapter_is_one_small_file(crew_adapter: CrewAdapter, tmp_path) -> None:
    crew = Crew()
    with hook_into_agent(crew, store=tmp_path) as hook:  # detected: no method names needed
        assert hook.adapter == "crew"
        assert asyncio.run(crew.kickoff("flowrl")).startswith("done: search")
        assert hook.flush(10)
        (trace,) = list(hook.store.iter_traces())
    assert [(c.tool_name, c.success) for c in trace.tool_calls] == [("search", True), ("fail", False)]
    assert trace.tool_calls[0].arguments == {"q": "flowrl"} and "tool broke" in trace.tool_calls[1].error
    assert trace.metadata["adapter"] == "crew" and trace.final_response.startswith("done:")
    asyncio.run(crew.kickoff("again"))  # unhooked: the class is as it was
    assert Crew.use.__qualname__ == "Crew.use"


def test_a_failure_while_recording_is_counted_and_the_call_goes_on(tmp_path) -> None:
    async def host_tool(x: int) -> int:
        return x + 1

    def broken(*_: Any) -> None:
        raise RuntimeError("recording broke")

    def never(*_: Any) -> None:
        raise AssertionError("proceed is not reached without an event")

    class Agent:
        async def run(self, q: str) -> int:
            return await handler(host_tool, None, (1,), {})

    agent = Agent()
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        handler = guarded_call(hook, "tool", broken, never)
        assert asyncio.run(agent.run("q")) == 2  # inside a run: recording failed, the call went on
        assert hook.stats.capture_errors == 1
        assert asyncio.run(handler(host_tool, None, (5,), {})) == 6  # outside a run: only the host's call
        assert hook.stats.capture_errors == 1
