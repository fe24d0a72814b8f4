"""PolicyBackend: the agent's backend during online GRPO samples from the live policy, with TRL's logprobs.

The model is `helpers_tiny_model.save_lively_tiny_model`, held in memory as a trainer would hold it."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers_tiny_model import save_lively_tiny_model

from flowrl.engines.transformers_backend import TransformersBackend
from flowrl.train.agent_rollout import PolicyBackend

PROMPTS = [[{"role": "user", "content": f"What is {i} times {i * 3}?" + " please" * i}] for i in range(4)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_lively_tiny_model(tmp_path_factory.mktemp("lively_tiny"), PROMPTS[0])


def _policy(model_dir: Path, **kwargs: Any) -> tuple[PolicyBackend, Any]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    backend = PolicyBackend(
        lambda: contextlib.nullcontext(model), tokenizer, **{"temperature": 0.0, "max_new_tokens": 16, **kwargs}
    )
    return backend, model


def test_greedy_replies_are_the_reference_backends(model_dir: Path) -> None:
    policy, _ = _policy(model_dir)
    reference = TransformersBackend(model_dir, max_new_tokens=16, temperature=0.0, batch_size=1)
    for messages in PROMPTS:
        ours, theirs = policy.complete(messages), reference.complete(messages)
        assert ours.prompt_token_ids == theirs.prompt_token_ids and ours.token_ids == theirs.token_ids
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


def test_sampled_logprobs_are_trls_and_the_trainers_grad_mode_is_left_alone(model_dir: Path) -> None:
    import torch

    policy, model = _policy(model_dir, temperature=0.7)
    model.train()
    replies: list[Any] = []
    worker = threading.Thread(target=lambda: replies.append(policy.complete(PROMPTS[1])))
    worker.start()
    worker.join(timeout=60)
    (reply,) = replies
    assert 1 <= len(reply.token_ids) <= 16
    ids = torch.tensor([reply.prompt_token_ids + reply.token_ids])
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits[0, len(reply.prompt_token_ids) - 1 : -1].float() / 0.7
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(reply.token_ids)[:, None]).squeeze(1).tolist()
    assert reply.logprobs == pytest.approx(expected, abs=1e-4)  # TRL's per-token logp: softmax(logits / T)
    assert all(p.grad is None for p in model.parameters())


def test_a_second_turn_starts_with_the_ids_the_policy_sampled(model_dir: Path) -> None:
    policy, _ = _policy(model_dir, temperature=1.0)
    first = policy.complete(PROMPTS[2])
    second = policy.complete(
        [*PROMPTS[2], {"role": "assistant", "content": first.text}, {"role": "user", "content": "and then?"}]
    )
    assert (
        second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.token_ids)]
        == first.prompt_token_ids + first.token_ids
    )


def test_from_trainer_samples_the_policy_inside_a_grpo_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One GRPO step whose rollout asks PolicyBackend.from_trainer for every completion: TRL trains on them."""
    from datasets import Dataset
    from helpers_tiny_model import tiny_model_and_tokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = tiny_model_and_tokenizer()
    replies: list[Any] = []

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        backend = PolicyBackend.from_trainer(trainer, max_new_tokens=8)
        got = [backend.complete(prompt) for prompt in prompts]
        replies.extend(got)
        return {
            "prompt_ids": [r.prompt_token_ids for r in got],
            "completion_ids": [r.token_ids for r in got],
            "logprobs": [r.logprobs for r in got],
        }

    def length(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        return [float(len(str(c))) for c in completions]

    data = Dataset.from_list([{"prompt": m} for m in PROMPTS[:2]])
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        per_device_train_batch_size=2,
        num_generations=2,
        generation_batch_size=2,
        max_completion_length=8,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length,
        args=args,
        processing_class=tokenizer,
        train_dataset=data,
        rollout_func=rollout_func,
    )
    assert trainer.train().global_step == 1
    assert len(replies) == 2 and all(
        1 <= len(r.token_ids) <= 8 and len(r.logprobs) == len(r.token_ids) for r in replies
    )
