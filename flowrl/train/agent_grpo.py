"""Online GRPO through the agent: what `flowrl train --method grpo --agent ...` adds to TRL's GRPOTrainer.

- `resolve_adapter(spec)`: `module:function`, a function of yours that returns an `AgentAdapter`
  (flowrl.train.agent_rollout); the CLI maps `example` to the example agent's (flowrl.demo.example_agents).
- `agent_grpo(...)`: the rollout (`AgentRollout`), the reward functions and what was decided. The rewards are
  flowrl's reward engine applied to each rollout's executed trace (`flowrl_trace`), with correctness dominant as in
  the engine (reference_answer 20, task_completion 10, the style rewards 6.5 together), plus `host_grade` when the
  adapter has a `grade` function (weight 20).
- `agent_grpo_trainer(GRPOTrainer)`: a subclass that records on each stored rollout the rewards it was trained
  on (`record_rewards`: `rewards` and `reward_score`, so `flowrl review` and the report show them), and drops
  groups whose rewards are all equal (their advantages are
  0; TRL 1.16 only reports them as `frac_reward_zero_std`, and their tokens still dilute the loss normaliser): their
  loss masks are zeroed and the normaliser recounted. It logs one line per generation batch: the rewards computed
  on the executed trajectories and the groups dropped.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, require
from flowrl.train.agent_rollout import AgentAdapter, AgentRollout, RolloutTask, rollout_task, task_rows
from flowrl.train.data_io import LoadedData
from flowrl.train.reward_funcs import online_reward_funcs

log = logging.getLogger("flowrl.train.agent_rollout")  # one logger for the rollout's lines

DEFAULT_TURN_TOKENS = 96
DEFAULT_EPISODE_TOKENS = 512
HOST_GRADE_WEIGHT = 20.0  # as reference_answer: a host's verdict outweighs every style reward together
ZERO = 1e-6  # |advantage| below this, for every member: the group's rewards were all equal


def resolve_adapter(spec: str | AgentAdapter | Callable[[], AgentAdapter]) -> AgentAdapter:
    """`module:function` (called with no argument) or an adapter (or a function returning one). The flowrl CLI
    also takes `example`: `flowrl.demo.example_agents:example_adapter`."""
    if isinstance(spec, AgentAdapter):
        return spec
    if callable(spec):
        made = spec()
    else:
        module_name, _, name = spec.partition(":")
        if not module_name or not name:
            raise ConfigError(
                f"--agent {spec!r}: use `example` or `module:function` (a function returning an AgentAdapter)"
            )
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--agent {spec!r}: cannot import {spec} ({exc})") from exc
        made = factory()
    if not isinstance(made, AgentAdapter):
        raise ConfigError(
            f"--agent {spec!r} returned a {type(made).__name__}, not a flowrl.train.agent_rollout.AgentAdapter"
        )
    return made


def tasks_data(adapter: AgentAdapter) -> Any:
    """The adapter's tasks as the run's dataset (`LoadedData`): one `prompt` row per task."""
    rows = task_rows(rollout_task(t, i) for i, t in enumerate(adapter.tasks))
    if not rows:
        raise ConfigError(
            f"agent {adapter.name} brings no training tasks: pass --dataset, or give the AgentAdapter tasks"
        )
    return LoadedData(
        train=require("datasets").Dataset.from_list(rows),
        eval=None,
        meta={"method": "grpo"},
        source=f"{len(rows)} tasks of {adapter.name}",
    )


@dataclass
class AgentGRPO:
    rollout: AgentRollout
    funcs: list[Any]
    weights: list[float]
    info: dict[str, Any]


def agent_grpo(config: Any, adapter: AgentAdapter, tasks: list[Any], store: Path) -> AgentGRPO:
    """The rollout and rewards of an online GRPO run through `adapter`'s agent on `tasks`."""
    turn_tokens = config.turn_tokens or DEFAULT_TURN_TOKENS
    episode_tokens = config.max_completion_length or DEFAULT_EPISODE_TOKENS
    if turn_tokens > episode_tokens:
        raise ConfigError(
            f"--turn-tokens {turn_tokens} is more than the episode's --max-completion-length "
            f"{episode_tokens}: lower it or raise --max-completion-length"
        )
    rollout = AgentRollout(
        adapter, tasks, store=store, turn_tokens=turn_tokens, episode_tokens=episode_tokens, max_turns=config.max_turns
    )
    funcs, weights = online_reward_funcs(config)
    if adapter.grade is not None:
        funcs.append(host_grade_func(adapter, rollout))
        weights.append(HOST_GRADE_WEIGHT)
    with_reference = sum(t.reference is not None for t in rollout.tasks.values())
    info = {
        "agent": adapter.name,
        "tasks": len(rollout.tasks),
        "tasks_with_reference": with_reference,
        "duplicate_tasks": rollout.duplicates,
        "store": str(store),
        "turn_tokens": turn_tokens,
        "episode_tokens": episode_tokens,
        "max_turns": config.max_turns,
        "drop_zero_std_groups": config.drop_zero_std_groups,
    }
    if not with_reference and adapter.grade is None:
        log.warning(
            "flowrl: none of the %d training tasks has a reference answer and the adapter has no grade "
            "function: rewards judge how runs went (task_completion, tools), not whether answers are right",
            len(rollout.tasks),
        )
    return AgentGRPO(rollout, funcs, weights, info)


def host_grade_func(adapter: AgentAdapter, rollout: AgentRollout) -> Callable[..., list[float | None]]:
    """The adapter's `grade(task, answer)` as a TRL reward function named `host_grade`."""
    by_id: dict[str, RolloutTask] = {t.task_id: t for t in rollout.tasks.values()}
    failed = {"n": 0}

    def host_grade(
        prompts: list[Any],
        completions: list[Any],
        agent_answer: list[str] | None = None,
        task_id: list[str] | None = None,
        **_: Any,
    ) -> list[float | None]:
        out: list[float | None] = []
        for answer, tid in zip(agent_answer or [], task_id or []):
            task = by_id[tid]
            try:
                out.append(float(adapter.grade(task, answer)))  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - the host's grader failing is "cannot judge", said once
                failed["n"] += 1
                if failed["n"] == 1:
                    log.warning(
                        "flowrl: the adapter's grade function raised on task %s (%s): None for it; "
                        "later failures are counted only",
                        tid,
                        exc,
                    )
                out.append(None)
        return out

    return host_grade


def record_rewards(
    store: Any, traces: list[Any], names: list[str], weights: list[float], rows: list[list[float]]
) -> int:
    """Each rollout's rewards as it was trained on them, on its stored trace: `rewards` (name -> value, None where
    the reward could not judge) and `reward_score` (their weighted sum over the ones that judged); the traces
    written. A trace that cannot be written is logged, never raised into the run."""
    written = 0
    for trace, values in zip(traces, rows):
        if trace is None:
            continue
        trace.rewards = {n: (None if v != v else float(v)) for n, v in zip(names, values)}
        judged = [(w, v) for w, v in zip(weights, values) if v == v]
        trace.reward_score = sum(w * v for w, v in judged) if judged else None
        try:
            store.update(trace)
            written += 1
        except Exception as exc:  # noqa: BLE001 - a rollout's record must not stop training
            log.warning("flowrl: could not record the rewards of rollout %s in %s: %s", trace.trace_id, store.root, exc)
    return written


def agent_grpo_trainer(base: type, *, drop_zero_std: bool = True, store: Any = None) -> type:
    """`base` (TRL's GRPOTrainer) that drops zero-variance groups, logs each batch's rewards and, with a `store`,
    records on each rollout's trace the rewards it was trained on (`record_rewards`)."""

    class AgentGRPOTrainer(base):
        def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if store is not None:  # rows of every process, gathered: this process's come at its index
                start = self.accelerator.process_index * len(inputs)
                mine = rewards[start : start + len(inputs)].tolist()
                weights = [float(w) for w in self.reward_weights]
                traces = [inp.get("flowrl_trace") for inp in inputs]
                record_rewards(store, traces, list(self.reward_func_names), weights, mine)
            return rewards

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            mode = "train" if self.model.training else "eval"
            dropped = self._drop_zero_std(out) if drop_zero_std and mode == "train" else 0
            metrics = self._metrics[mode]
            metrics["flowrl/zero_std_groups_dropped"].append(float(dropped))
            rewards = {
                k[len("rewards/") : -len("/mean")]: v[-1]
                for k, v in metrics.items()
                if k.startswith("rewards/") and k.endswith("/mean") and v
            }
            groups = len(out["advantages"]) // self.num_generations
            log.info(
                "flowrl rewards on the executed trajectories: reward %.3f (std %.3f), %s; groups with equal "
                "rewards: %d of %d, %s",
                metrics["reward"][-1],
                metrics["reward_std"][-1],
                ", ".join(f"{k} {v:.3f}" for k, v in rewards.items() if v == v) or "no reward could judge",
                round(metrics["frac_reward_zero_std"][-1] * groups),
                groups,
                f"{dropped} dropped from the loss" if drop_zero_std else "kept (--keep-zero-std)",
            )
            return out

        def _drop_zero_std(self, out: dict[str, Any]) -> int:
            advantages = out["advantages"]
            g = self.num_generations
            if advantages.numel() % g:
                return 0  # this process's slice does not hold whole groups: nothing is dropped
            flat = (advantages.view(-1, g).abs() < ZERO).all(dim=1)
            keep = (~flat.repeat_interleave(g)).unsqueeze(1).int()
            out["completion_mask"] = out["completion_mask"] * keep
            loss_mask = out["completion_mask"]
            if out.get("tool_mask") is not None:
                out["tool_mask"] = out["tool_mask"] * keep
                loss_mask = loss_mask * out["tool_mask"]
            # every process gathers (a collective call), whether or not it dropped a group
            out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            return int(flat.sum())

    AgentGRPOTrainer.__name__ = AgentGRPOTrainer.__qualname__ = f"Agent{base.__name__}"
    return AgentGRPOTrainer
