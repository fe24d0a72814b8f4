"""A third-party reward in one file: the answer's length against a budget (for tests/test_reward_registry.py)."""

from __future__ import annotations

from flowrl.rewards import Reward, RewardResult
from flowrl.rewards.views import answer_text
from flowrl.trace.schema import ExecutionTrace


class LengthReward(Reward):
    name = "length"
    default_weight = 0.5  # read when the reward comes in through the flowrl.rewards entry-point group

    def __init__(self, max_chars: int = 20) -> None:
        self.max_chars = max_chars

    def score(self, trace: ExecutionTrace) -> RewardResult:
        answer = answer_text(trace)
        if not answer:
            return RewardResult(None, {"reason": "no answer"})
        return RewardResult(min(1.0, len(answer) / self.max_chars), {"chars": len(answer)})
