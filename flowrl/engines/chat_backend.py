"""What every local chat backend shares: tokens in, tokens out.

`Completion` is a backend's reply: its text and, where the backend knows them, the prompt ids the model was given,
the ids it sampled (end-of-turn token included) and their log-probabilities; capture records them on the LLM call,
so datasets train on exactly these ids (docs/datasets.md).

`TokensInBackend` renders the chat template with the model's own tokenizer, puts every reply it sampled earlier in
the conversation back as the ids it sampled (the agent keeps only text and re-renders tool calls, and re-tokenizing
that text can give other ids: `"}}` as one token or two), and builds the `Completion`. A subclass implements
`_generate(prompt ids) -> (sampled ids, logprobs)`: `flowrl.engines.transformers_backend.TransformersBackend`
(batching), `flowrl.engines.llama_cpp_backend.LlamaCppBackend` (llama.cpp), `flowrl.train.agent_rollout.PolicyBackend`
(the policy a trainer is training). It lives in `engines` so rollouts through an agent can use it; it imports nothing
heavy.

The sampling options every backend takes are declared here once: `SamplingOptions` names the keywords (a subclass
takes them as `**options: Unpack[SamplingOptions]` beside its own), `TokensInBackend`'s class attributes give their
defaults, and `call_seed` is the seed rule each engine samples a call with.
"""

from __future__ import annotations

import difflib
import json
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from flowrl.errors import ConfigError, require
from flowrl.trace.tokenizer import fingerprint


@dataclass
class Completion:
    """A backend's reply. The token fields are what the model was given and what it sampled (end-of-turn
    token included) with each sampled token's log-probability, when the backend knows them; capture records
    them on the LLM call, so datasets train on exactly these ids (docs/datasets.md)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None


class SamplingOptions(TypedDict, total=False):
    """The keywords every backend's constructor takes for how it samples (defaults: `TokensInBackend`'s)."""

    max_new_tokens: int  # a reply's length at most, its end-of-turn token included
    temperature: float  # softmax(logits / temperature); 0 is greedy
    seed: int  # call n of a backend samples with `call_seed(seed, n)`
    top_p: float  # the smallest set of tokens holding this much of the probability, after `top_k`
    top_k: int  # the k most likely tokens; 0: all of them


def call_seed(seed: int, number: int) -> int:
    """The seed call `number` of a backend seeded with `seed` samples with: a call's reply does not depend on
    which calls shared its steps, and the same prompts in the same order give the same replies."""
    return seed * 1_000_003 + number


class TokensInBackend:
    """What every local backend shares: the chat template rendered with the model's own tokenizer, earlier
    sampled replies put back as their sampled ids (`reuse_sampled`), and the `Completion` a call returns.
    A subclass implements `_generate(prompt ids) -> (sampled ids, logprobs)`."""

    # How a call samples (`SamplingOptions`): these defaults, or what the constructor was given; `flowrl serve`
    # sets them per request (`flowrl.serve.model.ServedModel._lease`).
    max_new_tokens: int = 96
    temperature: float = 0.8
    seed: int = 0
    top_p: float = 0.95
    top_k: int = 50

    def __init__(
        self,
        model_dir: str | Path,
        *,
        adapter: str | Path | None = None,
        tokenizer: Any = None,
        **options: Unpack[SamplingOptions],
    ) -> None:
        unknown = sorted(options.keys() - SamplingOptions.__optional_keys__)
        if unknown:  # what a signature listing each keyword would refuse
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {unknown}")
        for name, value in options.items():
            setattr(self, name, value)
        if self.max_new_tokens < 1:
            raise ConfigError(f"{type(self).__name__} needs max_new_tokens >= 1 (got {self.max_new_tokens})")
        self.model_dir = Path(model_dir)
        self.model_name = str(adapter or model_dir)
        # `tokenizer`: one already loaded (a trainer's), else the model folder's
        self.tokenizer = tokenizer or require("transformers").AutoTokenizer.from_pretrained(str(model_dir))
        # (prompt ids, sampled ids) of earlier calls, read by every caller's `reuse_sampled`
        self._sampled: deque[tuple[tuple[int, ...], tuple[int, ...]]] = deque(maxlen=256)
        self._sampled_lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer may fail when two threads use it at once
        eos = self.tokenizer.eos_token_id
        self._end_ids = {int(eos)} if eos is not None else set()
        self._stop_ids = set(self._end_ids)
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else eos if eos is not None else 0)
        self._also_stop_at(None)
        self.fingerprint = fingerprint(self.tokenizer)

    @property
    def stop_ids(self) -> set[int]:
        """The ids that end a reply (the end-of-turn token and the generation config's)."""
        return set(self._stop_ids)

    def _also_stop_at(self, ids: Any) -> None:
        """Stop ids beyond the tokenizer's end of turn (a generation config's `eos_token_id`, int or list)."""
        self._stop_ids |= {int(i) for i in (ids if isinstance(ids, list) else [ids]) if i is not None}
        # filler, never sampled: a reply holding it could not be told from padding (unless it also ends a turn)
        self._unsampled = self._pad_id if self._pad_id not in self._stop_ids else None

    def _also_stop_at_generation_config(self) -> None:
        """Also stop at the `eos_token_id` of the model folder's `generation_config.json`, where it has one (for an
        engine that does not load the model through transformers, which reads it itself)."""
        config = self.model_dir / "generation_config.json"
        if config.is_file():
            self._also_stop_at(json.loads(config.read_text()).get("eos_token_id"))

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt ids for `messages`: the chat template's rendering, earlier replies as their sampled ids."""
        clean = [{"role": m["role"], "content": _content(m)} for m in messages]
        with self._tokenizer_lock:
            rendered = self.tokenizer.apply_chat_template(
                clean, add_generation_prompt=True, tokenize=True, return_dict=True
            )
        prompt = self.reuse_sampled([int(i) for i in rendered["input_ids"]])
        if not prompt:
            raise ValueError("the chat template rendered an empty prompt: pass at least one message")
        return prompt

    def complete(self, messages: list[dict[str, Any]]) -> Completion:
        """The reply, with the prompt ids the model was given, the ids it sampled (end-of-turn token included)
        and each sampled token's log-probability under softmax(logits / temperature) (temperature 1 when
        greedy): the quantity TRL's GRPO computes for the same tokens, so the two can be compared."""
        return self.complete_ids(self.render(messages))

    def complete_ids(self, prompt: list[int]) -> Completion:
        """The reply to prompt ids rendered elsewhere (`flowrl serve` renders an OpenAI request with the model's
        own template and its tools); `reuse_sampled` them first to put earlier replies back as sampled."""
        tokens, logprobs = self._generate(prompt)
        return self._completion(prompt, tokens, logprobs)

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float] | None]:
        """(sampled ids, their log-probabilities, or None where the engine cannot give one for every token)"""
        raise NotImplementedError

    def _completion(self, prompt: list[int], tokens: list[int], logprobs: list[float] | None) -> Completion:
        with self._tokenizer_lock:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        completion = Completion(
            text=text,
            prompt_tokens=len(prompt),
            completion_tokens=len(tokens),
            prompt_token_ids=list(prompt),
            token_ids=list(tokens),
            logprobs=[round(v, 6) for v in logprobs] if logprobs is not None else None,
            tokenizer=self.fingerprint,
        )
        with self._sampled_lock:  # before the caller hears back, so its next turn finds this reply
            self._sampled.append((tuple(prompt), tuple(tokens)))
        return completion

    def reuse_sampled(self, ids: list[int], *, same_text: bool = False) -> list[int]:
        """`ids` with every earlier reply the backend sampled in this conversation put back as its sampled ids.

        `same_text`: only where the reply in `ids` reads as the sampled one (whitespace aside); a server sets it,
        since its client may have edited or cut a reply, and the model must then see what the client sent."""
        with self._sampled_lock:
            replies: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
            for prompt, sampled in self._sampled:
                replies.setdefault(prompt, []).append(sampled)
        for prompt in sorted(replies, key=len):
            n = len(prompt)
            if len(ids) <= n or tuple(ids[:n]) != prompt:
                continue
            end = next((i for i in range(n, len(ids)) if ids[i] in self._end_ids), None)
            if end is None:
                continue
            found = self._closest(replies[prompt], ids[n:end], same_text)
            if found is None:
                continue
            # the template's end-of-turn token stays when the reply was cut off before its own
            tail = ids[end + 1 :] if found and found[-1] in self._end_ids else ids[end:]
            ids = [*prompt, *found, *tail]
        return ids

    def _closest(
        self, candidates: list[tuple[int, ...]], rendered: list[int], same_text: bool = False
    ) -> tuple[int, ...] | None:
        """The earlier reply that `rendered` (one assistant turn as the template wrote it) is a rendering of.
        Whitespace is ignored: the agent may render the tool calls it parsed with other spacing. With `same_text`,
        None unless one reads exactly as `rendered` does."""
        distinct = list(dict.fromkeys(candidates))
        if len(distinct) == 1 and not same_text:
            return distinct[0]
        with self._tokenizer_lock:
            target = "".join(self.tokenizer.decode(rendered, skip_special_tokens=True).split())
            texts = ["".join(self.tokenizer.decode(c, skip_special_tokens=True).split()) for c in distinct]
        if same_text:
            return next((c for c, text in zip(distinct, texts) if text == target), None)
        scores = [difflib.SequenceMatcher(None, target, text, autojunk=False).ratio() for text in texts]
        return distinct[scores.index(max(scores))]


def _content(message: dict[str, Any]) -> str:
    """Flatten an OpenAI message (with tool calls or a tool result) into text the chat template takes."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += f'\n<tool_call>{{"name": "{fn.get("name")}", "arguments": {fn.get("arguments") or "{}"}}}</tool_call>'
    if message.get("role") == "tool":
        text = f"[{message.get('name', 'tool')} result] {text}"
    return text.strip()


def flatten_message(message: dict[str, Any]) -> dict[str, str]:
    """`message` as the text-only turn local backends render: tool calls written into the assistant text, a tool
    result as `[name result] text` (for agents whose own format is text, like the example agent)."""
    return {"role": str(message["role"]), "content": _content(message)}
