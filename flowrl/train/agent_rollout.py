"""Rollouts through an agent's own loop, for online GRPO (issue 14; the plan: docs/design/issue-14-online-grpo.md).

Built so far: `PolicyBackend`, the model behind the agent while it is trained. It is a `TokensInBackend` that
samples from the policy a trainer holds at this moment (a LoRA adapter included, live, not a merged copy), so each
reply comes with the ids the policy sampled and their log-probabilities under softmax(logits / temperature), the
quantity TRL's GRPO computes for the same tokens. Earlier replies go back to the model as their sampled ids, so the
calls of one episode merge into one training sequence (`flowrl.data.tokens.merge_calls`).

Not built yet (see the plan): the rollout function that runs the agent per prompt, merges and masks each episode,
and hands TRL the executed traces (`flowrl_trace`, which the reward functions already judge).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from flowrl.errors import require
from flowrl.train.chat_backend import TokensInBackend

ModelScope = Callable[[], AbstractContextManager[Any]]  # enters with a model ready to `generate`


class PolicyBackend(TokensInBackend):
    """Samples each reply from the model `policy()` yields (for a trainer: `PolicyBackend.from_trainer`).

    Greedy at temperature 0. Generation runs under `torch.no_grad()` in the calling thread: agents call their
    backend through `asyncio.to_thread`, and grad mode is per thread, so the trainer's own mode does not carry over.
    """

    def __init__(self, policy: ModelScope, tokenizer: Any, *, temperature: float, max_new_tokens: int,
                 generation_config: Any = None, name: str = "policy") -> None:
        super().__init__(name, max_new_tokens=max_new_tokens, temperature=temperature, tokenizer=tokenizer)
        self._policy = policy
        self._generation_config = generation_config

    @classmethod
    def from_trainer(cls, trainer: Any, *, max_new_tokens: int) -> PolicyBackend:
        """The policy a TRL GRPOTrainer is training, sampled as TRL samples it (its generation config)."""
        from trl.models import unwrap_model_for_generation

        def policy() -> AbstractContextManager[Any]:
            return unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                               generation_kwargs=trainer.generation_kwargs)

        backend = cls(policy, trainer.processing_class, temperature=trainer.temperature, max_new_tokens=max_new_tokens,
                      generation_config=trainer.generation_config)
        backend._also_stop_at(list(getattr(trainer, "eos_token_ids", []) or []))
        return backend

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        torch = require("torch")
        with torch.no_grad(), self._policy() as model:
            ids = torch.tensor([prompt], device=model.device)
            config = copy.deepcopy(self._generation_config or model.generation_config)
            config.max_new_tokens = self.max_new_tokens
            config.do_sample = self.temperature > 0
            if self.temperature > 0:
                config.temperature = self.temperature
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                 return_dict_in_generate=True, output_logits=True)
        sampled = out.sequences[0, len(prompt):].tolist()
        end = next((i for i, token in enumerate(sampled) if token in self._stop_ids), None)
        if end is not None:
            sampled = sampled[: end + 1]  # what follows the end-of-turn token is padding
        scale = self.temperature if self.temperature > 0 else 1.0
        logprobs = [float(torch.log_softmax(out.logits[t][0].float() / scale, dim=-1)[token])
                    for t, token in enumerate(sampled)]
        return sampled, logprobs
