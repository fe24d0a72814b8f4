"""Each built-in reward on hand-built traces, the real FlowAgent fixtures, and obs-like transcripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.rewards.base import RewardResult
from flowrl.rewards.efficiency import EfficiencyReward
from flowrl.rewards.format import FormatComplianceReward
from flowrl.rewards.syntax import SyntaxValidationReward, check_python
from flowrl.rewards.task_completion import TaskCompletionReward
from flowrl.rewards.tool_success import ToolSuccessReward
from flowrl.trace.load import load_trace
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

FIXTURES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering"
RL_TRACES = FIXTURES / "rl_traces" / "2026-11-22"


def rl_trace(trace_id: str) -> ExecutionTrace:
    path = RL_TRACES / f"{trace_id}.json"
    return load_trace(json.loads(path.read_text()), origin=str(path))


def obs_trace(run: str) -> ExecutionTrace:
    """A trace shaped like what obs ingest gives: the FlowAgent working_history as `messages`, no tool_calls."""
    ctx = json.loads((FIXTURES / "execution_contexts.json").read_text())[run]
    return ExecutionTrace(
        user_query=ctx["query"],
        messages=ctx["working_history"],
        status=ctx["status"],
        source="obs",
        run_id=ctx["run_id"],
        session_id=ctx["session_id"],
    )


def call(name: str, result: str = "ok", success: bool = True, **args) -> ToolCallTrace:
    return ToolCallTrace(tool_name=name, arguments=args, result=result, success=success)


def assistant_call(name: str, arguments: str, call_id: str = "c1") -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


# -- the real fixtures -------------------------------------------------------------------------------


def test_fixture_success_run_scores_full_marks():
    t = rl_trace("0498911e921f")
    assert SyntaxValidationReward().score(t).value == 1.0
    assert ToolSuccessReward().score(t).value == 1.0
    assert TaskCompletionReward().score(t).value == 1.0
    assert FormatComplianceReward().score(t).value == 1.0
    assert EfficiencyReward().score(t).value == 1.0


def test_fixture_failed_tool_and_failed_task():
    t = rl_trace("2a86d8ba994f")
    ts = ToolSuccessReward().score(t)
    assert ts.value == pytest.approx(2 / 3)
    assert ts.details["failed_tools"] == ["fetch_stock"]
    assert TaskCompletionReward().score(t).value == 0.0
    assert SyntaxValidationReward().score(t).value is None  # no code anywhere


def test_fixture_traceback_inside_success_result_is_a_failure():
    t = rl_trace("eb4f7d6913ae")
    r = ToolSuccessReward().score(t)
    assert r.value == 0.5
    assert r.details["failed_tools"] == ["exec_code"]


def test_traceback_in_reported_success_counts_as_failure_even_unmigrated():
    result = "{'success': True, 'output': 'Traceback (most recent call last):\\n  ...\\nIndexError: x', 'error': None}"
    t = ExecutionTrace(
        tool_calls=[call("exec_code", result, True, code="x[3]"), call("exec_code", "{'success': True, 'output': '1'}")]
    )
    r = ToolSuccessReward().score(t)
    assert r.value == 0.5
    assert r.details["reported_success_but_failed"] == ["exec_code"]


def test_dict_result_with_success_false_is_a_failure():
    t = ExecutionTrace(
        tool_calls=[call("exec_code", "{'success': False, 'output': '', 'error': 'boom'}", True, code="1")]
    )
    assert ToolSuccessReward().score(t).value == 0.0


# -- obs-like transcripts (messages only) -------------------------------------------------------------


def test_obs_transcript_tool_success_from_messages():
    r = ToolSuccessReward().score(obs_trace("run2_research"))
    assert r.value == pytest.approx(2 / 3)  # load_tools, get_weather ok; fetch_stock failed; final_answer not counted
    r3 = ToolSuccessReward().score(obs_trace("run3_coding_followup"))
    assert r3.value == 0.5


def test_obs_transcript_think_recorded_twice_counts_once():
    r = ToolSuccessReward().score(obs_trace("run1_coding"))
    assert r.details["calls"] == 2  # think + exec_code, not think twice
    assert r.value == 1.0


def test_obs_transcript_final_answer_flag_decides_task_completion():
    assert TaskCompletionReward().score(obs_trace("run1_coding")).value == 1.0
    r = TaskCompletionReward().score(obs_trace("run2_research"))
    assert r.value == 0.0 and r.details["source"] == "final_answer.success"


def test_obs_transcript_format_reads_the_final_answer_call():
    r = FormatComplianceReward().score(obs_trace("run1_coding"))
    assert r.value == 1.0
    assert r.details["checks"]["json_arguments"] == 1.0


def test_obs_transcript_syntax_checks_code_and_argument_json():
    r = SyntaxValidationReward().score(obs_trace("run3_coding_followup"))
    assert r.value == 1.0
    assert r.details["counts"]["python"]["checked"] == 2
    assert r.details["counts"]["json_args"]["checked"] == 3


# -- syntax -------------------------------------------------------------------------------------------


def test_syntax_python_blocks():
    good = ExecutionTrace(final_response="```python\ndef f(x):\n    return x + 1\n```")
    bad = ExecutionTrace(final_response="```python\ndef f(x)\n    return x + 1\n```")
    assert SyntaxValidationReward().score(good).value == 1.0
    r = SyntaxValidationReward().score(bad)
    assert r.value == 0.0 and "line 1" in r.details["errors"][0]


def test_syntax_allows_top_level_await_and_ipython_magics():
    assert check_python("import asyncio\nawait asyncio.sleep(0)") is None
    assert check_python("%pip install numpy\n!ls -la\nx = 1") is None


def test_syntax_shell_via_bash_n():
    reward = SyntaxValidationReward()
    if reward.bash is None:
        pytest.skip("bash is not installed")
    ok = ExecutionTrace(final_response='```bash\nfor f in *.txt; do echo "$f"; done\n```')
    broken = ExecutionTrace(final_response="```bash\nif [ -f x ]; then echo hi\n```")
    assert reward.score(ok).value == 1.0
    assert reward.score(broken).value == 0.0


def test_syntax_shell_is_parsed_not_run(tmp_path):
    reward = SyntaxValidationReward()
    if reward.bash is None:
        pytest.skip("bash is not installed")
    marker = tmp_path / "ran"
    t = ExecutionTrace(tool_calls=[call("vfs_shell", command=f"touch {marker}")])
    assert reward.score(t).value == 1.0
    assert not marker.exists()


def test_syntax_invalid_tool_argument_json():
    t = ExecutionTrace(messages=[{"role": "user", "content": "hi"}, assistant_call("get_weather", '{"city": "Berlin"')])
    r = SyntaxValidationReward().score(t)
    assert r.value == 0.0
    assert "json_args" in r.details["errors"][0]


def test_syntax_json_block_and_untagged_block_ignored():
    t = ExecutionTrace(final_response='```json\n{"a": 1}\n```\n```\nnot code at all (\n```')
    r = SyntaxValidationReward().score(t)
    assert r.value == 1.0 and r.details["counts"] == {"json": {"checked": 1, "valid": 1}}


def test_syntax_none_for_prose():
    r = SyntaxValidationReward().score(ExecutionTrace(final_response="Paris is the capital of France."))
    assert r.value is None and "reason" in r.details


# -- tool success ---------------------------------------------------------------------------------------


def test_tool_success_none_without_tool_calls():
    assert ToolSuccessReward().score(ExecutionTrace(final_response="hi")).value is None


def test_tool_success_none_when_calls_have_no_results():
    t = ExecutionTrace(messages=[{"role": "user", "content": "x"}, assistant_call("get_weather", '{"city": "Rome"}')])
    r = ToolSuccessReward().score(t)
    assert r.value is None and r.details["reason"] == "no tool results to judge"


def test_tool_success_error_prefixes():
    t = ExecutionTrace(
        tool_calls=[
            call("a", "System-Error: Invalid JSON in tool arguments"),
            call("b", "Error: Tool 'b' war noch nicht geladen"),
            call("c", "fine"),
        ]
    )
    assert ToolSuccessReward().score(t).value == pytest.approx(1 / 3)


def test_tool_success_final_answer_is_not_a_tool():
    t = ExecutionTrace(tool_calls=[call("final_answer", "done", answer="x", success=False)])
    assert ToolSuccessReward().score(t).value is None


# -- task completion ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"final_response": "Error: something broke", "status": "completed"}, 0.0),
        ({"final_response": "partial", "status": "max_iterations"}, 0.0),
        ({"final_response": "ok", "status": "cancelled"}, 0.0),
        ({"final_response": "ok", "success": True}, 1.0),
        ({"final_response": "ok", "success": False}, 0.0),
        ({"final_response": "ok", "status": "completed"}, 1.0),
        ({"final_response": "ok", "status": "running"}, None),
        ({"final_response": "just text"}, None),
        ({"final_response": ""}, None),
    ],
)
def test_task_completion_rules(kwargs, expected):
    assert TaskCompletionReward().score(ExecutionTrace(**kwargs)).value == expected


def test_task_completion_final_answer_flag_beats_status():
    t = ExecutionTrace(
        status="completed",
        messages=[
            {"role": "user", "content": "q"},
            assistant_call("final_answer", '{"answer": "no", "success": false}'),
        ],
    )
    assert TaskCompletionReward().score(t).value == 0.0


def test_task_completion_max_iterations_beats_success_flag():
    t = ExecutionTrace(status="max_iterations", success=True, final_response="x")
    assert TaskCompletionReward().score(t).value == 0.0


# -- efficiency -------------------------------------------------------------------------------------------


def test_efficiency_budgets():
    r = EfficiencyReward(max_tool_calls=2).score(ExecutionTrace(tool_calls=[call("t", x=i) for i in range(4)]))
    assert r.details["scores"]["tool_calls"] == 0.5
    assert r.value < 1.0


def test_efficiency_repeated_identical_calls_penalised():
    same = [call("search", q="paris") for _ in range(3)]
    varied = [call("search", q=q) for q in ("paris", "rome", "oslo")]
    a = EfficiencyReward().score(ExecutionTrace(tool_calls=same))
    b = EfficiencyReward().score(ExecutionTrace(tool_calls=varied))
    assert a.details["repeated_calls"] == 2 and b.details["repeated_calls"] == 0
    assert a.value == pytest.approx(b.value - 0.3)


def test_efficiency_tokens_and_duration():
    t = ExecutionTrace(final_response="x", total_tokens_in=60000, total_tokens_out=4000, execution_duration_ms=240000)
    r = EfficiencyReward(max_tokens=32000, max_output_tokens=2000, max_duration_ms=120000).score(t)
    assert r.details["scores"]["tokens"] == 0.5
    assert r.details["scores"]["output_tokens"] == 0.5
    assert r.details["scores"]["duration_ms"] == 0.5


def test_efficiency_zero_tokens_mean_unknown():
    t = ExecutionTrace(final_response="short", total_tokens_in=0, total_tokens_out=0)
    r = EfficiencyReward().score(t)
    assert "tokens" not in r.details["used"]
    assert r.details["used"]["output_tokens"] == 1  # estimated from the text


def test_efficiency_none_on_empty_trace():
    assert EfficiencyReward().score(ExecutionTrace()).value is None


# -- format ---------------------------------------------------------------------------------------------


def test_format_clean_answer():
    assert FormatComplianceReward().score(ExecutionTrace(final_response="The answer is 42.")).value == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "<think>hmm</think>The answer is 42.",
        "The answer <|im_end|>",
        'Sure. <tool_call>{"name": "x"}</tool_call>',
        'I will call {"name": "get_weather", "arguments": {"city": "Rome"}}',
        "[TOOL_CALLS] get_weather",
    ],
)
def test_format_leaks_are_penalised(answer):
    r = FormatComplianceReward().score(ExecutionTrace(final_response=answer))
    assert r.value is not None and r.value < 1.0


def test_format_markup_inside_code_is_not_a_leak():
    t = ExecutionTrace(final_response="Use this:\n```xml\n<think>example</think>\n```\nand `<tool_call>` literally.")
    assert FormatComplianceReward().score(t).value == 1.0


def test_format_allowed_tags():
    t = ExecutionTrace(final_response="<think>plan</think>42")
    assert FormatComplianceReward(allow_tags=["think"]).score(t).value == 1.0


def test_format_empty_answer_scores_zero():
    t = ExecutionTrace(final_response="   ", status="completed", tool_calls=[call("a")])
    assert FormatComplianceReward().score(t).value == 0.0


def test_format_invalid_json_arguments():
    t = ExecutionTrace(
        final_response="done",
        messages=[
            {"role": "user", "content": "q"},
            assistant_call("a", "{bad json", "c1"),
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
            assistant_call("b", '{"ok": true}', "c2"),
            {"role": "tool", "tool_call_id": "c2", "content": "y"},
            {"role": "assistant", "content": "done"},
        ],
    )
    r = FormatComplianceReward().score(t)
    assert r.details["checks"]["json_arguments"] == 0.5
    assert r.value == pytest.approx(3.5 / 4)


def test_format_turn_that_only_calls_a_tool_is_judged_on_json():
    t = ExecutionTrace(messages=[{"role": "user", "content": "q"}, assistant_call("get_weather", '{"city": "Rome"}')])
    r = FormatComplianceReward().score(t)
    assert r.value == 1.0 and "non_empty" not in r.details["checks"]


def test_format_none_when_nothing_to_check():
    assert FormatComplianceReward().score(ExecutionTrace()).value is None


# -- contract ----------------------------------------------------------------------------------------------


def test_reward_result_clamps_and_nan_is_none():
    assert RewardResult(1.5).value == 1.0
    assert RewardResult(-1).value == 0.0
    assert RewardResult(float("nan")).value is None


def test_score_batch_matches_score():
    traces = [rl_trace(i) for i in ("0498911e921f", "2a86d8ba994f", "eb4f7d6913ae")]
    for reward in (
        SyntaxValidationReward(),
        ToolSuccessReward(),
        TaskCompletionReward(),
        EfficiencyReward(),
        FormatComplianceReward(),
    ):
        assert [r.value for r in reward.score_batch(traces)] == [reward.score(t).value for t in traces]
