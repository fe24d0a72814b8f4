"""A chat backend on llama.cpp (`llama-cpp-python`): the same replies' distribution as `TransformersBackend`,
about 4-6x faster on a CPU at batch 1 (docs/benchmarks.md, `bench/bench_backend.py`).

The model runs from a GGUF file that flowrl writes itself (`flowrl.export`): the base model's, or the base with
a LoRA adapter merged in, cached under `$FLOWRL_MODELS/gguf/` by what it was made from, so a policy is converted
once (seconds for 135M). Everything else is `TokensInBackend`'s: the prompt is rendered by the model's own
Hugging Face tokenizer and given to llama.cpp as ids (the GGUF's vocabulary is the same one), earlier replies go
back as the ids that were sampled, and each call returns its prompt ids, sampled ids and log-probabilities.

Sampling is done here, in numpy, on llama.cpp's logits: softmax(logits / temperature) cut to `top_k`, then to
`top_p` (the rule `TransformersBackend` applies), one generator per call seeded by (seed, call number), so the
same prompts in the same order give the same replies. Greedy at temperature 0.

One sequence at a time: calls from many threads queue for one thread, the only one in the process that runs
llama.cpp. llama.cpp's CPU backend keeps a team of OpenMP threads per calling thread, and idle teams spin: with
calls arriving from a pool of threads (the agent calls its backend through `asyncio.to_thread`), decoding on 2
cores fell from 61 to 24-35 new tokens/s, and to 17-20 with OMP_WAIT_POLICY=PASSIVE (measured on 20 agent
prompts, `bench/bench_backend.py --engine llama.cpp`). The KV cache keeps the last sequence, so a call whose
prompt starts with it (the next turn of the same run, or any run's shared system prompt and examples) only
evaluates the new tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Unpack

from flowrl.engines.chat_backend import SamplingOptions, TokensInBackend, call_seed
from flowrl.errors import ConfigError, FlowRLError
from flowrl.export.gguf_writer import GGUFExporter
from flowrl.export.llama_quiet import ignore_llama_devnull
from flowrl.export.merge import merge_adapter
from flowrl.models import models_dir

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install llama-cpp-python (it builds llama.cpp from source: a C compiler and cmake, a few "
    "minutes), or use the transformers backend"
)


_THREAD: ThreadPoolExecutor | None = None  # the one thread that runs llama.cpp (see the module docstring)
_THREAD_LOCK = threading.Lock()


def _llama_thread() -> ThreadPoolExecutor:
    global _THREAD
    with _THREAD_LOCK:
        if _THREAD is None:
            _THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowrl-llama")
        return _THREAD


def llama_cpp_available() -> bool:
    ignore_llama_devnull()  # importing it opens the two /dev/null files it never closes
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def _weights_key(folder: Path) -> str:
    """What a model or adapter folder holds, cheaply: its weight files' names, sizes and modification times."""
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise FlowRLError(f"{folder} holds no .safetensors or .bin weights: pass a model or adapter folder")
    return _key(*((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))


def gguf_for(
    model_dir: str | Path, adapter: str | Path | None = None, *, quant: str = "q8_0", cache_dir: Path | None = None
) -> Path:
    """A GGUF of `model_dir` (with `adapter` merged in), written once and cached by what it was made from."""
    model_dir = Path(model_dir).resolve()
    adapter = Path(adapter).resolve() if adapter else None
    key = _key(model_dir, _weights_key(model_dir), adapter, _weights_key(adapter) if adapter else None, quant)
    out = (cache_dir or models_dir() / "gguf") / f"{(adapter or model_dir).name}-{key}-{quant}.gguf"
    if out.is_file():
        return out
    if adapter is None:
        GGUFExporter(quant).export(model_dir, out)
        return out
    work = Path(tempfile.mkdtemp(prefix="flowrl-merge-"))
    try:
        merged = merge_adapter(adapter, work / "merged", base_model=str(model_dir))
        GGUFExporter(quant).export(merged.path, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


class LlamaCppBackend(TokensInBackend):
    """Generates replies with llama.cpp from `model_dir` (a Hugging Face model folder), with `adapter` (a PEFT
    LoRA folder) merged in. `gguf` uses a GGUF file you already have instead (its vocabulary must be
    `model_dir`'s). Safe to call from many threads (one call runs at a time)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        adapter: str | Path | None = None,
        gguf: str | Path | None = None,
        quant: str = "q8_0",
        n_ctx: int = 4096,
        n_threads: int | None = None,
        **options: Unpack[SamplingOptions],
    ) -> None:
        ignore_llama_devnull()
        try:
            import llama_cpp
        except ImportError as exc:
            raise ConfigError(f"the llama.cpp backend needs llama-cpp-python ({exc}): {INSTALL_HINT}") from exc
        super().__init__(model_dir, adapter=adapter, **options)
        self.gguf = Path(gguf) if gguf else gguf_for(model_dir, adapter, quant=quant)
        self.llm = (
            _llama_thread()
            .submit(
                llama_cpp.Llama,
                model_path=str(self.gguf),
                n_ctx=n_ctx,
                n_threads=n_threads or os.cpu_count(),
                n_batch=512,
                logits_all=False,
                verbose=False,
            )
            .result()
        )
        if self.llm.n_vocab() < len(self.tokenizer):
            raise ConfigError(
                f"{self.gguf} has {self.llm.n_vocab()} tokens, the tokenizer in {model_dir} "
                f"{len(self.tokenizer)}: they are not the same model"
            )
        self._also_stop_at_generation_config()
        self._calls = 0

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        if len(prompt) + self.max_new_tokens > self.llm.n_ctx():
            raise ValueError(
                f"the prompt has {len(prompt)} tokens and the reply may take {self.max_new_tokens}: "
                f"more than the context of {self.llm.n_ctx()} (raise n_ctx)"
            )
        return _llama_thread().submit(self._decode, prompt).result()

    def _decode(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        """On the llama.cpp thread: the reply to `prompt`, and each sampled token's log-probability."""
        import numpy as np

        number, self._calls = self._calls, self._calls + 1
        rng = np.random.default_rng(call_seed(self.seed, number)) if self.temperature > 0 else None
        self._feed(prompt)
        tokens: list[int] = []
        logprobs: list[float] = []
        while True:
            token, logprob = self._pick(self._last_logits(), rng)
            tokens.append(token)
            logprobs.append(logprob)
            if token in self._stop_ids or len(tokens) >= self.max_new_tokens:
                return tokens, logprobs
            self.llm.eval([token])

    def _feed(self, prompt: list[int]) -> None:
        """Evaluate `prompt`, keeping the cached tokens it starts with (at least its last token is evaluated,
        so the logits are this prompt's)."""
        import numpy as np

        cached = self.llm.input_ids[: min(self.llm.n_tokens, len(prompt) - 1)]
        differ = np.nonzero(cached != np.asarray(prompt[: len(cached)]))[0]
        self.llm.n_tokens = int(differ[0]) if len(differ) else len(cached)
        self.llm.eval(prompt[self.llm.n_tokens :])

    def _last_logits(self) -> Any:
        import llama_cpp
        import numpy as np

        pointer = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.llm.n_vocab(),)).astype(np.float64)

    def _pick(self, logits: Any, rng: Any) -> tuple[int, float]:
        """The next token and its log-probability under softmax(logits / temperature)."""
        import numpy as np

        scaled = logits / (self.temperature if self.temperature > 0 else 1.0)
        allowed = scaled.copy()
        if self._unsampled is not None:
            allowed[self._unsampled] = -np.inf
        if rng is None:
            token = int(np.argmax(allowed))
        else:
            kept = _top_k_top_p(allowed, self.top_k, self.top_p)
            probs = np.exp(kept - kept.max())
            cdf = np.cumsum(probs)
            token = int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))
        top = scaled.max()
        return token, float(scaled[token] - top - np.log(np.exp(scaled - top).sum()))


def _top_k_top_p(scores: Any, top_k: int, top_p: float) -> Any:
    """numpy twin of `flowrl.engines.transformers_backend._top_k_top_p` for one row. Not the torch one: sampling
    with torch on the llama.cpp thread decoded about 15% slower (torch's own threads beside llama.cpp's;
    `bench/bench_backend.py`)."""
    import numpy as np

    scores = scores.copy()
    if 0 < top_k < scores.shape[-1]:
        kth = np.partition(scores, -top_k)[-top_k]
        scores[scores < kth] = -np.inf
    if top_p < 1.0:
        order = np.argsort(scores, kind="stable")
        ascending = scores[order]
        probs = np.exp(ascending - ascending[-1])
        drop = np.cumsum(probs / probs.sum()) <= 1 - top_p
        drop[-1] = False
        scores[order[drop]] = -np.inf
    return scores
