"""The reward contract every reward implements.

A reward scores one trace (`score`) or many (`score_batch`) and returns `RewardResult(value, details)`
with `value` in [0, 1], or None for "cannot judge here" (never 0 for that). Any reward can also be
handed to TRL's GRPOTrainer as a reward function through `as_reward_func()`:
`(prompts, completions, **kwargs) -> list[float | None]`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flowrl.schema import ExecutionTrace

log = logging.getLogger(__name__)


@dataclass
class RewardResult:
    value: float | None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.value is not None:
            v = float(self.value)
            if v != v:  # NaN is "cannot judge"
                self.value = None
            else:
                self.value = min(1.0, max(0.0, v))


def completion_text(completion: Any) -> str:
    """TRL hands completions as strings (standard) or as lists of messages (conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        parts = [m.get("content") or "" for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        return "\n".join(p if isinstance(p, str) else str(p) for p in parts)
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return str(completion)


def prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") or "" for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def completion_tool_calls(completion: Any) -> list[dict[str, Any]]:
    """OpenAI-format tool calls in a conversational completion (empty for plain text)."""
    calls: list[dict[str, Any]] = []
    if isinstance(completion, list):
        for m in completion:
            if isinstance(m, dict) and m.get("role") == "assistant":
                calls.extend(m.get("tool_calls") or [])
    return calls


class Reward:
    """Base class. Subclasses set `name` and implement `score`; `score_batch` may be overridden
    when batching is cheaper (the sandbox, the judge)."""

    name: str = "reward"

    def score(self, trace: ExecutionTrace) -> RewardResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def score_batch(self, traces: Iterable[ExecutionTrace]) -> list[RewardResult]:
        return [self.safe_score(t) for t in traces]

    def safe_score(self, trace: ExecutionTrace) -> RewardResult:
        """`score`, with a failure of the reward itself turned into None (cannot judge) and logged."""
        try:
            return self.score(trace)
        except Exception as exc:  # a broken reward must not sink a whole scoring run
            log.warning("flowrl: reward %s failed on %s: %s", self.name, trace.trace_id, exc, exc_info=True)
            return RewardResult(None, {"error": f"{type(exc).__name__}: {exc}"})

    def trace_from_completion(self, prompt: Any, completion: Any, **columns: Any) -> ExecutionTrace:
        """Build the trace a fresh GRPO completion stands for, so `score` can judge it."""
        messages: list[dict[str, Any]] = []
        if isinstance(prompt, list):
            messages.extend(m for m in prompt if isinstance(m, dict))
        else:
            messages.append({"role": "user", "content": prompt_text(prompt)})
        if isinstance(completion, list):
            messages.extend(m for m in completion if isinstance(m, dict))
        else:
            messages.append({"role": "assistant", "content": completion_text(completion)})
        metadata = {k: v for k, v in columns.items() if k not in ("trainer_state", "log_extra", "log_metric", "completion_ids")}
        return ExecutionTrace(
            user_query=prompt_text(prompt),
            final_response=completion_text(completion),
            messages=messages,
            source="live",
            metadata={"grpo_columns": metadata},
        )

    def as_reward_func(self) -> Callable[..., list[float | None]]:
        """This reward as a TRL GRPOTrainer reward function."""

        def reward_func(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
            n = len(completions)
            traces = []
            for i in range(n):
                cols = {k: (v[i] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
                traces.append(self.trace_from_completion(prompts[i] if i < len(prompts) else "", completions[i], **cols))
            return [r.value for r in self.score_batch(traces)]

        reward_func.__name__ = f"flowrl_{self.name}"
        return reward_func
