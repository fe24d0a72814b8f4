"""A reward given the executed trajectories (a rollout's `flowrl_trace`) judges those, not the decoded text.

Issue 14's first piece: online GRPO through the agent's loop hands TRL one executed trace per completion; every
flowrl reward function must score the run as it happened (tool calls executed, their results), the same trace
capture writes. The traces are 16 real captured runs of the example agent on SmolLM2-135M."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl.errors import FlowRLError
from flowrl.rewards.tool_success import ToolSuccessReward
from flowrl.store.files import TraceStore

FIXTURE = Path(__file__).parent / "fixtures" / "example-agent-captured"


def _runs_with_tools() -> list:
    traces = [t for t in TraceStore(FIXTURE).iter_traces() if any(m.get("role") == "tool" for m in t.messages)]
    assert traces, "the fixture holds runs that called tools"
    return traces


def test_the_executed_trace_is_judged_not_the_completion_text() -> None:
    reward = ToolSuccessReward()
    func = reward.as_reward_func()
    traces = _runs_with_tools()[:3]
    prompts = [t.user_query for t in traces]
    garbage = ["The answer is 83."] * len(traces)  # what the decoded text alone would be judged on
    executed = func(prompts=prompts, completions=garbage, flowrl_trace=traces)
    assert executed == [reward.score(t).value for t in traces]
    assert all(v is not None for v in executed)
    assert func(prompts=prompts, completions=garbage) == [None] * len(traces)  # no tool call in the text
    as_dicts = func(prompts=prompts, completions=garbage, flowrl_trace=[t.model_dump(mode="json") for t in traces])
    assert as_dicts == executed


def test_a_rollout_that_returns_the_wrong_traces_stops_with_one_line() -> None:
    func = ToolSuccessReward().as_reward_func()
    trace = _runs_with_tools()[0]
    with pytest.raises(FlowRLError, match="one trace per completion.*fix the rollout"):
        func(prompts=["q", "q"], completions=["a", "b"], flowrl_trace=[trace])
    with pytest.raises(FlowRLError, match=r"\[0\] is a str, not a trace"):
        func(prompts=["q"], completions=["a"], flowrl_trace=["not a trace"])
