"""GRPO on logged groups: replay what the agent already did through TRL's `rollout_func`.

TRL's GRPOTrainer asks `rollout_func(prompts, trainer)` for completions instead of generating them
(TRL 1.16, `GRPOTrainer(rollout_func=...)`: docs/training.md). flowrl answers with the completions logged for
that prompt (one group of an offline GRPO dataset) and forwards each one's logged reward; a pass-through
reward function hands those rewards back to TRL, which computes group-relative advantages and the clipped
policy loss as usual.

Every completion is the whole logged trajectory (assistant turns, tool calls, tool results, the final
answer), encoded by `flowrl.data.encode`: the ids the model really sampled where the run captured them,
else the base model's chat template (a prefix-preserving one, or TRL's training template of its family; a
template that is neither stops the run with one line). Tool results and the headers between turns carry
`env_mask` 0, so only tokens the model generated get loss, each turn's end-of-turn token included.

Lengths come from the data: `max_completion_length` is set to the longest encoded trajectory (a value the
user gave that is smaller stops the run and names the length needed), and `mask_truncated_completions` is
on, so a completion cut off at generation time (no end-of-turn token) gets no loss.

Off-policy: when every completion of a generation batch carries the sampling log-probabilities the backend
recorded, they go to TRL as `logprobs`, and `off_policy_mask_threshold` masks negative-advantage sequences
that drifted too far from the policy that wrote them (DeepSeek-V3.2's sequence mask). Otherwise the logged
completions are treated as if the current policy had sampled them (importance ratio 1), and the run log
says so once.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from flowrl.data.encode import EncodeStats, trajectory_parts
from flowrl.errors import ConfigError

log = logging.getLogger(__name__)

COMPLETION_COLUMNS = ("completions", "group_completions", "logged_completions")
REWARD_COLUMNS = ("rewards", "group_rewards", "completion_rewards", "logged_rewards")
FORWARDED_REWARD = "logged_reward"


def prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)


def find_column(columns: list[str], candidates: tuple[str, ...], what: str) -> str:
    for name in candidates:
        if name in columns:
            return name
    raise ConfigError(
        f"offline GRPO data needs a column of {what} ({' or '.join(candidates)}); this dataset has {sorted(columns)}: "
        "build it with `flowrl build-dataset --method grpo-offline`"
    )


@dataclass
class Encoded:
    """One logged trajectory as TRL gets it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float] | None
    source: str


@dataclass
class Group:
    prompt: Any
    completions: list[Any]
    rewards: list[float]
    tools: Any = None
    tokens: list[Any] | None = None
    encoded: list[Encoded] | None = None


@dataclass
class GroupStats:
    groups: int = 0
    used: int = 0
    too_small: int = 0
    zero_variance: int = 0
    duplicate_prompt: int = 0
    trimmed: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if k != "notes"}


def group_size(rows: list[dict[str, Any]], completions_col: str) -> int:
    """The most common group size in the data (the natural `num_generations`)."""
    sizes = Counter(len(r[completions_col] or []) for r in rows)
    if not sizes:
        raise ConfigError("the offline GRPO dataset is empty")
    return max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _spread(indices: list[int], rewards: list[float], k: int) -> list[int]:
    """Keep k completions spanning the reward range (sorted by reward, evenly spaced), in their logged order."""
    order = sorted(indices, key=lambda i: rewards[i])
    if k == 1:
        return [order[-1]]
    picks = {order[round(j * (len(order) - 1) / (k - 1))] for j in range(k)}
    j = 0
    while len(picks) < k:  # rounding collisions: fill with the rest in reward order
        picks.add(order[j])
        j += 1
    return sorted(picks)


class OfflineGroups:
    """The logged groups of an offline GRPO dataset, ready to be replayed by GRPOTrainer."""

    def __init__(self, rows: list[dict[str, Any]], num_generations: int, *, drop_zero_variance: bool = True):
        if not rows:
            raise ConfigError("the offline GRPO dataset is empty")
        columns = list(rows[0].keys())
        if "prompt" not in columns:
            raise ConfigError(f"offline GRPO data needs a `prompt` column; this dataset has {sorted(columns)}")
        self.completions_col = find_column(columns, COMPLETION_COLUMNS, "logged completions")
        self.rewards_col = find_column(columns, REWARD_COLUMNS, "logged rewards")
        self.num_generations = num_generations
        self.stats = GroupStats(groups=len(rows))
        self.groups: dict[str, Group] = {}
        for row in rows:
            completions = list(row[self.completions_col] or [])
            rewards = [None if r is None else float(r) for r in (row[self.rewards_col] or [])]
            if len(rewards) != len(completions):
                raise ConfigError(
                    f"an offline GRPO row has {len(completions)} completions but {len(rewards)} rewards: "
                    "rebuild the dataset"
                )
            keep = [i for i, r in enumerate(rewards) if r is not None]
            if len(keep) < num_generations:
                self.stats.too_small += 1
                continue
            if drop_zero_variance and len({rewards[i] for i in keep}) < 2:
                self.stats.zero_variance += 1
                continue
            if len(keep) > num_generations:
                keep = _spread(keep, rewards, num_generations)  # type: ignore[arg-type]
                self.stats.trimmed += 1
            key = prompt_key(row["prompt"])
            if key in self.groups:
                # rollout_func sees only the prompt, so one prompt can stand for one group only
                self.stats.duplicate_prompt += 1
                continue
            tokens = row.get("logged_tokens") or [None] * len(completions)
            self.groups[key] = Group(
                prompt=row["prompt"],
                completions=[completions[i] for i in keep],
                rewards=[float(rewards[i]) for i in keep],  # type: ignore[arg-type]
                tools=row.get("tools"),
                tokens=[tokens[i] if i < len(tokens) else None for i in keep],
            )
        self.stats.used = len(self.groups)
        if not self.groups:
            raise ConfigError(
                f"no usable group in the offline GRPO dataset ({self.stats.groups} groups: "
                f"{self.stats.too_small} with fewer "
                f"than {num_generations} scored completions, {self.stats.zero_variance} where every reward is equal): "
                "lower --num-generations or log more runs per prompt"
            )
        self.encode_stats: Any = None
        self._said_on_policy = False

    # ------------------------------------------------------------------ encoding, once, before training

    def encode(self, renderer: Any) -> None:
        """Encode every logged trajectory with `renderer` (a `flowrl.data.tokens.ChatRenderer` of the base model)."""
        stats = EncodeStats(render=renderer.stats)
        for group in self.groups.values():
            group.encoded = []
            for completion, tokens in zip(group.completions, group.tokens or [None] * len(group.completions)):
                p, c, m, logps, source = trajectory_parts(
                    group.prompt, completion, tokens, group.tools, renderer, stats
                )
                if not c:
                    raise ConfigError(
                        f"a logged trajectory of {str(group.prompt)[:80]} encodes to no completion token: "
                        "rebuild the dataset"
                    )
                stats.sources[source] += 1
                group.encoded.append(Encoded(p, c, m, logps, source))
            stats.rows_in += 1
        stats.rows_out = stats.rows_in
        self.encode_stats = stats

    @property
    def longest_completion(self) -> int:
        return max(len(e.completion_ids) for g in self.groups.values() for e in g.encoded or ())

    @property
    def with_logprobs(self) -> bool:
        """Every logged completion carries its sampling log-probabilities."""
        return all(e.logprobs is not None for g in self.groups.values() for e in g.encoded or ())

    # ------------------------------------------------------------------ what GRPOTrainer gets

    def prompts(self) -> list[Any]:
        return [g.prompt for g in self.groups.values()]

    def train_dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list([{"prompt": g.prompt} for g in self.groups.values()])

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's rollout hook: `prompts` is this process's slice of the generation batch, each prompt repeated
        `num_generations` times in a row; the i-th copy of a prompt gets the i-th logged completion."""
        g = self.num_generations
        offset = trainer.accelerator.process_index * len(prompts)
        picked: list[Encoded] = []
        rewards = []
        for i, prompt in enumerate(prompts):
            key = prompt_key(prompt)
            group = self.groups.get(key)
            if group is None or group.encoded is None:
                raise RuntimeError(f"rollout_func got a prompt with no encoded logged group: {key[:120]}")
            index = (offset + i) % g
            picked.append(group.encoded[index])
            rewards.append(group.rewards[index])
        logprobs = None
        if all(e.logprobs is not None for e in picked):
            logprobs = [list(e.logprobs) for e in picked]  # type: ignore[arg-type]
        elif not self._said_on_policy:
            self._said_on_policy = True
            log.warning(
                "flowrl: offline GRPO: some logged completions have no sampling log-probabilities, so they are "
                "treated as if the current policy had sampled them (importance ratio 1, no off-policy correction)"
            )
        return {
            "prompt_ids": [list(e.prompt_ids) for e in picked],
            "completion_ids": [list(e.completion_ids) for e in picked],
            "logprobs": logprobs,
            "env_mask": [list(e.env_mask) for e in picked],
            FORWARDED_REWARD: rewards,
        }

    @staticmethod
    def logged_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        """Pass-through: the reward logged with each replayed completion."""
        values = kwargs.get(FORWARDED_REWARD)
        if values is None:
            return [None] * len(completions)
        return [None if v is None else float(v) for v in values]
