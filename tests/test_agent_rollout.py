"""Online GRPO through the agent's own loop (issue 14): rollouts run the agent, execute its tools, land in the
store as source "train", and TRL trains on the merged episode with tool output masked.

Before this, `flowrl train --method grpo` generated one turn per prompt, executed nothing and scored a trace
rebuilt from the completion text (`trace_from_completion`): an `exec_code` call scored below "The answer is 83."."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agent_fakes import HOOK_OPTIONS, TASKS, ScriptedAgent, scripted_adapter
from helpers_tiny_model import save_tiny_model, tiny_model_and_tokenizer

from flowrl.data.tokens import CallTokens
from flowrl.errors import ConfigError, FlowRLError
from flowrl.store.files import TraceStore
from flowrl.train.agent_grpo import agent_grpo, agent_grpo_trainer, resolve_adapter
from flowrl.train.agent_rollout import AgentRollout, EpisodeLimit, PolicyBackend, rollout_task
from flowrl.train.config import TrainingConfig


def _trainer(tmp_path: Path, parts: Any, extra_rewards: list[Any] = ()) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = tiny_model_and_tokenizer(extra_texts=[t["query"] for t in TASKS])
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        per_device_train_batch_size=4,
        num_generations=2,
        generation_batch_size=4,
        max_completion_length=parts.info["episode_tokens"],
        mask_truncated_completions=True,
        beta=0.0,
        temperature=1.0,
    )
    trainer = agent_grpo_trainer(GRPOTrainer)(
        model=model,
        reward_funcs=[*parts.funcs, *extra_rewards],
        args=args,
        processing_class=tokenizer,
        train_dataset=parts.rollout.train_dataset(),
        rollout_func=parts.rollout.rollout_func,
    )
    trainer.generation_config.sequence_bias = {(tokenizer.eos_token_id,): 6.0}  # replies end before the turn limit
    return trainer


def test_one_grpo_step_runs_the_agent_executes_its_tool_and_masks_the_tool_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = TrainingConfig(
        method="grpo",
        agent="scripted",
        turn_tokens=12,
        max_completion_length=160,
        rewards=["tool_success", "reference_answer"],
    )
    adapter = scripted_adapter()
    parts = agent_grpo(config, adapter, list(adapter.tasks), tmp_path / "store")
    returned: list[dict[str, Any]] = []
    rollout = parts.rollout.rollout_func
    parts.rollout.rollout_func = lambda prompts, trainer: returned.append(rollout(prompts, trainer)) or returned[-1]
    seen: list[Any] = []

    def varied(prompts: list, completions: list, flowrl_trace: list, **kwargs: Any) -> list[float]:
        seen.extend(flowrl_trace)  # a reward that differs within a group, so the step has a gradient
        return [float(len(t.final_response or "")) for t in flowrl_trace]

    trainer = _trainer(tmp_path, parts, [varied])
    assert trainer.train().global_step == 1

    traces = list(TraceStore(tmp_path / "store").iter_traces())
    assert len(traces) == 4 and {t.source for t in traces} == {"train"}
    for trace in traces:
        (call,) = trace.tool_calls
        assert call.tool_name == "lookup" and call.result.startswith("the capital of")  # executed, result kept
        assert trace.metadata["reference_answer"].startswith("City") and len(trace.llm_calls) == 2
    assert {t.trace_id for t in seen} == {t.trace_id for t in traces}  # rewards judged the executed traces

    (out,) = returned
    tokenizer = trainer.processing_class
    for i, (completion, mask) in enumerate(zip(out["completion_ids"], out["env_mask"])):
        trace = out["flowrl_trace"][i]
        first, second = (c.token_ids for c in trace.llm_calls)
        assert sum(mask) == len(first) + len(second)  # loss on sampled tokens only
        assert completion[: len(first)] == first and completion[-len(second) :] == second
        masked = tokenizer.decode([t for t, m in zip(completion, mask) if m == 0])
        assert trace.tool_calls[0].result.split()[-1] in masked  # the tool's output is in the sequence, masked
        assert out["prompt_ids"][i] == trace.llm_calls[0].prompt_token_ids
    logged = trainer.state.log_history[0]
    assert logged["rewards/flowrl_tool_success/mean"] == 1.0
    assert logged["flowrl/rollout/tool_calls"] == 4.0 and logged["flowrl/rollout/episodes_masked"] == 0.0
    assert logged["grad_norm"] > 0
    assert parts.rollout.stats.to_dict()["written"] == 4


class _Scripted(PolicyBackend):
    """A PolicyBackend whose replies are given (ids), to test the bounds without a model."""

    def __init__(self, replies: list[list[int]], **kwargs: Any) -> None:
        _, tokenizer = tiny_model_and_tokenizer()
        super().__init__(contextlib.nullcontext, tokenizer, temperature=1.0, max_new_tokens=8, **kwargs)
        self.replies = replies
        self.limits: list[int] = []

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        self.limits.append(self._turn_limit)
        reply = self.replies.pop(0)[: self._turn_limit]
        return reply, [-1.0] * len(reply)


def test_the_turn_and_token_bounds_stop_the_episode_and_say_which() -> None:
    eos = tiny_model_and_tokenizer()[1].eos_token_id
    backend = _Scripted([[5, eos]] * 5, max_turns=2)
    talk = [{"role": "user", "content": "hello"}]
    backend.complete(talk)
    backend.complete([*talk, {"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}])
    with pytest.raises(EpisodeLimit, match="2 model turns"):
        backend.complete(talk)
    assert backend.stopped == "turns"

    first_prompt = len(_Scripted([[5, eos]]).render(talk))
    long_talk = [*talk, {"role": "assistant", "content": "x"}, {"role": "user", "content": "word " * 12}]
    grown = len(_Scripted([[5, eos]]).render(long_talk)) - first_prompt
    budget = _Scripted([[5, eos], [6, 7, 8, 9, 10, 11, 12, 13]], episode_tokens=grown + 3)
    budget.complete(talk)
    budget.complete(long_talk)
    assert budget.limits == [8, 3]  # the second turn gets what is left of the episode's tokens
    with pytest.raises(EpisodeLimit, match="tokens are spent"):
        budget.complete([*long_talk, {"role": "assistant", "content": "y"}, {"role": "user", "content": "more"}])
    assert budget.stopped == "tokens"


def _rollout(tmp_path: Path) -> AgentRollout:
    return AgentRollout(scripted_adapter(), TASKS, store=tmp_path, turn_tokens=8, episode_tokens=64, max_turns=4)


def test_an_episode_with_a_cut_reply_or_a_split_sequence_gets_no_loss(tmp_path: Path) -> None:
    rollout = _rollout(tmp_path)
    eos = tiny_model_and_tokenizer()[1].eos_token_id
    trace = SimpleNamespace(tool_calls=[])
    task = next(iter(rollout.tasks.values()))

    def backend(calls: list[CallTokens]) -> _Scripted:
        b = _Scripted([])
        b.calls = calls
        return b

    whole = rollout._assemble(
        backend(
            [
                CallTokens([11, 12], [13, eos], [-1.0, -1.0], None),
                CallTokens([11, 12, 13, eos, 19, 19], [14, eos], [-1.0, -1.0], None),
            ]
        ),
        task,
        "a",
        trace,
        None,
    )
    assert whole.masked is None and whole.completion_ids == [13, eos, 19, 19, 14, eos]
    assert whole.env_mask == [1, 1, 0, 0, 1, 1] and whole.tool_tokens == 2
    cut = rollout._assemble(backend([CallTokens([11, 12], [13, 13], [-1.0, -1.0], None)]), task, "a", trace, None)
    assert cut.masked == "cut" and cut.env_mask == [0, 0]
    split = rollout._assemble(
        backend(
            [
                CallTokens([11, 12], [13, eos], [-1.0, -1.0], None),
                CallTokens([17, 17, 17], [14, eos], [-1.0, -1.0], None),
            ]
        ),
        task,
        "a",
        trace,
        None,
    )
    assert split.masked == "split" and set(split.env_mask) == {0}
    lost = rollout._assemble(backend([CallTokens([11, 12], [13, eos], [-1.0, -1.0], None)]), task, "a", None, None)
    assert lost.masked == "no_trace"
    none = rollout._assemble(backend([]), task, "", None, "RuntimeError: down")
    assert none.masked == "no_llm_call" and none.env_mask == [0]
    assert none.prompt_ids == _Scripted([]).render(task.prompt)  # the task's user turn, as the agent was asked


def test_zero_variance_groups_are_dropped_from_the_loss_and_the_normaliser() -> None:
    import torch

    cls = agent_grpo_trainer(object)
    fake = SimpleNamespace(num_generations=2, accelerator=SimpleNamespace(gather=lambda t: t.reshape(1)))
    out = {
        "advantages": torch.tensor([0.7, -0.7, 0.0, 0.0]),
        "completion_mask": torch.ones(4, 3, dtype=torch.int),
        "tool_mask": torch.tensor([[1, 0, 1]] * 4),
        "num_items_in_batch": torch.tensor(8),
    }
    assert cls._drop_zero_std(fake, out) == 1
    assert out["completion_mask"][:2].sum() == 6 and out["completion_mask"][2:].sum() == 0
    assert int(out["num_items_in_batch"]) == 4  # the kept group's loss tokens only


def test_tasks_come_from_host_objects_or_dataset_rows_and_repeated_queries_are_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    row = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+2?"}],
        "expected_answer": "4",
        "task_id": "r1",
    }
    task = rollout_task(row)
    assert (task.task_id, task.query, task.reference, task.host) == ("r1", "What is 2+2?", "4", row)
    assert rollout_task(SimpleNamespace(task_id="h", query="q", answer=7)).reference == "7"
    guessed = {"prompt": row["prompt"], "reference_answer": "The answer is 4.", "reference_source": "best_trace"}
    assert rollout_task(guessed).reference is None  # taken from another run's answer: no reference
    with pytest.raises(FlowRLError, match="no query"):
        rollout_task({"prompt": []}, 3)
    rollout = AgentRollout(
        scripted_adapter(),
        [*TASKS, dict(TASKS[0], task_id="again")],
        store=tmp_path,
        turn_tokens=8,
        episode_tokens=64,
        max_turns=None,
    )
    assert len(rollout.tasks) == 4 and rollout.duplicates == 1 and "repeat another's query" in caplog.text


def test_config_and_adapter_errors_are_one_line() -> None:
    with pytest.raises(ConfigError, match="for --method grpo"):
        TrainingConfig.from_dict({"method": "kto", "agent": "example", "dataset": "x"})
    with pytest.raises(ConfigError, match="give a dataset"):
        TrainingConfig.from_dict({"method": "grpo"})
    assert TrainingConfig.from_dict({"method": "grpo", "agent": "example"}).resolved_store == Path(
        "out/train-grpo/rollouts"
    )
    with pytest.raises(ConfigError, match="module:function"):
        resolve_adapter("no_colon")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_adapter("flowrl_nowhere:f")
    with pytest.raises(ConfigError, match="not a flowrl.train.agent_rollout.AgentAdapter"):
        resolve_adapter(lambda: object())
    config = TrainingConfig(method="grpo", agent="x", turn_tokens=600, max_completion_length=512)
    with pytest.raises(ConfigError, match="--turn-tokens 600"):
        agent_grpo(config, scripted_adapter(), TASKS, Path("unused"))


def test_a_host_grade_function_is_a_reward(tmp_path: Path) -> None:
    config = TrainingConfig(method="grpo", agent="x", rewards=["task_completion"])
    adapter = scripted_adapter(grade=lambda task, answer: task.reference in answer)
    parts = agent_grpo(config, adapter, TASKS, tmp_path)
    assert [f.__name__ for f in parts.funcs][-1] == "host_grade" and parts.weights[-1] == 20.0
    values = parts.funcs[-1]([], ["", ""], agent_answer=["It is City0.", "no idea"], task_id=["t0", "t0"])
    assert values == [1.0, 0.0]


def test_flowrl_train_with_agent_writes_rollouts_and_a_run_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowrl.cli import main

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model = save_tiny_model(tmp_path / "tiny", extra_texts=[t["query"] for t in TASKS])
    out, store = tmp_path / "out", tmp_path / "rollouts"
    assert (
        main(
            [
                "train",
                "--method",
                "grpo",
                "--agent",
                "agent_fakes:scripted_adapter",
                "--base-model",
                str(model),
                "--output-dir",
                str(out),
                "--store",
                str(store),
                "--max-steps",
                "1",
                "--num-generations",
                "2",
                "--batch-size",
                "2",
                "--turn-tokens",
                "6",
                "--max-completion-length",
                "200",
                "--no-progress",
                "--rewards",
                "tool_success",
            ]
        )
        == 0
    )
    traces = list(TraceStore(store).iter_traces())
    assert len(traces) == 2 and all(t.source == "train" and t.tool_calls[0].result for t in traces)
    record = json.loads((out / "flowrl_train.json").read_text())
    info = record["result"]["info"]
    # each stored rollout carries the rewards it was trained on, and their weighted sum (they were stored empty)
    (weight,) = info["reward_weights"]
    assert [(t.rewards, t.reward_score) for t in traces] == [({"flowrl_tool_success": 1.0}, weight)] * 2
    assert info["rollouts"]["written"] == 2 and info["rollouts"]["tool_calls"] == 2
    assert info["rollout"]["episode_tokens"] == 200 and info["rollout"]["turn_tokens"] == 6
    assert (out / "adapter_model.safetensors").is_file()


def test_scripted_agent_runs_hooked_as_a_generic_agent(tmp_path: Path) -> None:
    """The fake itself: its runs are captured with the options the adapter names (no model needed)."""
    import asyncio

    from flowrl.capture import hook_into_agent
    from flowrl.engines.chat_backend import Completion

    backend = SimpleNamespace(complete=lambda messages: Completion("City1", 3, 1))
    agent = ScriptedAgent(backend)
    with hook_into_agent(agent, store=tmp_path, source="train", **HOOK_OPTIONS) as hook:
        assert asyncio.run(agent.a_run("What is the capital of country 1?")) == "City1"
        hook.flush()
    (trace,) = TraceStore(tmp_path).iter_traces()
    assert trace.source == "train" and trace.tool_calls[0].result == "the capital of 1 is City1"


def test_capture_source_and_on_trace_options_never_hurt_the_agent(tmp_path: Path) -> None:
    import asyncio

    from flowrl.capture import hook_into_agent
    from flowrl.engines.chat_backend import Completion

    backend = SimpleNamespace(complete=lambda messages: Completion("City2", 3, 1))
    with pytest.raises(ConfigError, match="source 'training'"):
        hook_into_agent(ScriptedAgent(backend), store=tmp_path, source="training", **HOOK_OPTIONS)

    def broken(trace: Any) -> None:
        raise RuntimeError("the callback broke")

    agent = ScriptedAgent(backend)
    with hook_into_agent(agent, store=tmp_path, on_trace=broken, **HOOK_OPTIONS) as hook:
        assert asyncio.run(agent.a_run("What is the capital of country 2?")) == "City2"
        hook.flush()
        assert hook.stats.written == 1 and hook.stats.errors == 1
    (trace,) = TraceStore(tmp_path).iter_traces()
    assert trace.source == "live"


def test_single_turn_grpo_on_prompts_with_tools_says_the_tools_are_not_executed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from datasets import Dataset

    from flowrl.train.data_io import LoadedData
    from flowrl.train.trainers import warn_unexecuted_tools

    rows = [
        {"prompt": [{"role": "user", "content": "q"}], "tools": [{"name": "exec_code"}] if i else []} for i in range(3)
    ]
    assert warn_unexecuted_tools(LoadedData(Dataset.from_list(rows), None, source="ds")) == 2
    assert "2 of 3 prompts in ds offer tools" in caplog.text and "--agent" in caplog.text
    assert warn_unexecuted_tools(LoadedData(Dataset.from_list([{"prompt": "q"}]), None)) == 0


def test_a_dataset_gives_the_agent_its_tasks_with_their_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowrl.cli import main

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is the capital of country {i}?"}],
            "reference_answer": f"City{i}",
        }
        for i in (7, 8)
    ]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = save_tiny_model(tmp_path / "tiny", extra_texts=[r["prompt"][0]["content"] for r in rows])
    assert (
        main(
            [
                "train",
                "--method",
                "grpo",
                "--agent",
                "agent_fakes:scripted_adapter",
                "--dataset",
                str(data),
                "--base-model",
                str(model),
                "--output-dir",
                str(tmp_path / "out"),
                "--max-steps",
                "1",
                "--num-generations",
                "2",
                "--batch-size",
                "2",
                "--turn-tokens",
                "4",
                "--no-progress",
                "--rewards",
                "reference_answer",
            ]
        )
        == 0
    )
    traces = list(TraceStore(tmp_path / "out" / "rollouts").iter_traces())
    assert len(traces) == 2 and len({t.user_query for t in traces}) == 1
    trace = traces[0]
    assert trace.metadata["reference_answer"] == "City" + trace.user_query.rstrip("?").rsplit(" ", 1)[-1]


def test_episodes_run_to_the_end_also_under_a_running_event_loop() -> None:
    import asyncio

    from flowrl.train.agent_rollout import _run_to_end

    async def answer() -> int:
        return 42

    async def inside_a_notebook() -> int:
        return _run_to_end(answer())

    assert _run_to_end(answer()) == 42 and asyncio.run(inside_a_notebook()) == 42
