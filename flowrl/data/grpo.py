"""GRPO rows, online (prompts for TRL to complete) and offline (logged completions to replay).

Online (`offline=False`, method `grpo`): one row per task (group). `prompt` is the conversation up to
and including the user turn of the group's best trace (system prompts, history, user turn), and the
other columns are what flowrl's reward functions read; GRPOTrainer hands every column to every reward
function as a keyword argument.

Offline (`offline=True`, method `grpo-offline`): one row per group of logged runs of one task, for a
`rollout_func` that replays them instead of generating:
`prompt` (the best run's prompt), `logged_completions` (each run's messages after its own prompt:
assistant turns and the tool results between them, ending on an assistant turn), `logged_rewards`
(each run's `reward_score`, same order), `trace_ids`, `group_id`, `group_size`, `reward_mean`,
`reward_std`. (Not `completions`/`rewards`: GRPOTrainer passes every column to the reward functions
as a keyword argument, and `completions` would collide with their own argument.)
Runs without a reward are left out; groups with fewer than `min_group_size` runs, or whose rewards are
all equal (no learning signal once advantages are centred), are dropped and counted. A group larger
than `max_group_size` keeps that many runs spread evenly over its reward ranking (best and worst
included). See docs/datasets.md for how to replay them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from flowrl.data.base import BuildStats, DatasetBuilder, Loader, TraceInfo, reward_order
from flowrl.data.tokens import kept_calls
from flowrl.errors import ConfigError
from flowrl.trace.conversation import Conversation, fit_trajectory, message_chars
from flowrl.trace.facts import GUESSED_REFERENCE, reference
from flowrl.trace.schema import ExecutionTrace

# Where a host puts a task's test code on a trace (first match wins); its reference answer is
# `flowrl.trace.facts.reference` (keys `flowrl.trace.facts.REFERENCE_KEYS`).
TEST_CODE_KEYS = ("test_code", "tests", "test")
EQUAL_REWARDS = 1e-9


def _first(metadata: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = metadata.get(key)
        if value not in (None, ""):
            return value if isinstance(value, str) else str(value)
    return None


def task_columns(trace: ExecutionTrace, conv: Conversation, label: bool | None) -> dict[str, Any]:
    """Reference answer (`flowrl.trace.facts.reference`, else the final answer of a run labelled good, marked
    `reference_source = "best_trace"`: a guess no reward or eval takes for a reference) and test code."""
    ref = reference(trace)
    answer, source = ref.answer, ref.source
    final = trace.final_response or conv.messages[-1]["content"]
    if answer is None and label and final:
        answer, source = final, GUESSED_REFERENCE
    return {"reference_answer": answer, "reference_source": source, "test_code": _first(trace.metadata, TEST_CODE_KEYS)}


def spread(items: list[Any], k: int) -> list[Any]:
    """`k` items evenly spaced over `items` (first and last included)."""
    if len(items) <= k:
        return items
    if k == 1:
        return items[:1]
    picks = sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})
    return [items[i] for i in picks]


@dataclass(kw_only=True)
class GRPODatasetBuilder(DatasetBuilder):
    grouped: ClassVar[bool] = True

    offline: bool = False
    min_group_size: int = 2
    max_group_size: int | None = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_group_size < 2:
            raise ConfigError(f"min_group_size {self.min_group_size}: a GRPO group needs at least 2 runs")
        if self.max_group_size is not None and self.max_group_size < self.min_group_size:
            raise ConfigError(f"max_group_size {self.max_group_size} is below min_group_size {self.min_group_size}")

    @property
    def method(self) -> str:  # type: ignore[override]
        return "grpo-offline" if self.offline else "grpo"

    def features(self) -> Any:
        from datasets import Features, Json, List, Value

        common = {
            "prompt": List(Json()),
            "tools": Json(),
            "group_id": Value("string"),
            "reference_answer": Value("string"),
            "reference_source": Value("string"),
            "test_code": Value("string"),
            "agent_name": Value("string"),
        }
        if self.offline:
            return Features(
                {
                    **common,
                    "logged_completions": List(List(Json())),
                    "logged_rewards": List(Value("float64")),
                    "logged_tokens": List(Json()),
                    "trace_ids": List(Value("string")),
                    "group_size": Value("int32"),
                    "reward_mean": Value("float64"),
                    "reward_std": Value("float64"),
                }
            )
        return Features(
            {
                **common,
                "trace_id": Value("string"),
                "n_traces": Value("int32"),
                "best_reward": Value("float64"),
                "mean_reward": Value("float64"),
            }
        )

    def group_rows(self, members: list[TraceInfo], load: Loader, stats: BuildStats) -> Iterator[dict[str, Any]]:
        if self.offline:
            yield from self._offline(members, load, stats)
            return
        ranked = sorted(members, key=reward_order)
        trace, conv = load(ranked[0])
        if not self.fits(message_chars(conv.prompt)):
            stats.dropped_too_long += 1
            return
        rewards = [m.reward for m in members if m.reward is not None]
        stats.groups["used"] += 1
        yield {
            **_head(trace, conv, ranked[0]),
            "trace_id": trace.trace_id,
            "n_traces": len(members),
            "best_reward": ranked[0].reward,
            "mean_reward": statistics.fmean(rewards) if rewards else None,
        }

    def _offline(self, members: list[TraceInfo], load: Loader, stats: BuildStats) -> Iterator[dict[str, Any]]:
        scored = sorted((m for m in members if m.reward is not None), key=reward_order)
        if len(scored) < len(members):
            stats.skip("no reward (left out of its GRPO group)", len(members) - len(scored))
        if not self._usable(scored, stats):
            return
        if self.max_group_size is not None and len(scored) > self.max_group_size:
            stats.groups["capped to max_group_size"] += 1
            scored = spread(scored, self.max_group_size)
        best_trace, best_conv = load(scored[0])
        prompt_chars = message_chars(best_conv.prompt)
        budget = None if self.max_chars is None else self.max_chars - prompt_chars
        kept: list[tuple[TraceInfo, list[dict[str, Any]], Any]] = []
        for info in scored:
            trace, conv = (best_trace, best_conv) if info is scored[0] else load(info)
            completion = conv.trajectory
            if budget is not None and message_chars(completion) > budget:
                completion = fit_trajectory(completion, max(budget, 0))
                if not completion:
                    stats.dropped_too_long += 1
                    continue
                stats.truncated += 1
            kept.append((info, completion, kept_calls(trace, len(conv.assistant_indices()), completion)))
        if not self._usable([info for info, _, _ in kept], stats):
            return
        rewards = [float(info.reward) for info, _, _ in kept]  # type: ignore[arg-type]
        stats.groups["used"] += 1
        yield {
            **_head(best_trace, best_conv, scored[0]),
            "logged_completions": [c for _, c, _ in kept],
            "logged_rewards": rewards,
            "logged_tokens": [t for _, _, t in kept],
            "trace_ids": [i.trace_id for i, _, _ in kept],
            "group_size": len(kept),
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
        }

    def _usable(self, scored: list[TraceInfo], stats: BuildStats) -> bool:
        if len(scored) < self.min_group_size:
            stats.groups[f"dropped: fewer than {self.min_group_size} scored runs"] += 1
            return False
        rewards = [m.reward for m in scored]
        if max(rewards) - min(rewards) <= EQUAL_REWARDS:  # type: ignore[type-var, operator]
            stats.groups["dropped: all rewards equal"] += 1
            return False
        return True


def _head(trace: ExecutionTrace, conv: Conversation, first: TraceInfo) -> dict[str, Any]:
    """The columns every GRPO row starts with, in this order, from its group's first (best) run."""
    return {
        "prompt": conv.prompt,
        "tools": conv.tools,
        "group_id": first.group_id,
        **task_columns(trace, conv, first.label),
        "agent_name": trace.agent_name,
    }
