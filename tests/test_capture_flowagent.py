"""Live capture on a (faithful fake) toolboxv2 FlowAgent: what one trace per run holds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowrl.capture import hook_into_agent
from tests.fakes import flushed
from tests.fakes.fake_flowagent import make_agent, tc, turn


@pytest.fixture
def agent():
    return make_agent("fa_agent")


@pytest.fixture
def hook(agent, tmp_path):
    h = hook_into_agent(agent, store=tmp_path / "traces")
    yield h
    h.unhook()


def calls(trace: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [c for c in trace["tool_calls"] if c["tool_name"] == name]


def by_query(traces: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {t["user_query"]: t for t in traces}
    assert len(out) == len(traces), [t["user_query"] for t in traces]
    return out


SQUARES = "What is the sum of squares from 1 to 10?"


def script_squares(agent) -> None:
    agent.router.thinks = ["Assessment: simple arithmetic. Tip: one exec_code call."]
    agent.router.script(
        SQUARES,
        [
            turn(tc(1, "think", {"thought": "Compute it with exec_code."})),
            turn(tc(2, "exec_code", {"code": "print(sum(i*i for i in range(1, 11)))"}), content="Let me compute that."),
            turn(tc(3, "final_answer", {"answer": "It is 385.", "success": True})),
        ],
    )


def test_run_is_captured_as_one_complete_trace(agent, hook) -> None:
    script_squares(agent)
    answer = asyncio.run(agent.a_run(SQUARES, session_id="coding", persist_blocking=True))
    assert answer == "It is 385."
    (trace,) = flushed(hook)
    assert trace["source"] == "live" and trace["agent_name"] == "fa_agent"
    assert trace["session_id"] == "coding" and trace["user_query"] == SQUARES
    ctx = agent._get_execution_engine()._active_executions[trace["run_id"]]
    assert trace["status"] == "completed" and trace["success"] is True
    assert trace["final_response"] == "It is 385."
    assert trace["metadata"]["final_answer_success"] is True
    assert [c["tool_name"] for c in trace["tool_calls"]] == ["think", "exec_code"]
    assert [c["call_id"] for c in trace["tool_calls"]] == ["call_1", "call_2"]
    (code,) = calls(trace, "exec_code")
    assert code["arguments"] == {"code": "print(sum(i*i for i in range(1, 11)))"}
    assert code["success"] is True and code["duration_ms"] > 0 and "function_duration_ms" in code
    # the transcript is the context's working history, OpenAI format, think result once
    assert [m["role"] for m in trace["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert len(ctx.working_history) == 8  # FlowAgent appended the think result twice
    assert trace["messages"][4]["tool_calls"][0]["function"]["name"] == "exec_code"
    # LLM calls: 3 main-loop turns, 1 think stream, 1 run summary; tokens from the agent's counters
    assert trace["llm_calls_count"] == 5 == len(trace["llm_calls"])
    assert trace["total_tokens_in"] == 500 and trace["total_tokens_out"] == 50
    assert all(c["model"] == "mock/fast" and c["latency_ms"] >= 0 for c in trace["llm_calls"])
    assert trace["llm_calls"][0]["tool_calls"][0]["id"] == "call_1"
    assert {t["function"]["name"] for t in trace["tools"]} >= {"think", "final_answer", "load_tools"}
    assert trace["execution_duration_ms"] > 0


def test_think_results_are_deduplicated_by_tool_call_id(agent, hook) -> None:
    script_squares(agent)
    asyncio.run(agent.a_run(SQUARES, session_id="coding", persist_blocking=True))
    (trace,) = flushed(hook)
    assert len(trace["reasoning_steps"]) == 1
    step = trace["reasoning_steps"][0]
    assert step["call_id"] == "call_1"
    assert (
        step["content"]
        == "THOUGHT: Compute it with exec_code.\nASSESSMENT: Assessment: simple arithmetic. Tip: one exec_code call."
    )
    think_msgs = [m for m in trace["messages"] if m["role"] == "tool" and m.get("name") == "think"]
    assert len(think_msgs) == 1
    stream_call = [c for c in trace["llm_calls"] if c["stream"]]
    assert stream_call and stream_call[0]["output"] == "Assessment: simple arithmetic. Tip: one exec_code call."


def test_user_query_is_the_query_passed_not_ctx_query_on_auto_resume(agent, hook) -> None:
    agent.router.script(
        "Weather in Paris?",
        [
            turn(tc(1, "get_weather", {"city": "Paris"})),
            turn(tc(2, "final_answer", {"answer": "Paris: 21C", "success": True})),
        ],
    )
    agent.router.script(
        "And in Rome?",
        [
            turn(tc(3, "get_weather", {"city": "Rome"})),
            turn(tc(4, "final_answer", {"answer": "Rome: 21C", "success": True})),
        ],
    )

    async def main():
        first = await agent.a_run("Weather in Paris?", session_id="s1", persist_blocking=True)
        second, ctx = await agent.a_run("And in Rome?", session_id="s1", get_ctx=True, persist_blocking=True)
        return first, second, ctx

    first, second, ctx = asyncio.run(main())
    assert (first, second) == ("Paris: 21C", "Rome: 21C")
    assert ctx.query == "Weather in Paris?"  # FlowAgent resumed the same context
    traces = by_query(flushed(hook))
    paris, rome = traces["Weather in Paris?"], traces["And in Rome?"]
    assert paris["run_id"] == rome["run_id"] == ctx.run_id
    assert rome["metadata"]["resumed"] is True
    # only this run's part of the shared working history
    assert rome["messages"][0] == {"role": "system", "content": "Continue with old task using new user information's"}
    assert rome["messages"][1] == {"role": "user", "content": "And in Rome?"}
    assert [c["call_id"] for c in rome["tool_calls"]] == ["call_3"]
    assert [c["call_id"] for c in paris["tool_calls"]] == ["call_1"]
    assert not any(m.get("content") == "Weather in Paris?" for m in rome["messages"])


def test_run_finished_in_background_commit_is_not_stored_as_running(agent, hook) -> None:
    """With persist_blocking=False FlowAgent sets the final status in a background commit."""
    agent.router.script("Quick one", [turn(tc(1, "final_answer", {"answer": "done", "success": True}))])

    async def main():
        answer, ctx = await agent.a_run("Quick one", session_id="bg", get_ctx=True)
        status_at_return = ctx.status
        await agent._get_execution_engine().wait_all_pending_finalizes()
        return answer, status_at_return

    answer, status_at_return = asyncio.run(main())
    assert answer == "done" and status_at_return == "running"
    (trace,) = flushed(hook)
    assert trace["status"] == "completed"


def test_sidecar_reply_is_its_own_turn(agent, hook) -> None:
    """A query that arrives while the session's last run is still committing is answered by the sidecar."""
    agent.router.script(
        "First task",
        [
            turn(tc(1, "get_weather", {"city": "Oslo"})),
            turn(tc(2, "final_answer", {"answer": "Oslo: 21C", "success": True})),
        ],
    )

    async def main():
        first = await agent.a_run("First task", session_id="s2")  # commit still pending
        side = await agent.a_run("Are you there?", session_id="s2")
        await agent._get_execution_engine().wait_all_pending_finalizes()
        return first, side

    first, side = asyncio.run(main())
    traces = by_query(flushed(hook))
    trace = traces["Are you there?"]
    assert trace["metadata"]["sidecar"] is True and trace["final_response"] == side
    assert trace["tool_calls"] == []
    assert [m["role"] for m in trace["messages"]] == ["user", "assistant"]
    assert traces["First task"]["status"] == "completed"


def test_tool_failure_is_detected_honestly(agent, hook) -> None:
    q = "Weather in Berlin and ACME stock?"
    agent.router.script(
        q,
        [
            turn(tc(4, "load_tools", {"tools": ["get_weather", "fetch_stock"]})),
            turn(
                tc(5, "get_weather", {"city": "Berlin"}),
                tc(6, "fetch_stock", {"symbol": "ACME"}),
                tc(7, "exec_code", {"code": "print(1/0)"}),
            ),
            turn(tc(8, "final_answer", {"answer": "Berlin is sunny; no quote.", "success": False})),
        ],
    )
    asyncio.run(agent.a_run(q, session_id="research", persist_blocking=True))
    (trace,) = flushed(hook)
    (load,) = calls(trace, "load_tools")
    assert load["success"] is True and load["result"].startswith("Geladen")
    (weather,) = calls(trace, "get_weather")
    assert weather["success"] is True and weather["error"] is None
    (stock,) = calls(trace, "fetch_stock")
    assert stock["success"] is False
    assert stock["result"] == "Error executing fetch_stock: upstream quote service unreachable for ACME"
    assert stock["function_error"] == "ConnectionError: upstream quote service unreachable for ACME"
    (code,) = calls(trace, "exec_code")  # FlowAgent says success: True, the output holds a traceback
    assert "'success': True" in code["result"] and code["success"] is False
    assert trace["metadata"]["final_answer_success"] is False and trace["success"] is False


def test_error_result_marks_trace_failed(agent, hook) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("engine exploded")

    agent._get_execution_engine().execute = boom  # a_run never raises: it returns "Error: ..."
    answer = asyncio.run(agent.a_run("anything", session_id="e"))
    assert answer == "Error: engine exploded"
    (trace,) = flushed(hook)
    assert trace["success"] is False and trace["final_response"] == "Error: engine exploded"
    assert trace["messages"] == [
        {"role": "user", "content": "anything"},
        {"role": "assistant", "content": "Error: engine exploded"},
    ]


def test_max_iterations_status_is_a_failure(agent, hook) -> None:
    agent.router.script("Loop forever", [turn(tc(i, "get_weather", {"city": f"C{i}"})) for i in range(5)])
    answer = asyncio.run(agent.a_run("Loop forever", session_id="m", max_iterations=3, persist_blocking=True))
    assert "maximum" in answer
    (trace,) = flushed(hook)
    assert trace["status"] == "max_iterations" and trace["success"] is False
    assert len(calls(trace, "get_weather")) == 3


def test_invalid_json_arguments_are_a_failed_call(agent, hook) -> None:
    agent.router.script(
        "Bad args",
        [turn(tc(1, "get_weather", "{not json")), turn(tc(2, "final_answer", {"answer": "sorry", "success": False}))],
    )
    asyncio.run(agent.a_run("Bad args", session_id="j", persist_blocking=True))
    (trace,) = flushed(hook)
    (call,) = trace["tool_calls"]
    assert call["arguments"] == "{not json" and call["success"] is False
    assert call["result"].startswith("System-Error: Invalid JSON")


def test_sub_agent_calls_are_captured_in_the_parent_run(agent, hook) -> None:
    agent.router.script(
        "Delegate it",
        [
            turn(tc(1, "spawn_sub_agent", {"task": "Sub: weather in Rome"})),
            turn(tc(2, "final_answer", {"answer": "Rome is sunny", "success": True})),
        ],
    )
    agent.router.script(
        "Sub: weather in Rome",
        [
            turn(tc("s1", "get_weather", {"city": "Rome"})),
            turn(tc("s2", "final_answer", {"answer": "sunny", "success": True})),
        ],
    )
    asyncio.run(agent.a_run("Delegate it", session_id="p", persist_blocking=True))
    (trace,) = flushed(hook)
    names = [(c["tool_name"], c["call_id"]) for c in trace["tool_calls"]]
    assert ("spawn_sub_agent", "call_1") in names and ("get_weather", "s1") in names
    (sub,) = calls(trace, "spawn_sub_agent")
    assert sub["result"] == "Sub-agent result: sunny" and sub["success"] is True


def test_arun_function_inside_engine_call_is_recorded_once(agent, hook) -> None:
    agent.router.script(
        "One call",
        [turn(tc(1, "get_weather", {"city": "Kyiv"})), turn(tc(2, "final_answer", {"answer": "ok", "success": True}))],
    )
    asyncio.run(agent.a_run("One call", session_id="o", persist_blocking=True))
    (trace,) = flushed(hook)
    (call,) = trace["tool_calls"]
    assert call["layer"] == "engine" and call["function_duration_ms"] <= call["duration_ms"]


def test_arun_function_called_directly_in_a_run_is_a_tool_call(agent, tmp_path) -> None:
    """A tool that calls another tool through arun_function: both are recorded, not merged."""

    async def nested(city: str) -> str:
        return await agent.arun_function("get_weather", city=city)

    agent.add_tool(nested, name="nested_weather")
    hook = hook_into_agent(agent, store=tmp_path / "t")
    try:
        agent.router.script(
            "Nested",
            [
                turn(tc(1, "nested_weather", {"city": "Lima"})),
                turn(tc(2, "final_answer", {"answer": "ok", "success": True})),
            ],
        )
        asyncio.run(agent.a_run("Nested", session_id="n", persist_blocking=True))
        (trace,) = flushed(hook)
    finally:
        hook.unhook()
    assert [(c["tool_name"], c["layer"]) for c in trace["tool_calls"]] == [
        ("nested_weather", "engine"),
        ("get_weather", "function"),
    ]
    inner = trace["tool_calls"][1]
    assert inner["arguments"] == {"city": "Lima"} and inner["result"] == "Weather in Lima: 21C, sunny"


def test_get_ctx_return_value_is_unchanged(agent, hook) -> None:
    agent.router.script("Q", [turn(tc(1, "final_answer", {"answer": "A", "success": True}))])
    result = asyncio.run(agent.a_run("Q", session_id="g", get_ctx=True, persist_blocking=True))
    assert isinstance(result, tuple) and result[0] == "A" and type(result[1]).__name__ == "ExecutionContext"
    agent.router.script("Q2", [turn(tc(2, "final_answer", {"answer": "B", "success": True}))])
    plain = asyncio.run(agent.a_run("Q2 #new-ctx", "g", None, False, 30, False, True))  # get_ctx positional
    assert plain == "B"


def test_a_stream_is_captured_as_one_trace(agent, hook) -> None:
    q = "Stream: weather in Oslo"
    agent.router.thinks = ["Plan: one get_weather call."]
    agent.router.script(
        q,
        [
            turn(tc("o0", "think", {"thought": "look it up"})),
            turn(tc("o1", "get_weather", {"city": "Oslo"})),
            turn(tc("o2", "final_answer", {"answer": "Oslo: 21C", "success": True})),
        ],
    )

    async def main():
        return [c async for c in agent.a_stream(q, session_id="st")]

    chunks = asyncio.run(main())
    assert chunks[-1] == {"type": "done", "agent": "fa_agent", "success": True, "final_answer": "Oslo: 21C"}
    (trace,) = flushed(hook)
    engine = agent._get_execution_engine()
    assert trace["run_id"] == engine._session_last_run["st"]
    assert trace["metadata"]["method"] == "a_stream" and trace["user_query"] == q
    assert trace["final_response"] == "Oslo: 21C" and trace["success"] is True and trace["status"] == "completed"
    assert [(c["tool_name"], c["call_id"], c["layer"]) for c in trace["tool_calls"]] == [
        ("think", "o0", "stream"),
        ("get_weather", "o1", "engine"),
    ]
    assert trace["reasoning_steps"][0]["content"].endswith("Plan: one get_weather call.")
    assert trace["messages"][1] == {"role": "user", "content": q}


def test_a_stream_chunks_pass_through_unchanged(agent, tmp_path) -> None:
    def script():
        agent.router.script(
            "S",
            [
                turn(tc(1, "get_weather", {"city": "Rome"})),
                turn(tc(2, "final_answer", {"answer": "R", "success": True})),
            ],
        )

    async def collect(session: str):
        return [{k: v for k, v in c.items()} async for c in agent.a_stream("S", session_id=session)]

    script()
    bare = asyncio.run(collect("x1"))
    with hook_into_agent(agent, store=tmp_path / "t"):
        script()
        hooked = asyncio.run(collect("x2"))
    assert hooked == bare


def test_a_stream_break_finalises_the_trace(agent, hook) -> None:
    agent.router.script(
        "Long",
        [
            turn(tc(1, "get_weather", {"city": "A"})),
            turn(tc(2, "get_weather", {"city": "B"})),
            turn(tc(3, "final_answer", {"answer": "done", "success": True})),
        ],
    )
    saves_before = agent.saves

    async def main():
        stream = agent.a_stream("Long", session_id="br")
        async for chunk in stream:
            if chunk["type"] == "tool_result":
                break
        await stream.aclose()

    asyncio.run(main())
    assert agent.saves == saves_before + 1  # the agent's own finally ran
    (trace,) = flushed(hook)
    assert trace["metadata"]["closed_early"] is True
    assert [c["call_id"] for c in trace["tool_calls"]] == ["call_1"]


def test_stream_mode_llm_result_is_wrapped_and_still_works(agent, hook) -> None:
    """a_run_llm_completion(stream=True) returns an async-generator function; the host still iterates it."""
    import inspect

    async def main():
        agent.router.thinks = ["alpha beta"]
        # inside a captured run so the call is recorded
        agent.router.script(
            "Think only",
            [turn(tc(1, "think", {"thought": "x"})), turn(tc(2, "final_answer", {"answer": "ok", "success": True}))],
        )
        await agent.a_run("Think only", session_id="t", persist_blocking=True)
        fn = await agent.a_run_llm_completion([{"role": "user", "content": "hi"}], stream=True)  # outside a run
        return inspect.isasyncgenfunction(fn), [x async for x in fn()]

    is_gen, items = asyncio.run(main())
    assert is_gen and items == ["ok", "ok"]
    (trace,) = flushed(hook)
    (think_llm,) = [c for c in trace["llm_calls"] if c["stream"]]
    assert think_llm["output"] == "alpha beta" and think_llm["tokens_in"] == 100
