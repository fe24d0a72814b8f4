"""GroundingReward: the answer carries what the last tool returned (reference-free); None where it cannot judge."""

from __future__ import annotations

from flowrl.rewards.config import DEFAULT_WEIGHTS, REGISTRY
from flowrl.rewards.grounding import GroundingReward, tool_value
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace


def run(answer: str, *results: str, failed: bool = False) -> ExecutionTrace:
    calls = [ToolCallTrace(tool_name="exec_code", arguments={"code": "x"}, result=r, success=not failed)
             for r in results]  # fmt: skip
    return ExecutionTrace(trace_id="t", user_query="What is 17 * 6?", tool_calls=calls, final_response=answer)


def value(trace: ExecutionTrace) -> float | None:
    return GroundingReward().score(trace).value


def test_the_answer_is_judged_on_the_last_value_a_tool_returned() -> None:
    flowagent = "{'success': True, 'output': '102', 'error': None}"  # FlowAgent's exec_code result, as text
    assert value(run("The answer is 102.", flowagent)) == 1.0
    assert value(run("102.0", flowagent)) == 1.0  # the reference match's own number rule
    assert value(run("The answer is 6.", "6", flowagent)) == 0.0  # the lookup's value, not the computed one
    assert value(run("It is 1020.", flowagent)) == 0.0  # a longer number is another number
    assert value(run("The capital is Lima.", "Lima")) == 1.0
    assert value(run("Paris", '{"result": "Paris"}')) == 1.0  # JSON dicts too


def test_none_where_no_tool_value_can_be_judged() -> None:
    assert value(run("102")) is None  # no tool call
    assert value(run("102", "Error executing exec_code: boom", failed=True)) is None
    assert value(run("", "102")) is None  # no answer
    assert value(run("x", "y" * 500)) is None  # a document is not something an answer repeats
    assert value(run("x", "{'success': True, 'output': '', 'error': None}")) is None


def test_hostile_tool_results_are_read_as_text() -> None:
    deep = "{" * 50_000 + "}" * 50_000
    assert tool_value(deep) == deep  # too long to parse: kept as text, never evaluated
    assert tool_value("{__import__('os').system('true')}") == "{__import__('os').system('true')}"
    assert tool_value("{'a': " * 200 + "1" + "}" * 200) is None  # parsed, never raised: no value field


def test_it_is_registered_and_off_in_the_default_engine() -> None:
    assert REGISTRY["grounding"].enabled is False and "grounding" not in DEFAULT_WEIGHTS
