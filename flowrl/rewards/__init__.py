"""Rewards: score traces, one module per reward, combined by RewardEngine.

Every reward has `score(trace) -> RewardResult(value, details)` with `value` in [0, 1] or None ("cannot judge
here", never 0), `score_batch(traces)`, and `as_reward_func()` for TRL's GRPOTrainer. Names resolve on first
use, so importing this package stays cheap (the sandbox and the judge load only when asked for).
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports
from flowrl.rewards.base import Reward, RewardResult

_LAZY: dict[str, str] = {
    "RewardEngine": "flowrl.rewards.engine",
    "CodeExecutionReward": "flowrl.rewards.code_execution",
    "SyntaxValidationReward": "flowrl.rewards.syntax",
    "ToolSuccessReward": "flowrl.rewards.tool_success",
    "TaskCompletionReward": "flowrl.rewards.task_completion",
    "EfficiencyReward": "flowrl.rewards.efficiency",
    "FormatComplianceReward": "flowrl.rewards.format",
    "LearnedReward": "flowrl.rewards.learned",
    "ReferenceAnswerReward": "flowrl.rewards.reference",
    "LLMJudgeReward": "flowrl.rewards.judge",
    "ScoreSummary": "flowrl.rewards.scoring",
    "score_store": "flowrl.rewards.scoring",
}

__all__ = ["RewardResult", "Reward", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
