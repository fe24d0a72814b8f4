"""Rewards stop punishing tools: a well-formed tool call is a tool-call turn, and correctness dominates style."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from flowrl.rewards import RewardEngine, RewardResult
from flowrl.rewards.base import Reward
from flowrl.rewards.config import DEFAULT_THRESHOLD, DEFAULT_WEIGHTS, TOOLBOXV2_WEIGHTS, load_config
from flowrl.rewards.format import FormatComplianceReward, parse_tool_markup
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

PROMPT = [
    {"role": "system", "content": "You are a helpful agent with tools."},
    {"role": "user", "content": "What is 12*7?"},
]
WELL_FORMED = (
    '<tool_call>{"name": "exec_code", "arguments": {"code": "print(12*7)"}}</tool_call>'  # as the example agent writes
)
GARBAGE = 'asdf }{ <tool_call>{"name": '
PROSE = "The answer is 83."


def fmt(completion) -> float | None:
    """The format reward as GRPOTrainer calls it, on one conversational prompt."""
    [value] = FormatComplianceReward().as_reward_func()(prompts=[PROMPT], completions=[completion])
    return value


def as_message(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize("shape", [str, as_message], ids=["string", "conversational"])
def test_well_formed_written_call_is_a_tool_call_turn(shape):
    assert fmt(shape(WELL_FORMED)) == 1.0


@pytest.mark.parametrize("shape", [str, as_message], ids=["string", "conversational"])
def test_garbage_markup_scores_low_and_below_a_well_formed_call(shape):
    garbage, good = fmt(shape(GARBAGE)), fmt(shape(WELL_FORMED))
    assert garbage is not None and garbage <= 0.5 and garbage < good


@pytest.mark.parametrize("shape", [str, as_message], ids=["string", "conversational"])
def test_plain_prose_answer_is_clean(shape):
    assert fmt(shape(PROSE)) == 1.0


@pytest.mark.parametrize(
    "markup",
    [
        "<tool_call>{bad json</tool_call>",
        '<tool_call>{"arguments": {"code": "1"}}</tool_call>',  # no name
        '<tool_call>{"name": "exec_code", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        "[TOOL_CALLS] get_weather",
    ],
)
def test_malformed_markup_alone_scores_zero(markup):
    assert fmt(markup) == 0.0


def test_markup_in_a_prose_answer_is_still_a_leak():
    r = FormatComplianceReward().score(ExecutionTrace(final_response=f"The answer is 84. {WELL_FORMED}"))
    assert r.details["checks"]["no_raw_tool_markup"] == 0.0
    assert r.value is not None and r.value < 1.0


@pytest.mark.parametrize("arguments", ['{"code": "print(12*7)"}', {"code": "print(12*7)"}], ids=["json-string", "dict"])
def test_structured_tool_call_completion_scores_one(arguments):
    completion = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "exec_code", "arguments": arguments}}
            ],
        }
    ]
    assert fmt(completion) == 1.0


def test_captured_structured_tool_call_trace_scores_one():
    trace = ExecutionTrace(
        user_query="What is 12*7?",
        final_response="12*7 = 84.",
        success=True,
        messages=[
            *PROMPT,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "exec_code", "arguments": '{"code": "print(12*7)"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "84"},
            {"role": "assistant", "content": "12*7 = 84."},
        ],
    )
    r = FormatComplianceReward().score(trace)
    assert r.value == 1.0 and r.details["checks"]["json_arguments"] == 1.0


@pytest.mark.parametrize(
    "text",
    [
        (
            '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
        ),
        '<tool_call>{"name": "a", "arguments": {"x": 1}}',  # closing tag eaten by a stop string
        "<tool_call>\n<function=exec_code>\n<parameter=code>\nprint(1)\n</parameter>\n</function>\n</tool_call>",
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}<|eom_id|>',
        '<function=a>{"x": 1}</function>',
        '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}]',
        '[TOOL_CALLS]a[ARGS]{"x": 1}',
        '{"name": "a", "arguments": {"x": 1}}',
    ],
    ids=[
        "hermes-two",
        "hermes-unclosed",
        "qwen3-coder",
        "llama-python-tag",
        "llama-function",
        "mistral-v3",
        "mistral-args",
        "bare-json",
    ],
)
def test_tool_call_families_are_read(text):
    calls, rest = parse_tool_markup(text)
    assert calls and all(c.well_formed for c in calls) and not rest.strip()
    assert fmt(text) == 1.0


def test_markup_inside_code_is_not_a_call():
    calls, _ = parse_tool_markup("Write it like `<tool_call>` or\n```xml\n<tool_call>{}</tool_call>\n```\n")
    assert calls == []


def test_a_json_answer_is_not_a_call():
    assert parse_tool_markup('{"result": 84}') == ([], '{"result": 84}')


def test_allowed_reasoning_before_calls_is_part_of_the_turn():
    text = f"<think>I need the interpreter.</think>\n{WELL_FORMED}"
    assert FormatComplianceReward(allow_tags=["think"]).score(ExecutionTrace(final_response=text)).value == 1.0


# -- correctness dominates the combined score --------------------------------------------------------------


def task_trace(final: str, **fields) -> ExecutionTrace:
    return ExecutionTrace(
        user_query="What is 12*7?",
        final_response=final,
        metadata={"reference_answer": "84"},
        group_key="mul-12-7",
        **fields,
    )


def terse_right() -> ExecutionTrace:
    """Right answer, ugly run: a failed tool call, a leaked reasoning tag, no success flag."""
    return task_trace(
        "<think>ugh</think>84",
        tool_calls=[
            ToolCallTrace(tool_name="lookup", arguments={"key": "12*7"}, result="Error: no fact", success=False)
        ],
    )


def pretty_wrong() -> ExecutionTrace:
    """Wrong answer, polished run: clean code that ran, a clean answer, and the agent claims success."""
    return task_trace(
        "I computed it with Python: 12*7 = 83.",
        success=True,
        status="completed",
        tool_calls=[
            ToolCallTrace(tool_name="exec_code", arguments={"code": "print(12*7 - 1)"}, result="83", success=True)
        ],
    )


def test_right_but_terse_beats_wrong_but_pretty_with_default_weights():
    with RewardEngine() as engine:
        right, wrong = engine.compute_batch([terse_right(), pretty_wrong()])
        assert right["reference_answer"].value == 1.0 and wrong["reference_answer"].value == 0.0
        assert engine.compute_combined(right) > engine.compute_combined(wrong)
        assert engine.compute_combined(right) >= DEFAULT_THRESHOLD
        assert engine.get_binary_label(right) is True and engine.get_binary_label(wrong) is False


class _Named(Reward):
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.mark.parametrize("correctness", ["reference_answer", "task_completion", "host_outcome"])
def test_wrong_never_outscores_right_whatever_the_style_rewards_say(correctness):
    weights = {**DEFAULT_WEIGHTS, "learned": 1.0, "judge": 1.0}  # the worst case: both optional rewards on
    engine = RewardEngine({n: _Named(n) for n in weights}, weights)
    ranked = ("task_completion", "reference_answer", "host_outcome")  # each outranks the ones before it
    style = [n for n in weights if n not in ranked]
    style += ranked[: ranked.index(correctness)]  # what the agent claimed does not outvote the known answer, and
    # neither outvotes the host's verdict
    silent = ranked[ranked.index(correctness) + 1 :]  # no known answer, no word from the host
    options = (None, 0.0, 1.0)

    def combined(value: float, others: tuple) -> float:
        results = {n: RewardResult(v) for n, v in zip(style, others)}
        results.update({n: RewardResult(None) for n in silent})
        return engine.compute_combined({**results, correctness: RewardResult(value)})

    best_wrong = max(combined(0.0, o) for o in itertools.product(options, repeat=len(style)))
    worst_right = min(combined(1.0, o) for o in itertools.product(options, repeat=len(style)))
    assert best_wrong < 0.5 < worst_right


def test_right_run_reaches_the_threshold_with_every_default_style_reward_at_zero():
    engine = RewardEngine({n: _Named(n) for n in DEFAULT_WEIGHTS}, DEFAULT_WEIGHTS)
    zeros = {n: RewardResult(0.0) for n in DEFAULT_WEIGHTS} | {"host_outcome": RewardResult(None)}  # host silent
    assert (
        engine.compute_combined({**zeros, "reference_answer": RewardResult(None), "task_completion": RewardResult(1.0)})
        >= 0.6
    )
    assert (
        engine.compute_combined({**zeros, "reference_answer": RewardResult(1.0), "task_completion": RewardResult(None)})
        >= 0.6
    )
    assert (
        engine.get_binary_label({**zeros, "reference_answer": RewardResult(1.0)}) is False
    )  # task_completion 0: gated


def test_toolboxv2_weights_are_one_documented_config_away(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    block = next(b for b in re.findall(r"^```toml\n(.*?)^```", text, re.DOTALL | re.MULTILINE) if "toolboxv2" in b)
    path = tmp_path / "rewards.toml"
    path.write_text(block)
    cfg = load_config(path)
    assert {n: s.weight for n, s in cfg.rewards.items() if s.enabled} == TOOLBOXV2_WEIGHTS
    assert TOOLBOXV2_WEIGHTS["task_completion"] == 1.5 and TOOLBOXV2_WEIGHTS["reference_answer"] == 2.0
