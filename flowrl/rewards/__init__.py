"""Rewards: score traces, one module per reward, combined by RewardEngine.

Every reward has `score(trace) -> RewardResult(value, details)` with `value` in [0, 1] or None ("cannot judge
here", never 0), `score_batch(traces)`, and `as_reward_func()` for TRL's GRPOTrainer. Names resolve on first
use, so importing this package stays cheap (the sandbox and the judge load only when asked for).

A reward is registered by name in `config.REGISTRY`: one line there for a built-in, `register_reward(name,
"module:Class", weight=...)` for any other, or an entry point in the `flowrl.rewards` group for an installed
package (see config.py and docs/rewards.md).
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports
from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.config import BUILTIN_REWARDS, REGISTRY, register_reward

_LAZY: dict[str, str] = {
    "RewardEngine": "flowrl.rewards.engine",
    # each built-in reward's class, from its line in config.REGISTRY (plugins are not exported here)
    **{REGISTRY[name].class_name: REGISTRY[name].module for name in BUILTIN_REWARDS},
    "ScoreSummary": "flowrl.rewards.scoring",
    "score_store": "flowrl.rewards.scoring",
}

__all__ = ["RewardResult", "Reward", "register_reward", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
