"""HostOutcomeReward: what the host said about the run (`flowrl.trace.outcomes`).

The host's last `success` (1.0 or 0.0) when it gave one; else the mean of its named rewards (each 0..1, the last
value of each name); else None (the host said nothing about how the run went: a reference alone is scored by
`reference_answer`). Its default weight, 40, is more than every other default reward together (38.5), and it is
a correctness reward (`flowrl.trace.facts.CORRECTNESS`): a run the host called a failure is never labelled good.
"""

from __future__ import annotations

from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.trace.facts import host_verdict
from flowrl.trace.schema import ExecutionTrace

__all__ = ["HostOutcomeReward"]


class HostOutcomeReward(Reward):
    name = "host_outcome"

    def score(self, trace: ExecutionTrace) -> RewardResult:
        verdict = host_verdict(trace)
        details: dict[str, Any] = {"outcomes": verdict.outcomes}
        if verdict.rewards:
            details["rewards"] = dict(verdict.rewards)
        if verdict.feedback:
            details["feedback"] = [f.text[:500] for f in verdict.feedback[-3:]]
        if verdict.success is not None:
            return RewardResult(
                1.0 if verdict.success else 0.0, {**details, "success": verdict.success, "by": verdict.success_by}
            )
        if verdict.rewards:
            values = list(verdict.rewards.values())
            return RewardResult(sum(values) / len(values), details)
        return RewardResult(None, {**details, "reason": "no success or reward from the host"})
