"""GRPO on logged groups: replay what the agent already did through TRL's `rollout_func`.

TRL's GRPOTrainer asks `rollout_func(prompts, trainer)` for completions instead of generating them
(peers.md §3). flowrl answers with the completions logged for that prompt (one group of an offline
GRPO dataset), tokenized with the model's chat template, and forwards each one's logged reward; a
pass-through reward function hands those rewards back to TRL, which then computes group-relative
advantages and the clipped policy loss as usual.

What this assumes, and says in docs/training.md: **the logged completions are treated as if the current
policy had sampled them** (on-policy). With `use_vllm=False` TRL takes the old log-probabilities from
the current model, so the importance ratio starts at 1 and nothing corrects for the logs having come from
another model or an older checkpoint. Completions that are unlikely under the current policy still get
their full advantage; the further the policy is from the one that produced the logs, the less sound
this is. Groups are replayed whole: each prompt maps to exactly `num_generations` logged completions.

Tool results inside a logged completion (role `tool`, or `user` turns after the first assistant turn)
are kept in the sequence but masked out of the loss through `env_mask`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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
class Group:
    prompt: Any
    completions: list[Any]
    rewards: list[float]
    tools: Any = None


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

    def __init__(self, rows: list[dict[str, Any]], num_generations: int, *, max_completion_length: int,
                 drop_zero_variance: bool = True):
        if not rows:
            raise ConfigError("the offline GRPO dataset is empty")
        columns = list(rows[0].keys())
        if "prompt" not in columns:
            raise ConfigError(f"offline GRPO data needs a `prompt` column; this dataset has {sorted(columns)}")
        self.completions_col = find_column(columns, COMPLETION_COLUMNS, "logged completions")
        self.rewards_col = find_column(columns, REWARD_COLUMNS, "logged rewards")
        self.num_generations = num_generations
        self.max_completion_length = max_completion_length
        self.stats = GroupStats(groups=len(rows))
        self.groups: dict[str, Group] = {}
        for row in rows:
            completions = list(row[self.completions_col] or [])
            rewards = [None if r is None else float(r) for r in (row[self.rewards_col] or [])]
            if len(rewards) != len(completions):
                raise ConfigError(
                    f"an offline GRPO row has {len(completions)} completions but {len(rewards)} rewards: rebuild the dataset"
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
            self.groups[key] = Group(
                prompt=row["prompt"],
                completions=[completions[i] for i in keep],
                rewards=[float(rewards[i]) for i in keep],  # type: ignore[arg-type]
                tools=row.get("tools"),
            )
        self.stats.used = len(self.groups)
        if not self.groups:
            raise ConfigError(
                f"no usable group in the offline GRPO dataset ({self.stats.groups} groups: {self.stats.too_small} with fewer "
                f"than {num_generations} scored completions, {self.stats.zero_variance} where every reward is equal): "
                "lower --num-generations or log more runs per prompt"
            )
        self._encoded: dict[tuple[str, int, int], tuple[list[int], list[int], list[int]]] = {}

    # ------------------------------------------------------------------ what GRPOTrainer gets

    def prompts(self) -> list[Any]:
        return [g.prompt for g in self.groups.values()]

    def train_dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list([{"prompt": g.prompt} for g in self.groups.values()])

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's rollout hook: `prompts` is this process's slice of the generation batch, each prompt repeated
        `num_generations` times in a row; the i-th copy of a prompt gets the i-th logged completion."""
        tokenizer = getattr(trainer, "processing_class", None)
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        template_kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
        g = self.num_generations
        offset = trainer.accelerator.process_index * len(prompts)
        prompt_ids, completion_ids, env_mask, rewards = [], [], [], []
        for i, prompt in enumerate(prompts):
            key = prompt_key(prompt)
            group = self.groups.get(key)
            if group is None:
                raise RuntimeError(f"rollout_func got a prompt with no logged group: {key[:120]}")
            index = (offset + i) % g
            p_ids, c_ids, mask = self._encode(tokenizer, key, group, index, template_kwargs)
            prompt_ids.append(p_ids)
            completion_ids.append(c_ids)
            env_mask.append(mask)
            rewards.append(group.rewards[index])
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": None,  # unknown for logs; TRL then uses the current policy's (ratio 1, see module doc)
            "env_mask": env_mask,
            FORWARDED_REWARD: rewards,
        }

    @staticmethod
    def logged_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        """Pass-through: the reward logged with each replayed completion."""
        values = kwargs.get(FORWARDED_REWARD)
        if values is None:
            return [None] * len(completions)
        return [None if v is None else float(v) for v in values]

    # ------------------------------------------------------------------ tokenization

    def _encode(self, tokenizer: Any, key: str, group: Group, index: int,
                template_kwargs: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
        cache_key = (key, index, id(tokenizer))
        if cache_key not in self._encoded:
            self._encoded[cache_key] = encode_pair(
                tokenizer, group.prompt, group.completions[index], tools=group.tools,
                max_completion_length=self.max_completion_length, template_kwargs=template_kwargs,
            )
        p, c, m = self._encoded[cache_key]
        return list(p), list(c), list(m)


def _ids(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool,
         template_kwargs: dict[str, Any]) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=True, return_dict=True,
        **template_kwargs,
    )
    ids = out["input_ids"]
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def _text(completion: Any) -> str:
    from flowrl.rewards.base import completion_text

    return completion_text(completion)


def encode_pair(tokenizer: Any, prompt: Any, completion: Any, *, tools: Any = None, max_completion_length: int,
                template_kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[int], list[int]]:
    """Prompt ids, completion ids and the completion's model-token mask (1 = written by the model)."""
    kwargs = template_kwargs or {}
    eos = tokenizer.eos_token_id
    conversational = isinstance(prompt, list)
    if conversational:
        prompt_ids = _ids(tokenizer, prompt, tools, True, kwargs)
    else:
        prompt_ids = tokenizer.encode(str(prompt), add_special_tokens=False)

    completion_ids: list[int] | None = None
    mask: list[int] = []
    if conversational and isinstance(completion, list) and completion:
        # Render the conversation one message at a time: each message's tokens are the new suffix, which is
        # exact for prefix-preserving templates (ChatML and most others). Non-assistant messages get mask 0.
        previous = prompt_ids
        completion_ids = []
        for n, message in enumerate(completion):
            ids = _ids(tokenizer, prompt + completion[: n + 1], tools, False, kwargs)
            if ids[: len(previous)] != previous:
                completion_ids = None  # the template rewrites earlier turns: fall back to plain text
                break
            piece = ids[len(previous):]
            completion_ids.extend(piece)
            mask.extend([1 if message.get("role") == "assistant" else 0] * len(piece))
            previous = ids
    if completion_ids is None:
        completion_ids = tokenizer.encode(_text(completion), add_special_tokens=False)
        if eos is not None:
            completion_ids.append(eos)
        mask = [1] * len(completion_ids)

    # End the sequence on the end-of-turn token (templates add a newline after it), then cut to length.
    if eos is not None and eos in completion_ids:
        last = len(completion_ids) - 1 - completion_ids[::-1].index(eos)
        completion_ids, mask = completion_ids[: last + 1], mask[: last + 1]
    completion_ids, mask = completion_ids[:max_completion_length], mask[:max_completion_length]
    if not completion_ids:
        completion_ids, mask = [eos if eos is not None else 0], [1]
    return prompt_ids, completion_ids, mask
