"""flowrl.trace.transcript, the one reader and writer of the chat format: its rules one by one, that the old
places use it, and that one FlowAgent run captured live and ingested from its files is one trace."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowrl.capture import assemble, hook_into_agent
from flowrl.ingest import ingest_paths
from flowrl.ingest import transcript as ingest_transcript
from flowrl.rewards import views
from flowrl.rewards.engine import RewardEngine
from flowrl.store.files import TraceStore
from flowrl.trace import conversation, facts
from flowrl.trace import transcript as tr
from flowrl.trace.conversation import trace_conversation
from flowrl.trace.load import load_trace
from flowrl.trace.schema import SCHEMA_VERSION, ExecutionTrace, ToolCallTrace
from tests.fakes import flowagent_files as samples
from tests.fakes import flushed
from tests.fakes.fake_flowagent import make_agent, tc, turn

# -- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ('{"city": "Paris"}', {"city": "Paris"}),  # JSON
        ("[1, 2]", [1, 2]),  # any JSON value
        ("{'thought': 'plan', 'n': 1}", {"thought": "plan", "n": 1}),  # a Python repr (FlowAgent obs think args)
        ('{"city": "Paris"', '{"city": "Paris"'),  # neither: the raw string, so a reward can see it
        ("search cats", "search cats"),
        ("", {}),
        ("  ", {}),
        (None, {}),
        ("null", {}),
        ({"a": 1}, {"a": 1}),
    ],
)
def test_parse_arguments_json_then_python_literal_then_raw(raw: Any, parsed: Any) -> None:
    assert tr.parse_arguments(raw) == parsed


def test_parse_arguments_copies_a_dict_and_never_evaluates_code() -> None:
    args = {"a": 1}
    assert tr.parse_arguments(args) is not args
    assert tr.parse_arguments("{'a': __import__('os').getcwd()}") == "{'a': __import__('os').getcwd()}"


def test_arguments_json_writes_json_text_and_keeps_a_string() -> None:
    assert tr.arguments_json({"q": "cats", "n": 1}) == '{"q": "cats", "n": 1}'
    assert tr.arguments_json("{bad json") == "{bad json"
    assert tr.arguments_json(None) == "{}"


# -- tool calls in any shape ----------------------------------------------------------------------


@dataclass
class _Fn:
    name: str
    arguments: str


@dataclass
class _Call:
    id: str
    function: _Fn


@pytest.mark.parametrize(
    "call",
    [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},  # OpenAI nested
        {"id": "c1", "name": "f", "arguments": '{"a": 1}'},  # flat
        _Call("c1", _Fn("f", '{"a": 1}')),  # an SDK object
    ],
)
def test_tool_call_parts_of_every_shape(call: Any) -> None:
    assert tr.tool_call_parts(call) == ("f", '{"a": 1}', "c1")
    assert tr.openai_tool_call(call) == {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1}'},
    }


# -- stored messages ------------------------------------------------------------------------------


def test_canonical_messages_one_call_shape_and_the_first_result_per_id() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "name": "think", "arguments": {"thought": "x"}},
                {"id": "c2", "name": "f", "arguments": "{bad"},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "think", "content": "first"},
        {"role": "tool", "tool_call_id": "c1", "name": "think", "content": "second"},
        {"role": "tool", "tool_call_id": "c2", "name": "f", "content": "ok", "extra": 1},
    ]
    out = tr.canonical_messages(messages)
    assert out[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "think", "arguments": '{"thought": "x"}'}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{bad"}},  # what the model wrote
    ]
    assert [m.get("content") for m in out[2:]] == ["first", "ok"]
    assert out[3]["extra"] == 1 and out[1]["content"] is None  # other keys as they were
    assert tr.canonical_messages(out) == out  # idempotent
    assert messages[1]["tool_calls"][0]["arguments"] == {"thought": "x"}  # the input is not touched


def test_synthesis_one_call_id_convention_from_one() -> None:
    calls = [
        ToolCallTrace(tool_name="search", arguments={"q": "cats"}, result="3 hits"),
        ToolCallTrace(tool_name="calc", arguments={"e": "1+1"}, result="2", call_id="own"),
    ]
    msgs = tr.synthesize_messages("cats?", calls, "two")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert msgs[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "cats"}'}}
    ]
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "name": "search", "content": "3 hits"}
    assert msgs[3]["tool_calls"][0]["id"] == "own" and msgs[-1] == {"role": "assistant", "content": "two"}
    assert tr.synthesize_messages("q", calls, "")[-1]["role"] == "tool"  # no empty answer after calls
    assert tr.synthesize_messages("q", [], "") == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": ""},
    ]


def test_transcript_calls_match_results_by_id_else_by_name() -> None:
    msgs = [
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "first"},
        {"role": "tool", "tool_call_id": "a", "content": "again"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "name": "g", "content": [{"type": "text", "text": "parts"}]},
    ]
    calls = tr.transcript_calls(msgs)
    assert [(c.name, c.call_id, c.result, c.message_index) for c in calls] == [
        ("f", "a", "first", 0),
        ("g", None, "parts", 3),
    ]


def test_final_answer_call_then_final_response_then_last_assistant_text() -> None:
    fa = [
        {"role": "assistant", "content": "thinking aloud"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "x", "function": {"name": "final_answer", "arguments": '{"answer": "42", "success": true}'}}
            ],
        },
    ]
    assert tr.final_answer_args(fa) == {"answer": "42", "success": True}
    assert tr.final_answer(fa, "forty-two") == "42"
    assert tr.final_answer(fa[:1], "forty-two") == "forty-two"
    assert tr.final_answer(fa[:1], "") == "thinking aloud"
    assert tr.final_answer([], "") == ""


def test_normalize_message_is_the_chat_template_shape() -> None:
    m = tr.normalize_message({"role": "function", "name": "f", "content": None, "tool_call_id": 7, "x": 1})
    assert m == {"role": "tool", "content": "", "tool_call_id": "7", "name": "f"}
    a = tr.normalize_message({"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{'a': 1}"}]})
    assert a["tool_calls"] == [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]


# -- the schema upgrade ---------------------------------------------------------------------------


def test_upgrade_synthesises_messages_for_a_trace_without_a_transcript() -> None:
    data = {
        "schema_version": 1,
        "trace_id": "t1",
        "user_query": "weather?",
        "final_response": "sunny",
        "tool_calls": [{"tool_name": "get_weather", "arguments": {"city": "Paris"}, "result": "21C"}],
    }
    t = load_trace(data)
    assert t.schema_version == SCHEMA_VERSION == 3
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert t.tool_calls[0].call_id == "call_1" == t.messages[1]["tool_calls"][0]["id"]
    assert t.metadata["transcript"] == "synthesized" and tr.is_synthesized(t.metadata)
    assert "call_id" not in data["tool_calls"][0] and "messages" not in data  # the input dict is untouched
    assert load_trace({"trace_id": "empty"}).messages == []  # nothing to build a transcript from


def test_upgrade_gives_a_recorded_transcript_one_shape_and_keeps_it_unmarked() -> None:
    t = load_trace(
        {
            "schema_version": 1,
            "trace_id": "t2",
            "user_query": "q",
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "name": "f", "arguments": {"a": 1}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        }
    )
    assert t.messages[1]["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1}'},
    }
    assert len(t.messages) == 3 and "transcript" not in t.metadata


# -- one owner --------------------------------------------------------------------------------------


def test_the_old_places_call_this_module() -> None:
    assert facts.parse_arguments is tr.parse_arguments is ingest_transcript.parse_arguments  # views reads facts
    assert assemble.tool_call_parts is tr.tool_call_parts
    assert ingest_transcript.dedup_tool_results is tr.dedup_tool_results
    assert conversation.normalize_message is tr.normalize_message
    assert conversation.normalize_tool_call is tr.normalize_tool_call
    assert conversation.synthesize_tools is tr.synthesize_tools
    for gone in ("parse_args", "_dedupe_messages", "_synthesize_messages", "_final_answer_in"):
        assert not hasattr(assemble, gone)
    assert not hasattr(views, "_message_calls") and not hasattr(conversation, "_arguments")


def test_rewards_do_not_read_a_synthesised_transcript_as_what_the_model_wrote() -> None:
    t = load_trace(
        {
            "schema_version": 1,
            "trace_id": "t3",
            "user_query": "q",
            "final_response": "a",
            "llm_calls_count": 1,
            "tool_calls": [{"tool_name": "f", "arguments": {"x": 1}, "result": "ok"}],
        }
    )
    assert t.messages and views.message_tool_calls(t) == []
    assert views.assistant_turns(t) == 1  # the LLM call count, not the synthesised assistant messages
    assert [v.name for v in views.tool_calls(t)] == ["f"]
    assert trace_conversation(t).synthesized


def test_tool_calls_view_adds_transcript_calls_no_entry_records_but_never_twice() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "think", "arguments": '{"thought": "t"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "think", "content": "ok"},
        {"role": "assistant", "tool_calls": [{"id": "c2", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c2", "name": "f", "content": "done"},
    ]
    by_id = ExecutionTrace(
        messages=msgs, tool_calls=[ToolCallTrace(tool_name="f", arguments={"a": 1}, result="done", call_id="c2")]
    )
    assert [(v.name, v.result) for v in views.tool_calls(by_id)] == [("think", "ok"), ("f", "done")]
    no_id = ExecutionTrace(messages=msgs, tool_calls=[ToolCallTrace(tool_name="f", arguments={"a": 1}, result="done")])
    assert [v.name for v in views.tool_calls(no_id)] == ["think", "f"]


# -- acceptance: one FlowAgent run, captured live and ingested from its files -----------------------

QUERY = "Weather in Berlin, the ACME quote, and the sum of squares 1..10?"


def _script(agent: Any) -> None:
    agent.router.thinks = ["Assessment: three lookups. Load the tools first."]
    agent.router.script(
        QUERY,
        [
            turn(tc(1, "think", {"thought": "Load get_weather and fetch_stock, then compute."})),
            turn(tc(2, "load_tools", {"tools": ["get_weather", "fetch_stock"]})),
            turn(
                tc(3, "get_weather", {"city": "Berlin"}),
                tc(4, "fetch_stock", {"symbol": "ACME"}),
                content="Fetching both.",
            ),
            turn(tc(5, "exec_code", {"code": "print(sum(i*i for i in range(1, 11)))"})),
            turn(
                tc(
                    6,
                    "final_answer",
                    {"answer": "Berlin: 21C, sunny; ACME unavailable; the sum is 385.", "success": False},
                )
            ),
        ],
    )


def _record_llm_inputs(agent: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every LLM call's input messages, as FlowAgent's ObservabilityLayer sees them: main-loop calls
    (`final_answer` among the tools), think streams, and the rest (the run summary)."""
    seen: list[tuple[str, list[dict[str, Any]]]] = []
    router = agent.router
    complete, stream = router.complete, router.stream

    async def recording_complete(**kw: Any) -> Any:
        main = any((t.get("function") or {}).get("name") == "final_answer" for t in kw.get("tools") or ())
        seen.append(("main" if main else "other", [dict(m) for m in kw["messages"]]))
        return await complete(**kw)

    def recording_stream(**kw: Any) -> Any:
        seen.append(("think", [dict(m) for m in kw["messages"]]))
        return stream(**kw)

    router.complete, router.stream = recording_complete, recording_stream
    return seen


def _write_flowagent_files(
    agent: Any, run_id: str, llm_inputs: list[tuple[str, list[dict[str, Any]]]], duration_s: float, data_dir: Path
) -> None:
    """What toolboxv2 0.1.28 leaves on disk for this run (the fake agent writes no files of its own):
    the checkpoint with the session's chat_history, and the obs `run_{id}.json` laid out as the fixture
    `run_2c4cbe40.json` is. One step per main-loop iteration; a step's `llm.input_messages` are those of
    its last LLM call (the think stream in a think step; in the last step the run-summary call, whose input
    0.1.28 builds from the working history plus its own prompt); tool records as FlowAgent writes them
    (think's arguments as a repr, its result recorded twice, the second time without arguments)."""
    engine = agent._get_execution_engine()
    ctx = engine._active_executions[run_id]
    history = ctx.working_history
    results: dict[str, str] = {}
    for m in history:
        if m["role"] == "tool":
            results.setdefault(m["tool_call_id"], m["content"])
    step_inputs: list[list[dict[str, Any]]] = []
    for kind, msgs in llm_inputs:
        if kind == "main":
            step_inputs.append(msgs)
        elif kind == "think":
            step_inputs[-1] = msgs
    turns = [m for m in history if m["role"] == "assistant"]
    assert len(turns) == len(step_inputs)
    step_inputs[-1] = [dict(m) for m in history] + [{"role": "user", "content": "<internal prompt: run summary>"}]
    t0 = 1795366182.0
    per_step = 100 * len(turns)
    steps = []
    for k, (assistant, inputs) in enumerate(zip(turns, step_inputs)):
        t = t0 + k
        records = []
        for call in assistant.get("tool_calls") or ():
            name, raw = call["function"]["name"], call["function"]["arguments"]
            result = results.get(call["id"], "break loop")
            record = {
                "name": name,
                "args_summary": repr(json.loads(raw)) if name == "think" else raw,
                "t_start": t + 0.1,
                "t_end": t + 0.4,
                "duration_s": 0.3,
                "result_summary": result,
                "status": "error" if result.startswith("Error") else "ok",
                "error": "",
            }
            records.append(record)
            if name == "think":
                records.append({**record, "args_summary": ""})
        steps.append(
            {
                "step_id": k + 1,
                "t_start": t,
                "t_end": t + 0.5,
                "duration_s": 0.5,
                "tool_calls": records,
                "llm": {
                    "model": "mock/fast",
                    "t_start": t,
                    "t_end": t + 0.1,
                    "duration_s": 0.1,
                    "tokens_in": 100,
                    "tokens_out": 10,
                    "input_messages": inputs,
                    "output_text": "",
                },
                "vfs_deltas": [],
                "compression": None,
            }
        )
    answer = json.loads(turns[-1]["tool_calls"][0]["function"]["arguments"])
    assert per_step <= agent.total_tokens_in
    samples.write_obs_run(
        data_dir / "Agents" / agent.amd.name / "obs",
        {
            "run_id": run_id,
            "agent_name": agent.amd.name,
            "query": ctx.query,
            "session_id": ctx.session_id,
            "t_start": t0,
            "t_end": t0 + duration_s,
            "duration_s": duration_s,
            "total_tokens_in": agent.total_tokens_in,
            "total_tokens_out": agent.total_tokens_out,
            "total_iterations": len(steps),
            "success": answer["success"],
            "final_answer_summary": answer["answer"],
            "steps": steps,
        },
    )
    session = agent.session_manager.sessions[ctx.session_id]
    samples.write_checkpoint(
        data_dir / "Agents" / "checkpoint" / agent.amd.name,
        samples.v2_checkpoint(agent.amd.name, {ctx.session_id: session.history}),
    )


def test_a_run_captured_live_and_ingested_from_its_checkpoint_is_one_trace(tmp_path: Path) -> None:
    """The two paths agree on the transcript exactly (the same messages, canonical shape, think result once),
    on the tool calls with their arguments and results, on the answer and on every reward value.

    What may differ, and why: the live trace has the agent's own timings and every LLM call (5 here, the
    think stream and the run summary included), the ingested one the obs file's per-step record (one call
    per step); capture lists `think` among `tool_calls` while ingest keeps it a reasoning step only, as
    toolboxv2's rl module does (the reward views add transcript calls that `tool_calls` lacks, so both
    count it). Neither changes a reward value. The tool schemas offered (`tools`) are seen live in each LLM
    call's arguments; FlowAgent's files do not keep them (the checkpoint's tool registry lacks the engine's
    own tools and the per-call slots), so a dataset row gets the same messages but ingest's schemas are
    synthesised from the calls."""
    agent = make_agent("fa_agent")
    _script(agent)
    llm_inputs = _record_llm_inputs(agent)
    hook = hook_into_agent(agent, store=tmp_path / "live")
    try:
        started = time.perf_counter()
        answer = asyncio.run(agent.a_run(QUERY, session_id="research", persist_blocking=True))
        duration_s = time.perf_counter() - started
        (live_dict,) = flushed(hook)
    finally:
        hook.unhook()
    live = load_trace(live_dict)
    _write_flowagent_files(agent, live.run_id, llm_inputs, duration_s, tmp_path / "data")
    store = TraceStore(tmp_path / "ingested")
    assert ingest_paths([tmp_path / "data"], store).new == 1
    (ingested,) = store.iter_traces()

    assert (live.source, ingested.source) == ("live", "checkpoint")
    assert live.run_id == ingested.run_id and live.user_query == ingested.user_query == QUERY
    assert live.messages == ingested.messages
    assert [m["role"] for m in live.messages].count("tool") == 5  # think (once), load_tools, weather, stock, code
    conv_live, conv_ingested = trace_conversation(live), trace_conversation(ingested)
    assert (conv_live.messages, conv_live.prompt_end) == (conv_ingested.messages, conv_ingested.prompt_end)

    def calls(t: ExecutionTrace) -> list[tuple[Any, ...]]:
        return [(v.name, v.arguments, v.result, v.failed) for v in views.tool_calls(t, include_control=True)]

    assert calls(live) == calls(ingested)
    assert [c[0] for c in calls(live)] == [
        "think",
        "load_tools",
        "get_weather",
        "fetch_stock",
        "exec_code",
        "final_answer",
    ]
    assert [c[3] for c in calls(live)][:5] == [False, False, False, True, False]
    assert (
        answer
        == live.final_response
        == ingested.final_response
        == views.answer_text(live)
        == views.answer_text(ingested)
    )
    assert (live.success, ingested.success) == (False, False)
    assert [r.content for r in live.reasoning_steps] == [r.content for r in ingested.reasoning_steps]

    engine = RewardEngine()
    try:
        got_live, got_ingested = engine.compute_all(live), engine.compute_all(ingested)
    finally:
        engine.close()
    assert set(got_live) == set(got_ingested) and len(got_live) >= 6
    assert {k: r.value for k, r in got_live.items()} == {k: r.value for k, r in got_ingested.items()}
    assert got_live["task_completion"].value == 0.0 and got_live["tool_success"].value < 1.0
