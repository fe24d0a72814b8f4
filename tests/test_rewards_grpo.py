"""Every reward as a TRL GRPOTrainer reward function, called the way GRPOTrainer._calculate_rewards calls it."""

from __future__ import annotations

import inspect
import math

import pytest

from flowrl.rewards.efficiency import EfficiencyReward
from flowrl.rewards.format import FormatComplianceReward
from flowrl.rewards.learned import LearnedReward
from flowrl.rewards.syntax import SyntaxValidationReward
from flowrl.rewards.task_completion import TaskCompletionReward
from flowrl.rewards.tool_success import ToolSuccessReward


class _State:  # stands in for transformers' TrainerState
    global_step = 3


def call_like_trl(func, prompts, completions, **columns):
    """GRPOTrainer passes prompts, completions, completion_ids, every extra dataset column (one value per
    completion), trainer_state, log_extra and log_metric, all as keyword arguments."""
    n = len(completions)
    return func(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1, 2, 3]] * n,
        trainer_state=_State(),
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
        **{k: [v] * n for k, v in columns.items()},
    )


STRING_PROMPTS = ["Write a function that adds one."] * 3
STRING_COMPLETIONS = [
    "```python\ndef add_one(x):\n    return x + 1\n```",
    "```python\ndef add_one(x)\n    return x + 1\n```",
    "<think>easy</think>Error: I cannot do that.",
]

CONV_PROMPTS = [
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Rome?"}]
] * 3
CONV_COMPLETIONS = [
    # TRL's tool loop: tool_calls with dict arguments and no ids, tool messages matched by name
    [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
        },
        {"role": "tool", "name": "get_weather", "content": "Rome: 25C, sunny"},
        {"role": "assistant", "content": "It is 25C and sunny in Rome."},
    ],
    [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
        },
        {"role": "tool", "name": "get_weather", "content": "{'error': 'service down'}"},
        {"role": "assistant", "content": "Sorry, the weather service is down."},
    ],
    [{"role": "assistant", "content": "It is probably sunny."}],
]

REWARDS = [
    SyntaxValidationReward(),
    ToolSuccessReward(),
    TaskCompletionReward(),
    EfficiencyReward(),
    FormatComplianceReward(),
    LearnedReward(),
]


@pytest.mark.parametrize("reward", REWARDS, ids=lambda r: r.name)
def test_reward_func_signature(reward):
    func = reward.as_reward_func()
    params = inspect.signature(func).parameters
    assert list(params)[:2] == ["prompts", "completions"]
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert func.__name__ == f"flowrl_{reward.name}"


@pytest.mark.parametrize("reward", REWARDS, ids=lambda r: r.name)
@pytest.mark.parametrize(
    ("prompts", "completions"),
    [(STRING_PROMPTS, STRING_COMPLETIONS), (CONV_PROMPTS, CONV_COMPLETIONS)],
    ids=["string", "conversational"],
)
def test_reward_func_returns_one_float_or_none_per_completion(reward, prompts, completions):
    out = call_like_trl(reward.as_reward_func(), prompts, completions, task_id="t1")
    assert len(out) == len(completions)
    for v in out:
        assert v is None or (isinstance(v, float) and 0.0 <= v <= 1.0 and not math.isnan(v))


def test_string_completions_sensible_values():
    syntax = call_like_trl(SyntaxValidationReward().as_reward_func(), STRING_PROMPTS, STRING_COMPLETIONS)
    assert syntax == [1.0, 0.0, None]
    fmt = call_like_trl(FormatComplianceReward().as_reward_func(), STRING_PROMPTS, STRING_COMPLETIONS)
    assert fmt[0] == 1.0 and fmt[2] < 1.0  # leaked <think>
    tools = call_like_trl(ToolSuccessReward().as_reward_func(), STRING_PROMPTS, STRING_COMPLETIONS)
    assert tools == [None, None, None]  # no tool calls: cannot judge, not 0
    task = call_like_trl(TaskCompletionReward().as_reward_func(), STRING_PROMPTS, STRING_COMPLETIONS)
    assert task == [None, None, 0.0]  # an error answer, even after a reasoning block
    err = call_like_trl(TaskCompletionReward().as_reward_func(), ["q"], ["Error: boom"])
    assert err == [0.0]
    eff = call_like_trl(EfficiencyReward(max_output_tokens=5).as_reward_func(), ["q", "q"], ["short", "x" * 200])
    assert eff[0] == 1.0 and eff[1] < eff[0]  # a length budget on fresh completions


def test_conversational_completions_sensible_values():
    tools = call_like_trl(ToolSuccessReward().as_reward_func(), CONV_PROMPTS, CONV_COMPLETIONS)
    assert tools == [1.0, 0.0, None]
    fmt = call_like_trl(FormatComplianceReward().as_reward_func(), CONV_PROMPTS, CONV_COMPLETIONS)
    assert fmt == [1.0, 1.0, 1.0]
    syntax = call_like_trl(SyntaxValidationReward().as_reward_func(), CONV_PROMPTS, CONV_COMPLETIONS)
    assert syntax == [None, None, None]  # dict arguments and prose: nothing to parse


def test_learned_reward_func_is_none_until_trained():
    out = call_like_trl(LearnedReward().as_reward_func(), STRING_PROMPTS, STRING_COMPLETIONS)
    assert out == [None, None, None]


def test_engine_reward_funcs_and_weights():
    from flowrl.rewards.engine import RewardEngine

    engine = RewardEngine(
        {"syntax": SyntaxValidationReward(), "format": FormatComplianceReward()}, {"syntax": 1.0, "format": 0.5}
    )
    funcs, weights = engine.reward_funcs()
    assert weights == [1.0, 0.5]
    assert [f.__name__ for f in funcs] == ["flowrl_syntax", "flowrl_format"]
    assert call_like_trl(funcs[0], STRING_PROMPTS, STRING_COMPLETIONS) == [1.0, 0.0, None]
