"""RewardEngine: runs a set of weighted rewards over traces and combines them.

- `compute_all(trace)` -> {name: RewardResult}; `compute_batch(traces)` does the same for many, letting each
  reward batch (the sandbox runs its programs together, the judge sends a task's traces in one call);
- `compute_combined(...)` -> the weighted mean over the rewards that returned a value (None if none did, and
  None when a reward of positive weight crashed: see below);
- `errors(results)` -> {name: message} of the rewards that crashed;
- `compute_for_group(traces)` -> combined scores z-scored within the group (GRPO-style advantages);
- `get_binary_label(score)` -> score >= threshold (0.6 by default), None when there is no score. Given the
  results (or a trace), a failed task is never good: `task_completion`, `reference_answer` or `host_outcome` at 0
  means bad, whatever the other rewards say (a run that said `final_answer(success=false)` is not a good example).

Correctness dominates. The correctness reward is `reference_answer` when the task has a known answer, else
`task_completion`; by default each weighs more than all the rewards below it together:

    code_execution 2, syntax 1, tool_success 2, efficiency 0.5, format 1   = 6.5 (8.5 with learned, judge at 1)
    task_completion 10                                                     > 8.5
    reference_answer 20                                                    > 10 + 8.5
    host_outcome 40 (what the host said: flowrl.trace.outcomes)                  > 20 + 10 + 8.5

So the correctness reward carries more than half of any weighted mean it is part of, and, on one task, a wrong
run (correctness 0) always scores below 0.5 and below a right run (correctness 1), whatever the style rewards
and whichever of them returned None; TRL's weighted sum over `reward_funcs()` keeps the same order. A right
run reaches the 0.6 threshold with the default rewards, whatever the style rewards say (at worst 10 / 16.5 =
0.61), unless `task_completion` reports failure (0, which the gate labels bad anyway, or a toolboxv2 task
share under 0.2) or weight was added (learned, judge, raised style weights) and all of it scored 0.

The style weights are toolboxv2's; its correctness weights (task_completion 1.5, reference_answer 2), where
style can outvote a right answer, are `config.TOOLBOXV2_WEIGHTS`, for reproducing its scores. Learned and
judge are off until a config enables them. `LearnedReward` runs after the others and sees their fresh values
as features.

A reward that crashes is an error, not "cannot judge". Its result is `RewardResult(None, error=...)`, and the
combined score of that trace is None, not a mean re-weighted over the rewards that did not crash. A
re-weighted mean would shift every score and label that one buggy reward touched, and nothing would show
it. With no combined score there is no label either (`get_binary_label` gives None), so the trace stays out
of the datasets until it is scored again. A crash of a reward of weight 0 leaves the combined score alone,
since that reward is not part of it; it is still an error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.rewards.base import Reward, RewardResult, score_safely
from flowrl.rewards.config import (
    DEFAULT_THRESHOLD,
    EngineConfig,
    default_config,
    load_config,
    registry,
    reward_class,
)
from flowrl.trace.facts import label_for
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

Results = dict[str, RewardResult]


def build_rewards(cfg: EngineConfig) -> tuple[dict[str, Reward], dict[str, float]]:
    """Instantiate the enabled rewards of a config, with their weights."""
    rewards: dict[str, Reward] = {}
    weights: dict[str, float] = {}
    for name, spec in cfg.rewards.items():
        if not spec.enabled:
            continue
        try:
            cls = reward_class(name)
        except ModuleNotFoundError as exc:
            if exc.name != registry()[name].module:
                raise
            log.warning("flowrl: reward %s is not available in this install (%s); skipping it", name, exc)
            continue
        try:
            rewards[name] = cls(**spec.options)
        except ConfigError as exc:
            raise ConfigError(f"{cfg.source}: rewards.{name}: {exc}") from exc
        except TypeError as exc:
            raise ConfigError(f"{cfg.source}: rewards.{name}: {exc}") from exc
        weights[name] = spec.weight
    return rewards, weights


class RewardEngine:
    def __init__(
        self,
        rewards: Mapping[str, Reward] | None = None,
        weights: Mapping[str, float] | None = None,
        threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        if rewards is None:
            rewards, default_w = build_rewards(default_config())
            weights = {**default_w, **(weights or {})}
        self.rewards: dict[str, Reward] = dict(rewards)
        weights = dict(weights or {})
        for name, w in weights.items():
            if w < 0:
                raise ConfigError(f"weight of {name!r} must not be negative, got {w}")
        table = registry()
        self.weights = {n: float(weights.get(n, table[n].weight if n in table else 1.0)) for n in self.rewards}
        self.threshold = threshold
        self.source = "<defaults>"
        self.max_error_rate: float | None = None  # the config's; `flowrl score --max-error-rate` wins over it
        # the config it was built from (`from_config`): what `flowrl score --ray` builds each worker's engine from
        self.config: EngineConfig | None = None

    @classmethod
    def from_config(cls, path: str | Path | None = None) -> RewardEngine:
        """An engine from a TOML or YAML file; the defaults when `path` is None."""
        return cls.from_engine_config(load_config(path) if path is not None else default_config())

    @classmethod
    def from_engine_config(cls, cfg: EngineConfig) -> RewardEngine:
        """An engine from a loaded config (what `flowrl score --ray` sends each worker instead of a file path)."""
        rewards, weights = build_rewards(cfg)
        engine = cls(rewards, weights, cfg.threshold)
        engine.source, engine.max_error_rate, engine.config = cfg.source, cfg.max_error_rate, cfg
        return engine

    @property
    def names(self) -> list[str]:
        return list(self.rewards)

    def _stages(self) -> tuple[list[str], list[str]]:
        from flowrl.rewards.learned import LearnedReward  # lazy: it imports the built-in rewards the registry names

        late = [n for n, r in self.rewards.items() if isinstance(r, LearnedReward)]
        return [n for n in self.rewards if n not in late], late

    # -- computing --------------------------------------------------------------------------------------
    def _run(self, name: str, traces: list[ExecutionTrace]) -> list[RewardResult]:
        return score_safely(self.rewards[name], traces)  # a crash is an errored result, not an exception

    def compute_batch(self, traces: Iterable[ExecutionTrace]) -> list[Results]:
        traces = list(traces)
        out: list[Results] = [{} for _ in traces]
        first, late = self._stages()
        for name in first:
            for slot, result in zip(out, self._run(name, traces)):
                slot[name] = result
        if late and traces:
            fresh = [
                t.model_copy(update={"rewards": {**t.rewards, **{n: r.value for n, r in slot.items()}}})
                for t, slot in zip(traces, out)
            ]
            for name in late:
                for slot, result in zip(out, self._run(name, fresh)):
                    slot[name] = result
        return [{n: slot[n] for n in self.rewards} for slot in out]

    def compute_all(self, trace: ExecutionTrace) -> Results:
        return self.compute_batch([trace])[0]

    @staticmethod
    def errors(results: Mapping[str, RewardResult | float | None]) -> dict[str, str]:
        """{name: error message} of the rewards that crashed in `results`."""
        return {n: r.error for n, r in results.items() if isinstance(r, RewardResult) and r.error is not None}

    def compute_combined(self, item: ExecutionTrace | Mapping[str, RewardResult | float | None]) -> float | None:
        """Weighted mean over the rewards that returned a value; None when none did (or all weigh 0), and None
        when a reward of positive weight crashed (never a mean re-weighted without it)."""
        results = self.compute_all(item) if isinstance(item, ExecutionTrace) else item
        if any(self.weights.get(name, 0.0) > 0 for name in self.errors(results)):
            return None
        total = weight_sum = 0.0
        for name, r in results.items():
            value = r.value if isinstance(r, RewardResult) else r
            w = self.weights.get(name, 0.0)
            if value is None or w <= 0 or (isinstance(value, float) and math.isnan(value)):
                continue
            total += w * float(value)
            weight_sum += w
        return total / weight_sum if weight_sum > 0 else None

    def compute_for_group(
        self, traces: Iterable[ExecutionTrace] | None = None, scores: Iterable[float | None] | None = None
    ) -> list[float | None]:
        """Combined scores z-scored within one group (same task): (x - mean) / std; all 0 when they are equal.
        A trace without a combined score (nothing to judge, or a reward crashed) gets None and is left out of
        the mean. Pass `scores` to standardise combined scores you already have."""
        if scores is None:
            scores = [self.compute_combined(r) for r in self.compute_batch(traces or [])]
        values = list(scores)
        present = [v for v in values if v is not None]
        if not present:
            return [None for _ in values]
        mean = sum(present) / len(present)
        std = math.sqrt(sum((v - mean) ** 2 for v in present) / len(present))
        return [None if v is None else (0.0 if std < 1e-9 else (v - mean) / std) for v in values]

    def get_binary_label(
        self, item: float | None | ExecutionTrace | Mapping[str, Any], threshold: float | None = None
    ) -> bool | None:
        """Good (True) when the combined score reaches `threshold` (the engine's, 0.6 by default) and, when the
        per-reward results are known, no gate reward (task_completion, reference_answer) is 0: the one label
        rule, `flowrl.trace.facts.label_for`."""
        if item is None or isinstance(item, (int, float)):
            score, results = item, None
        else:
            results = self.compute_all(item) if isinstance(item, ExecutionTrace) else item
            score = self.compute_combined(results)
        return label_for(score, threshold=self.threshold if threshold is None else threshold, rewards=results)

    # -- lifecycle --------------------------------------------------------------------------------------
    def needs_preparation(self) -> bool:
        return any(callable(getattr(r, "prepare", None)) for r in self.rewards.values())

    def prepare(self, traces: Iterable[ExecutionTrace]) -> dict[str, Any]:
        """Let rewards that learn from the store (LearnedReward) fit before a scoring run."""
        reports: dict[str, Any] = {}
        traces = list(traces)
        for name, r in self.rewards.items():
            fn = getattr(r, "prepare", None)
            if callable(fn):
                reports[name] = fn(traces)
        return reports

    def reward_funcs(self) -> tuple[list[Callable[..., list[float | None]]], list[float]]:
        """(reward functions, weights) for TRL's GRPOTrainer(reward_funcs=..., args=GRPOConfig(reward_weights=...))."""
        return [r.as_reward_func() for r in self.rewards.values()], [self.weights[n] for n in self.rewards]

    def close(self) -> None:
        for r in self.rewards.values():
            fn = getattr(r, "close", None)
            if callable(fn):
                try:
                    fn()
                except Exception as exc:  # closing must not raise over the real error
                    log.warning("flowrl: closing reward %s failed: %s", getattr(r, "name", r), exc)

    def __enter__(self) -> RewardEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
