"""Each builder's output is accepted by the matching TRL trainer: one real step on a tiny random model.

CPU only, no downloads: the model and tokenizer come from helpers_tiny_model. Each test runs in a few
seconds once torch/transformers/trl are imported.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import orjson
import pytest

pytest.importorskip("trl")

from helpers_tiny_model import tiny_model_and_tokenizer  # noqa: E402

from flowrl.data import (  # noqa: E402
    DatasetPipeline,
    DPODatasetBuilder,
    GRPODatasetBuilder,
    KTODatasetBuilder,
    SFTDatasetBuilder,
    kto_weights,
)
from flowrl.data.synthetic import synthetic_trace  # noqa: E402

TRACES = [synthetic_trace(i, n_tasks=4) for i in range(24)]


def _args(tmp_path: Any, **kw: Any) -> dict[str, Any]:
    return dict(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        per_device_train_batch_size=2,
        **kw,
    )


def _dataset(builder: Any) -> Any:
    return DatasetPipeline(builder, val_fraction=0.0).to_dataset_dict(TRACES)["train"]


def test_kto_rows_train_with_ktotrainer_and_the_computed_weights(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from trl import KTOConfig, KTOTrainer

    train = _dataset(KTODatasetBuilder()).select(range(12))
    n_true = sum(train["label"])
    assert 0 < n_true < len(train)
    wd, wu = kto_weights(n_true, len(train) - n_true)
    model, tok = tiny_model_and_tokenizer()
    args = KTOConfig(max_length=1024, desirable_weight=wd, undesirable_weight=wu, **_args(tmp_path))
    with caplog.at_level(logging.WARNING):
        trainer = KTOTrainer(
            model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tok, train_dataset=train
        )
    assert "don't seem to be in an ideal range" not in caplog.text
    assert trainer.train().global_step == 1


def test_grpo_prompt_rows_train_with_grpotrainer_and_reach_reward_functions(tmp_path: Any) -> None:
    from trl import GRPOConfig, GRPOTrainer

    seen: dict[str, Any] = {}

    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        seen.update(kwargs)
        return [float(i % 2) for i in range(len(completions))]

    model, tok = tiny_model_and_tokenizer()
    args = GRPOConfig(num_generations=2, max_completion_length=8, generation_batch_size=2, **_args(tmp_path))
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, processing_class=tok, train_dataset=_dataset(GRPODatasetBuilder())
    )
    assert trainer.train().global_step == 1
    assert seen["reference_answer"][0].isdigit() and seen["tools"][0][0]["function"]["name"] == "exec_code"
    assert {"group_id", "test_code", "trace_id"} <= set(seen)


def test_sft_messages_train_with_assistant_only_loss(tmp_path: Any) -> None:
    from trl import SFTConfig, SFTTrainer

    model, tok = tiny_model_and_tokenizer()
    args = SFTConfig(max_length=256, assistant_only_loss=True, **_args(tmp_path))
    trainer = SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=_dataset(SFTDatasetBuilder()))
    assert trainer.train().global_step == 1


def test_dpo_pairs_train_with_dpotrainer(tmp_path: Any) -> None:
    from trl import DPOConfig, DPOTrainer

    model, tok = tiny_model_and_tokenizer()
    trainer = DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=DPOConfig(max_length=256, **_args(tmp_path)),
        processing_class=tok,
        train_dataset=_dataset(DPODatasetBuilder()),
    )
    assert trainer.train().global_step == 1


def test_grpo_offline_groups_replay_through_a_rollout_func(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented replay: logged completions tokenised after their prompt, tool tokens masked out
    with env_mask, the logged reward passed through to a reward function."""
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    train = _dataset(GRPODatasetBuilder(offline=True))
    model, tok = tiny_model_and_tokenizer()
    by_prompt = {orjson.dumps(r["prompt"]): r for r in train}
    served: dict[bytes, int] = {}

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        out: dict[str, list] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "logged_reward": [],
        }
        for prompt in prompts:
            key = orjson.dumps(prompt)
            row, k = by_prompt[key], served.get(key, 0)
            served[key] = k + 1
            i = k % row["group_size"]
            tools = row["tools"]
            prompt_ids = tok.apply_chat_template(
                prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            full = tok.apply_chat_template(
                prompt + row["logged_completions"][i],
                tools=tools,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            assert full["input_ids"][: len(prompt_ids)] == prompt_ids
            completion = full["input_ids"][len(prompt_ids) :]
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append([0.0] * len(completion))
            out["env_mask"].append(full["assistant_masks"][len(prompt_ids) :])
            out["logged_reward"].append(row["logged_rewards"][i])
        return out

    def logged(prompts: list, completions: list, logged_reward: list, **kwargs: Any) -> list[float]:
        return logged_reward

    assert all(r["group_size"] >= 2 and len(set(r["logged_rewards"])) > 1 for r in train)
    args = GRPOConfig(num_generations=2, max_completion_length=512, generation_batch_size=2, **_args(tmp_path))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=logged,
        args=args,
        processing_class=tok,
        train_dataset=train,
        rollout_func=rollout_func,
    )
    assert trainer.train().global_step == 1
    assert sum(served.values()) == 2
    os.environ.pop("TRL_EXPERIMENTAL_SILENCE", None)
