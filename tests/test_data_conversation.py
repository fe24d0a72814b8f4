"""Traces as chats: normalisation, synthesis for traces without messages, the prompt boundary."""

from __future__ import annotations

import json
from pathlib import Path

from flowrl.store.files import TraceStore
from flowrl.trace.conversation import (
    find_prompt_end,
    fit_trajectory,
    message_chars,
    normalize_message,
    normalize_query,
    trace_conversation,
)
from flowrl.trace.schema import ExecutionTrace

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


def test_openai_tool_call_arguments_become_a_dict_and_content_a_string() -> None:
    m = normalize_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            "extra": 1,
        }
    )
    assert m == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
    }
    as_string = normalize_message(
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}, "string"
    )
    assert as_string["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # flowrl.trace.transcript.arguments_json


def test_unparseable_arguments_are_kept_as_text() -> None:
    m = normalize_message({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]})
    assert m["tool_calls"][0]["function"]["arguments"] == "not json"


def test_rl_traces_import_without_messages_gets_a_synthesised_conversation() -> None:
    trace = TraceStore.read_file(RL_TRACES / "2026-11-22" / "0498911e921f.json")
    assert trace.metadata["transcript"] == "synthesized"  # the schema upgrade synthesised its messages
    conv = trace_conversation(trace)
    assert conv.synthesized
    roles = [m["role"] for m in conv.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert conv.prompt == [{"role": "user", "content": trace.user_query}]
    call = conv.messages[1]["tool_calls"][0]["function"]
    assert call["name"] == "exec_code" and "code" in call["arguments"]
    assert conv.messages[-1]["content"] == trace.final_response
    # the tools offered are unknown: minimal schemas are synthesised from the calls
    assert conv.tools and conv.tools[0]["function"]["name"] == "exec_code"
    assert conv.tools[0]["function"]["parameters"]["properties"] == {"code": {"type": "string"}}


def test_prompt_ends_at_this_runs_user_turn_after_history() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "New question?"},
        {"role": "assistant", "content": "new answer"},
        {"role": "user", "content": "<internal follow-up>"},
    ]
    assert find_prompt_end(messages, "new question") == 4
    assert find_prompt_end(messages, "") == 4  # the last answered user turn
    trace = ExecutionTrace(user_query="New question?", messages=messages)
    conv = trace_conversation(trace)
    assert [m["content"] for m in conv.trajectory] == ["new answer"]  # trailing follow-up dropped
    assert conv.assistant_indices() == [4]


def test_flowagent_style_transcript_with_several_system_messages() -> None:
    messages = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_5",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_5", "name": "get_weather", "content": "21C"},
        {"role": "assistant", "content": "21C in Berlin"},
    ]
    conv = trace_conversation(ExecutionTrace(user_query="weather?", messages=messages))
    assert conv.prompt_end == 3 and conv.assistant_indices() == [3, 5] and conv.has_tool_calls
    assert conv.messages[4] == {"role": "tool", "content": "21C", "tool_call_id": "call_5", "name": "get_weather"}


def test_trace_without_tool_calls() -> None:
    conv = trace_conversation(ExecutionTrace(user_query="hi", final_response="hello"))
    assert (
        [m["role"] for m in conv.messages] == ["user", "assistant"] and not conv.has_tool_calls and conv.tools is None
    )


def test_fit_trajectory_cuts_at_an_assistant_boundary() -> None:
    traj = [
        {"role": "assistant", "content": "a" * 10},
        {"role": "tool", "content": "t" * 100},
        {"role": "assistant", "content": "b" * 10},
    ]
    assert fit_trajectory(traj, 1000) == traj
    assert fit_trajectory(traj, 50) == traj[:1]  # the tool result alone is over budget
    assert fit_trajectory(traj, 5) == []
    assert message_chars(traj) == 120


def test_normalize_query() -> None:
    assert normalize_query("  What is  2+2?? ") == normalize_query("what is 2+2") == "what is 2+2"


def test_fixture_files_still_load() -> None:
    for path in (RL_TRACES / "2026-11-22").glob("*.json"):
        conv = trace_conversation(TraceStore.read_file(path))
        assert conv.prompt_end == 1 and conv.assistant_indices(), json.dumps(conv.messages)[:200]
