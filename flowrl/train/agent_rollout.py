"""Rollouts through an agent's own loop, for online GRPO (issue 14; the design: docs/design/issue-14-online-grpo.md).

TRL's GRPOTrainer asks `rollout_func(prompts, trainer)` for completions. `AgentRollout` answers by running the
agent, the host's own code with its prompt, tool parser and tools, once per prompt copy, on a `PolicyBackend`
that samples every reply from the policy being trained. Each run is captured as an ordinary trace (source
"train") into a store, and TRL gets, per run:

- the ids the policy saw and sampled: every LLM call of the run, merged into one sequence (a call's prompt
  extends the previous call's prompt and reply: `flowrl.data.tokens.merge_calls`). The first call's prompt is
  `prompt_ids`; the rest is the completion, with `env_mask` 0 on what the model did not sample (tool results,
  the template's headers between turns), so only sampled tokens get loss;
- `flowrl_trace`: the captured trace, which flowrl's rewards judge (`Reward.as_reward_func`): tool calls that
  were executed, their results, the final answer, the task's reference answer;
- `agent_answer` and `task_id`, for a host's own grading function.

Bounds, decided here and counted, never left to chance:
- a reply gets at most `turn_tokens` new tokens, and an episode at most `episode_tokens` after its first prompt
  (tool output included) and `max_turns` LLM calls; when one runs out the backend raises `EpisodeLimit` into the
  agent (whose run then ends as a failure) and the episode is "stopped" (counted; its whole turns keep their loss);
- an episode gets **no loss** (env_mask all 0; its reward still enters its group's baseline) when a sampled reply
  was cut before its end-of-turn token (`cut`), when its calls do not merge into one sequence (`split`: the agent
  re-rendered or dropped earlier turns), when it made no LLM call, or when its trace was not captured. TRL's own
  `mask_truncated_completions` looks only at the last token, which a template may add; it stays on, and a kept
  episode always ends on a sampled end-of-turn token.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.capture import hook_into_agent
from flowrl.data.tokens import CallTokens, merge_calls
from flowrl.engines.chat_backend import Completion, TokensInBackend
from flowrl.errors import FlowRLError, require
from flowrl.store.files import TraceStore
from flowrl.trace.facts import REFERENCE_KEYS, reference_in
from flowrl.train.offline_grpo import prompt_key

log = logging.getLogger(__name__)

ModelScope = Callable[[], AbstractContextManager[Any]]  # enters with a model ready to `generate`
MASK_REASONS = ("cut", "split", "no_llm_call", "no_trace")


class EpisodeLimit(FlowRLError):
    """flowrl stopped the episode: its turn or token budget is spent (raised into the agent's LLM call)."""


class PolicyBackend(TokensInBackend):
    """Samples each reply from the model `policy()` yields (for a trainer: `PolicyBackend.from_trainer`).

    Greedy at temperature 0. Generation runs under `torch.no_grad()` in the calling thread: agents call their
    backend through `asyncio.to_thread`, and grad mode is per thread, so the trainer's own mode does not carry over.
    `episode()` gives a fresh backend for one run with its bounds; it records the run's calls (`calls`).
    """

    def __init__(
        self,
        policy: ModelScope,
        tokenizer: Any,
        *,
        temperature: float,
        max_new_tokens: int,
        generation_config: Any = None,
        name: str = "policy",
        episode_tokens: int | None = None,
        max_turns: int | None = None,
    ) -> None:
        super().__init__(name, max_new_tokens=max_new_tokens, temperature=temperature, tokenizer=tokenizer)
        self._policy = policy
        self._generation_config = generation_config
        self.episode_tokens = episode_tokens
        self.max_turns = max_turns
        self.calls: list[Any] = []  # CallTokens of every reply, in order
        self.stopped: str | None = None  # "tokens" or "turns" when a bound ended the episode
        self._turn_limit = max_new_tokens
        self._vllm: Any = None  # a colocated vLLM engine (`vllm.LLM`) that generates instead of transformers

    @classmethod
    def from_trainer(cls, trainer: Any, *, max_new_tokens: int) -> PolicyBackend:
        """The policy a TRL GRPOTrainer is training, sampled as TRL samples it: with its generation config in
        transformers, or with its colocated vLLM engine when the trainer has one (`use_vllm`, colocate mode: TRL
        loads the policy's weights into it before each rollout)."""
        from trl.models import unwrap_model_for_generation

        def policy() -> AbstractContextManager[Any]:
            return unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs
            )

        backend = cls(
            policy,
            trainer.processing_class,
            temperature=trainer.temperature,
            max_new_tokens=max_new_tokens,
            generation_config=trainer.generation_config,
        )
        backend._also_stop_at(list(getattr(trainer, "eos_token_ids", []) or []))
        if getattr(trainer, "use_vllm", False):
            backend._vllm = colocated_vllm(trainer)
        return backend

    def episode(self, *, episode_tokens: int | None, max_turns: int | None) -> PolicyBackend:
        """A fresh backend for one run: the same policy, no earlier replies, its own bounds and record."""
        fresh = PolicyBackend(
            self._policy,
            self.tokenizer,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            generation_config=self._generation_config,
            name=self.model_name,
            episode_tokens=episode_tokens,
            max_turns=max_turns,
        )
        fresh._also_stop_at(sorted(self._stop_ids))
        fresh._vllm = self._vllm
        return fresh

    def complete(self, messages: list[dict[str, Any]]) -> Completion:
        prompt = self.render(messages)
        if self.max_turns is not None and len(self.calls) >= self.max_turns:
            self.stopped = "turns"
            raise EpisodeLimit(f"flowrl stopped the episode after {self.max_turns} model turns (max_turns)")
        left = None
        if self.episode_tokens is not None:
            used = len(prompt) - len(self.calls[0].prompt_ids) if self.calls else 0
            left = self.episode_tokens - used
            if left < 1:
                self.stopped = "tokens"
                raise EpisodeLimit(f"flowrl stopped the episode: its {self.episode_tokens} tokens are spent")
        self._turn_limit = self.max_new_tokens if left is None else min(self.max_new_tokens, left)
        tokens, logprobs = self._generate(prompt)
        self.calls.append(CallTokens(list(prompt), list(tokens), list(logprobs), self.fingerprint))
        return self._completion(prompt, tokens, logprobs)

    def ended(self, tokens: list[int]) -> bool:
        """The reply ends with an end-of-turn token (it was not cut off)."""
        return bool(tokens) and tokens[-1] in self._stop_ids

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        if self._vllm is not None:
            return self._generate_vllm(prompt)
        torch = require("torch")
        with torch.no_grad(), self._policy() as model:
            ids = torch.tensor([prompt], device=model.device)
            config = copy.deepcopy(self._generation_config or model.generation_config)
            config.max_new_tokens = self._turn_limit
            config.do_sample = self.temperature > 0
            if self.temperature > 0:
                config.temperature = self.temperature
            config.return_dict_in_generate, config.output_logits = True, True
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        sampled = out.sequences[0, len(prompt) :].tolist()
        end = next((i for i, token in enumerate(sampled) if token in self._stop_ids), None)
        if end is not None:
            sampled = sampled[: end + 1]  # what follows the end-of-turn token is padding
        scale = self.temperature if self.temperature > 0 else 1.0
        logprobs = [
            float(torch.log_softmax(out.logits[t][0].float() / scale, dim=-1)[token]) for t, token in enumerate(sampled)
        ]
        return sampled, logprobs

    def _generate_vllm(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        """One reply from the colocated engine: ids in, ids and their processed (temperature-scaled) logprobs out,
        stopping at the same end-of-turn ids as transformers would."""
        vllm = require("vllm")
        params = vllm.SamplingParams(
            n=1,
            temperature=self.temperature,
            max_tokens=self._turn_limit,
            logprobs=0,
            stop_token_ids=sorted(self._stop_ids),
        )
        (request,) = self._vllm.generate([{"prompt_token_ids": list(prompt)}], sampling_params=params, use_tqdm=False)
        output = request.outputs[0]
        sampled = [int(t) for t in output.token_ids]
        if output.logprobs is None:
            raise FlowRLError(
                "vLLM returned no logprobs for a rollout turn: it must run with logprobs (TRL's colocate engine does)"
            )
        logprobs = [float(step[token].logprob) for step, token in zip(output.logprobs, sampled)]
        return sampled, logprobs


def colocated_vllm(trainer: Any) -> Any:
    """The trainer's colocated vLLM engine, for one process's agent turns. Refused where a per-call `generate`
    from the rollout would not be this process's own: server mode (the client lives on rank 0 and gathers every
    rank's prompts), tensor parallelism (ranks of a group generate together) and sleep mode (TRL wakes the engine
    only inside its own generate)."""
    generation = trainer.vllm_generation
    args = trainer.args
    if generation.mode != "colocate":
        raise FlowRLError("rollouts through an agent need vllm_mode colocate: pass --vllm-mode colocate")
    if getattr(args, "vllm_tensor_parallel_size", 1) != 1:
        raise FlowRLError("rollouts through an agent need vllm_tensor_parallel_size 1: each rank runs its own episodes")
    if getattr(args, "vllm_enable_sleep_mode", False):
        raise FlowRLError("rollouts through an agent cannot use vllm_enable_sleep_mode: drop it from --trl")
    return generation.llm


def _run_to_end(coro: Any) -> Any:
    """`asyncio.run(coro)`, also from a thread that already runs an event loop (a notebook): then on a worker."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# ------------------------------------------------------------------------------------------------
# the agent, its tasks, one episode


async def default_train_run(agent: Any, task: Any) -> str:
    """FlowAgent's entry point, as `flowrl.evaluate.agent.default_run`, with a training session id."""
    result = await agent.a_run(task.query, session_id=f"train-{task.task_id}")
    return result if isinstance(result, str) else str(result)


@dataclass
class AgentAdapter:
    """How online GRPO runs your agent (docs/training.md, "GRPO through the agent").

    - `make_agent(backend)`: a fresh agent, its tools included, whose LLM calls go to `backend` (a `ChatBackend`:
      `complete(messages) -> Completion`). Called once per rollout, so a new agent is the reset.
    - `tasks`: the training tasks, each with `task_id` and `query` and, where known, its answer under one of
      `flowrl.trace.facts.REFERENCE_KEYS` (`answer`, `reference_answer`, ...: the `reference_answer` reward reads it).
      A `--dataset` given to `flowrl train` replaces them (its rows' last user turn is the query).
    - `run(agent, task) -> answer` (async): one task through the agent's loop (default: `a_run(query, ...)`).
      `task` is a `RolloutTask`: `task_id`, `query`, `reference`, and `host`, your own task object (or dataset row).
    - `grade(task, answer) -> bool | float`: your own verdict on a `RolloutTask`, an extra reward `host_grade`.
    - `hook_options`: `hook_into_agent` options for an agent that is not a FlowAgent (`run_methods`, ...).
    - `close()`: called once training ends (a sandbox to shut, say).
    """

    make_agent: Callable[[Any], Any]
    tasks: Sequence[Any] = ()
    run: Callable[[Any, Any], Any] = default_train_run
    grade: Callable[[Any, str], Any] | None = None
    hook_options: dict[str, Any] = field(default_factory=dict)
    name: str = "agent"
    close: Callable[[], None] | None = None


@dataclass
class RolloutTask:
    task_id: str
    query: str
    reference: str | None = None
    host: Any = None  # the host's own task object (or dataset row)

    @property
    def prompt(self) -> list[dict[str, str]]:
        """The dataset prompt TRL hands the rollout (and the rewards): the task's user turn."""
        return [{"role": "user", "content": self.query}]


def _field(task: Any, name: str) -> Any:
    return task.get(name) if isinstance(task, dict) else getattr(task, name, None)


def rollout_task(task: Any, index: int = 0) -> RolloutTask:
    """A host task object or a dataset row (`prompt` messages or `query`) as a `RolloutTask`."""
    query = _field(task, "query")
    prompt = _field(task, "prompt")
    if query is None and isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        query = users[-1] if users else None
    elif query is None and isinstance(prompt, str):
        query = prompt
    if not isinstance(query, str) or not query.strip():
        raise FlowRLError(
            f"training task {index} has no query (a `query`, or a `prompt` with a user turn): fix the task list"
        )
    columns = task if isinstance(task, dict) else {k: _field(task, k) for k in (*REFERENCE_KEYS, "reference_source")}
    reference = reference_in(columns)  # never one a dataset builder guessed from another run's answer
    task_id = _field(task, "task_id") or _field(task, "group_key") or f"task-{index}"
    return RolloutTask(str(task_id), query, reference, task)


def task_rows(tasks: Iterable[RolloutTask]) -> list[dict[str, Any]]:
    """The dataset rows TRL iterates over: each task's prompt (what the rollout looks the task up by) and id."""
    return [{"prompt": t.prompt, "task_id": t.task_id} for t in tasks]


@dataclass
class Episode:
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    answer: str
    trace: Any  # the captured ExecutionTrace, or None when capture failed
    turns: int
    masked: str | None = None  # why the episode gets no loss (MASK_REASONS)
    stopped: str | None = None  # "tokens" or "turns": a bound of flowrl's ended it
    error: str | None = None  # the run raised (the agent did not answer)

    @property
    def tool_tokens(self) -> int:
        return self.env_mask.count(0) if self.masked is None else 0


@dataclass
class RolloutStats:
    """Totals over the run, and the last generation batch's (`last`) for the log."""

    episodes: int = 0
    masked: Counter = field(default_factory=Counter)
    stopped: Counter = field(default_factory=Counter)
    errors: int = 0
    written: int = 0
    tool_calls: int = 0
    last: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "masked": dict(self.masked),
            "stopped": dict(self.stopped),
            "errors": self.errors,
            "written": self.written,
            "tool_calls": self.tool_calls,
        }


class AgentRollout:
    """TRL's `rollout_func` running `adapter`'s agent on the policy, one episode per prompt copy."""

    def __init__(
        self,
        adapter: AgentAdapter,
        tasks: Sequence[Any],
        *,
        store: Any,
        turn_tokens: int,
        episode_tokens: int,
        max_turns: int | None,
    ) -> None:
        self.adapter = adapter
        self.store = store if isinstance(store, TraceStore) else TraceStore(Path(store))
        self.turn_tokens, self.episode_tokens, self.max_turns = turn_tokens, episode_tokens, max_turns
        self.tasks: dict[str, RolloutTask] = {}
        self.duplicates = 0
        for i, raw in enumerate(tasks):
            task = rollout_task(raw, i)
            key = prompt_key(task.prompt)
            if key in self.tasks:  # the rollout sees only the prompt: one prompt, one task
                self.duplicates += 1
                continue
            self.tasks[key] = task
        if not self.tasks:
            raise FlowRLError(
                "online GRPO through the agent needs training tasks: the adapter gave none "
                "(pass --dataset, or tasks in the AgentAdapter)"
            )
        if self.duplicates:
            log.warning(
                "flowrl: %d training tasks repeat another's query and were left out (the rollout "
                "knows a task only by its prompt)",
                self.duplicates,
            )
        self.stats = RolloutStats()
        self._base: PolicyBackend | None = None
        self._said: set[str] = set()

    def train_dataset(self) -> Any:
        return require("datasets").Dataset.from_list(task_rows(self.tasks.values()))

    # ------------------------------------------------------------------ TRL's hook

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """`prompts`: this process's slice of the generation batch, each prompt repeated `num_generations` times
        in a row. One episode per copy, in order, so the copies of a prompt form its group."""
        if self._base is None:
            self._base = PolicyBackend.from_trainer(trainer, max_new_tokens=self.turn_tokens)
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        tasks = []
        for prompt in prompts:
            task = self.tasks.get(prompt_key(prompt))
            if task is None:
                raise FlowRLError(f"rollout_func got a prompt that is no training task: {prompt_key(prompt)[:120]}")
            tasks.append(task)
        rank = getattr(getattr(trainer, "accelerator", None), "process_index", 0)
        episodes = _run_to_end(self._episodes(tasks, step, rank))
        self._account(episodes, trainer, step)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes],
            "env_mask": [e.env_mask for e in episodes],
            "flowrl_trace": [e.trace for e in episodes],
            "agent_answer": [e.answer for e in episodes],
            "task_id": [t.task_id for t in tasks],
        }

    async def _episodes(self, tasks: list[RolloutTask], step: int, rank: int) -> list[Episode]:
        # one at a time: every episode generates with the one policy, and a CPU gains nothing from two at once
        return [await self.episode(task, session=f"grpo-s{step}-p{rank}-{i}") for i, task in enumerate(tasks)]

    async def episode(self, task: RolloutTask, *, session: str) -> Episode:
        """One run of the agent on `task`, captured into the store; its ids, masks and trace."""
        assert self._base is not None
        backend = self._base.episode(episode_tokens=self.episode_tokens, max_turns=self.max_turns)
        agent = self.adapter.make_agent(backend)
        got: dict[str, Any] = {}
        metadata: dict[str, Any] = {"task_id": task.task_id, "rollout": session}
        if task.reference is not None:
            metadata["reference_answer"] = task.reference
        hook = hook_into_agent(
            agent,
            store=self.store,
            source="train",
            metadata=metadata,
            on_trace=lambda trace: got.setdefault("trace", trace),
            **self.adapter.hook_options,
        )
        answer, error = "", None
        try:
            answer = str(await self.adapter.run(agent, task))
        except Exception as exc:  # noqa: BLE001 - the agent's failure is a failed episode, scored as such
            error = f"{type(exc).__name__}: {exc}"
            self._say("run", f"an episode's run raised ({error}); it counts as a failed run")
        finally:
            hook.flush()
            hook.unhook()
        return self._assemble(backend, task, answer, got.get("trace"), error)

    def _assemble(
        self, backend: PolicyBackend, task: RolloutTask, answer: str, trace: Any, error: str | None
    ) -> Episode:
        calls = backend.calls
        masked = None
        if not calls:
            masked = "no_llm_call"
            prompt = backend.render(task.prompt)
            completion, mask, logps = [self._end_token(backend)], [0], [0.0]
        else:
            sequences = merge_calls(calls)
            first = sequences[0]
            n = len(calls[0].prompt_ids)
            prompt, completion, mask = first.input_ids[:n], first.input_ids[n:], first.loss_mask[n:]
            logps = [0.0 if v is None else float(v) for v in (first.logprobs or [None] * len(first.input_ids))[n:]]
            if len(sequences) > 1:
                masked = "split"
            elif not all(backend.ended(c.completion_ids) for c in calls):
                masked = "cut"
        if masked is None and trace is None:
            masked = "no_trace"
        if masked is not None:
            mask = [0] * len(completion)
        return Episode(prompt, completion, mask, logps, answer, trace, len(calls), masked, backend.stopped, error)

    @staticmethod
    def _end_token(backend: PolicyBackend) -> int:
        eos = backend.tokenizer.eos_token_id
        return int(eos if eos is not None else backend.tokenizer.pad_token_id or 0)

    # ------------------------------------------------------------------ what is reported

    def _account(self, episodes: list[Episode], trainer: Any, step: int) -> None:
        s = self.stats
        s.episodes += len(episodes)
        for e in episodes:
            if e.masked:
                s.masked[e.masked] += 1
            if e.stopped:
                s.stopped[e.stopped] += 1
            s.errors += e.error is not None
            s.written += e.trace is not None
            s.tool_calls += len(e.trace.tool_calls) if e.trace is not None else 0
        if any(e.trace is None for e in episodes):
            self._say(
                "trace",
                f"{sum(e.trace is None for e in episodes)} episodes were not captured into "
                f"{self.store.root}: they get no loss and no reward (see the capture warnings above)",
            )
        kept = [e for e in episodes if e.masked is None]
        lengths = [len(e.completion_ids) for e in episodes]
        tool = sum(e.tool_tokens for e in kept)
        total = sum(len(e.completion_ids) for e in kept)
        turns = [e.turns for e in episodes]
        calls = [len(e.trace.tool_calls) for e in episodes if e.trace is not None]
        s.last = {
            "episodes": len(episodes),
            "turns_mean": sum(turns) / len(turns),
            "turns_max": max(turns),
            "tool_calls": sum(calls),
            "completion_tokens_mean": sum(lengths) / len(lengths),
            "completion_tokens_max": max(lengths),
            "masked_tool_tokens": tool,
            "masked_tool_frac": tool / total if total else 0.0,
            "episodes_masked": len(episodes) - len(kept),
            "masked": dict(Counter(e.masked for e in episodes if e.masked)),
            "stopped": dict(Counter(e.stopped for e in episodes if e.stopped)),
            "written": sum(e.trace is not None for e in episodes),
        }
        metrics = getattr(trainer, "_metrics", None)
        if isinstance(metrics, dict) and "train" in metrics:
            for key in (
                "turns_mean",
                "turns_max",
                "tool_calls",
                "completion_tokens_mean",
                "masked_tool_frac",
                "episodes_masked",
                "written",
            ):
                metrics["train"][f"flowrl/rollout/{key}"].append(float(s.last[key]))
            for reason in ("tokens", "turns"):
                metrics["train"][f"flowrl/rollout/stopped_{reason}"].append(float(s.last["stopped"].get(reason, 0)))
        last = s.last
        why = ", ".join(f"{reason} {n}" for reason, n in last["masked"].items())
        log.info(
            "flowrl rollouts (step %d): %d episodes through %s, turns %.1f mean / %d max, %d tool calls executed; "
            "completion %.0f tokens mean / %d max, %d tool-output and header tokens masked (env_mask 0, %.0f%% of "
            "kept tokens); no loss on %d episodes%s; stopped by max_turns %d, by the token budget %d; %d traces "
            "written to %s (source train)",
            step,
            last["episodes"],
            self.adapter.name,
            last["turns_mean"],
            last["turns_max"],
            last["tool_calls"],
            last["completion_tokens_mean"],
            last["completion_tokens_max"],
            last["masked_tool_tokens"],
            100 * last["masked_tool_frac"],
            last["episodes_masked"],
            f" ({why})" if why else "",
            last["stopped"].get("turns", 0),
            last["stopped"].get("tokens", 0),
            last["written"],
            self.store.root,
        )

    def _say(self, key: str, message: str) -> None:
        """Log `message` the first time `key` comes up; later ones are counted in `stats`."""
        if key not in self._said:
            self._said.add(key)
            log.warning("flowrl: %s", message)
