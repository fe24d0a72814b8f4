"""flowrl's rewards as TRL reward functions: what single-turn GRPO (`trainers`) and GRPO through an agent
(`agent_grpo`) both score completions with."""

from __future__ import annotations

from typing import Any

from flowrl.errors import ConfigError
from flowrl.rewards.engine import RewardEngine
from flowrl.train.config import TrainingConfig


def online_reward_funcs(config: TrainingConfig) -> tuple[list[Any], list[float]]:
    """flowrl's rewards as TRL reward functions, with their weights (config's, else the engine's)."""
    engine = RewardEngine.from_config(config.reward_config) if config.reward_config else RewardEngine()
    names = config.rewards or engine.names
    missing = [n for n in names if n not in engine.rewards]
    if missing:
        raise ConfigError(f"unknown reward {', '.join(missing)}: choose from {', '.join(engine.names)}")
    funcs = [engine.rewards[n].as_reward_func() for n in names]
    weights = config.reward_weights or [engine.weights[n] for n in names]
    return funcs, [float(w) for w in weights]
