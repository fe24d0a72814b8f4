"""GroundingReward: the run uses only numbers it was given or found, and its answer says what its last tool returned
(reference-free); None where nothing can be checked. The failures are the production benchmark's wrong runs."""

from __future__ import annotations

from flowrl.rewards.config import DEFAULT_WEIGHTS, REGISTRY
from flowrl.rewards.grounding import GroundingReward, numbers, tool_value
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

RESULT = "{'success': True, 'output': '%s', 'error': None}"  # FlowAgent's exec_code result, as text


OFFERED = [{"type": "function", "function": {"name": "exec_code", "parameters": {}}}]


def run(query: str, answer: str, *calls: tuple[str, str], failed: bool = False) -> ExecutionTrace:
    tools = [ToolCallTrace(tool_name="exec_code", arguments={"code": code}, result=result, success=not failed)
             for code, result in calls]  # fmt: skip
    return ExecutionTrace(trace_id="t", user_query=query, tool_calls=tools, final_response=answer, tools=OFFERED)


def judged(trace: ExecutionTrace) -> tuple[float | None, str | None]:
    result = GroundingReward().score(trace)
    return result.value, result.details.get("failed")


def test_a_run_that_computes_from_the_query_and_reports_the_result_is_grounded() -> None:
    assert judged(run("What is 17 * 6?", "The answer is 102.", ("print(17 * 6)", RESULT % 102))) == (1.0, None)
    assert judged(run("What is 17 * 6?", "102.0", ("print(17 * 6)", RESULT % 102))) == (1.0, None)
    lookup = run("Capital of Peru?", "The capital is Lima.", ("lookup('peru')", "Lima"))
    assert judged(lookup) == (1.0, None)
    two_steps = run("Atomic number of carbon times 17?", "It is 102.", ("find('carbon')", "6"),
                    ("print(6 * 17)", RESULT % 102))  # fmt: skip
    assert judged(two_steps) == (1.0, None)  # 6 came from the first tool


def test_the_benchmarks_wrong_runs_fail_it() -> None:
    # a number stated with a calculator at hand and no call to it: "7936 - 2133 = 1188"
    assert judged(run("What is 7936 - 2133?", "7936 - 2133 = 1188")) == (0.0, "unfounded_answer")
    # a plain chat model, no tools: its numbers are what it knows, not questioned
    chat = ExecutionTrace(trace_id="t", user_query="What is 4 + 5?", final_response="9")
    assert judged(chat) == (None, None)
    # the prompt's example code copied: 2 and 3 are in neither the query nor a tool result
    copied = run("What is the atomic number of thallium?", "5", ("print(2 + 3)", RESULT % 5))
    assert judged(copied) == (0.0, "unfounded_input")
    # the tool said 102, the answer says 6
    ignored = run("Atomic number of carbon times 17?", "6", ("find('carbon')", "6"), ("print(6 * 17)", RESULT % 102))
    assert judged(ignored) == (0.0, "ignores_tool")


def test_none_where_nothing_can_be_checked() -> None:
    assert judged(run("Capital of Peru?", "Lima")) == (None, None)  # no tool, no number
    assert judged(run("What is 2 + 2?", "")) == (None, None)  # no answer
    assert judged(run("Q", "x", ("fetch()", "y" * 500)))[0] is None  # a document is not something to repeat
    assert judged(run("Q", "x", ("go()", "Error executing go: boom"), failed=True))[0] is None


def test_numbers_are_values_and_settings_are_not_data() -> None:
    assert numbers("1,024 items, 5.0 and 7th") == {1024.0, 5.0}
    search = ExecutionTrace(trace_id="t", user_query="weather in Rome?", final_response="Sunny in Rome.",
                            tool_calls=[ToolCallTrace(tool_name="search", arguments={"q": "Rome", "top_k": 5},
                                                      result="Sunny")])  # fmt: skip
    assert judged(search) == (1.0, None)  # top_k=5 is a setting, not a number the run used


def test_hostile_tool_results_are_read_as_text() -> None:
    deep = "{" * 50_000 + "}" * 50_000
    assert tool_value(deep) == deep  # too long to parse: kept as text, never evaluated
    assert tool_value("{__import__('os').system('true')}") == "{__import__('os').system('true')}"
    assert tool_value("{'a': " * 200 + "1" + "}" * 200) is None  # parsed, never raised: no value field


def test_it_is_registered_and_off_in_the_default_engine() -> None:
    assert REGISTRY["grounding"].enabled is False and "grounding" not in DEFAULT_WEIGHTS
