"""A chat backend on a `LlamaServer`: the tokens-in, tokens-out contract of every flowrl backend
(`flowrl.engines.chat_backend.TokensInBackend`: the model's own Hugging Face tokenizer renders, earlier replies go
back as their sampled ids), with generation in llama.cpp's server, where concurrent calls are decoded together.

`generate(prompt ids, sampling, adapter)` is safe from many threads and takes its sampling and LoRA adapter per
call (`flowrl serve` and `flowrl improve` answer many requests at once); `complete(messages)` uses the backend's
own `temperature`, `top_p`, `top_k`, `max_new_tokens`, `seed` and `adapter`, as the other backends do. Each call
gets its own seed, (seed, call number), so a call's reply does not depend on which calls shared its steps.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any, Unpack

from flowrl.engines.chat_backend import Completion, SamplingOptions, TokensInBackend, call_seed
from flowrl.engines.llama_server import LlamaServer, Sampling


class LlamaServerBackend(TokensInBackend):
    """`model_dir`: the Hugging Face folder whose tokenizer renders (the GGUF the server runs must share its
    vocabulary); `server`: a started `LlamaServer`; `adapter`: the name of one of its adapters for `complete`."""

    concurrent = True  # `generate` may be called from many threads at once, each with its own sampling

    def __init__(
        self,
        model_dir: str | Path,
        server: LlamaServer,
        *,
        adapter: str | None = None,
        tokenizer: Any = None,
        **options: Unpack[SamplingOptions],
    ) -> None:
        super().__init__(model_dir, tokenizer=tokenizer, **options)
        self.server = server
        self.adapter_name = adapter
        self.model_name = adapter or Path(model_dir).name
        self._also_stop_at_generation_config()
        self._numbers = itertools.count()
        self._count_lock = threading.Lock()

    def call_seed(self, seed: int) -> int:
        """The seed of this backend's next call, sampling from `seed` (a request's own seed or the backend's)."""
        with self._count_lock:
            number = next(self._numbers)
        return call_seed(seed, number) % (2**31)

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float] | None]:
        sampling = Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_new_tokens,
            seed=self.call_seed(self.seed),
        )
        out = self.server.generate(prompt, sampling, self.adapter_name)
        return out.token_ids, out.logprobs

    def generate(self, prompt: list[int], sampling: Sampling, adapter: str | None) -> tuple[Completion, str]:
        """The reply to `prompt` (already through `reuse_sampled`) and its finish reason (`stop` or `length`)."""
        out = self.server.generate(prompt, sampling, adapter)
        return self._completion(prompt, out.token_ids, out.logprobs), out.finish
