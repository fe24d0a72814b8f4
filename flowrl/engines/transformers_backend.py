"""A chat backend on a local transformers model (CPU is fine for SmolLM2-135M).

Tokens in, tokens out: a reply the backend sampled earlier is given back to the model as the ids it sampled,
not as its text re-tokenized. The agent keeps only text (it parses tool calls out of the reply and renders
them again), and re-tokenizing that text can give other ids than were sampled (`"}}` as one token or two),
so the model would see a context slightly different from the one it wrote, and a trajectory could not be
trained as one sequence. Where a rendered prompt starts with an earlier call's prompt ids, the turn that
follows them is replaced by that call's sampled ids (vLLM's and Agent Lightning's token-in-token-out). When
several earlier calls had that same prompt (concurrent runs of one task), the one whose reply reads most like
the rendered turn is used.

Batching across callers: `complete` may be called from many threads at once (the example agent calls it
through `asyncio.to_thread`; an eval or an improve loop runs many agent runs at once). Calls queue up for one
generation thread, which decodes up to `batch_size` of them together, one forward pass per step for all rows
(continuous batching, as vLLM and TGI do, on a left-padded KV cache):
- when it is idle, it waits up to `max_wait_ms` for `batch_size` calls before it starts;
- while it decodes, calls that arrive join at the next step (their prompts are prefilled, then merged into
  the batch's cache, left-padded to a common width, with an attention mask and per-row positions);
- a row leaves at its end-of-turn token (or at `max_new_tokens`) and its caller gets its reply at once,
  built from its own sampled ids only (no padding, nothing after the end token);
- the thread ends after a few idle seconds (a later call starts another), so a dropped backend is freed.
If a prefill or a step fails, its rows are decoded again one at a time, so only the caller whose input is
at fault gets the error. Batching expects full-attention cache layers (Llama, SmolLM2, Qwen2); other models
need batch_size=1.

Reproducible: each call samples from its own generator, seeded by (seed, submission number), so its reply
does not depend on which calls shared its steps; the same prompts submitted in the same order give the same
replies. Greedy (temperature 0) is argmax. A batched row computes what a lone row computes; padding changes
only the shapes of the matrix products, so logits may differ in the last fp32 bits.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from flowrl.engines.chat_backend import Completion, SamplingOptions, TokensInBackend, call_seed
from flowrl.errors import ConfigError, FlowRLError, require

log = logging.getLogger(__name__)

IDLE_S = 2.0  # the generation thread ends after this long without work


@dataclass(slots=True)
class _Request:
    """One `complete` call: the prompt ids it decodes from and where its reply goes."""

    prompt: list[int]
    number: int  # submission order; seeds this call's sampler
    done: threading.Event = field(default_factory=threading.Event)
    result: Completion | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Row:
    request: _Request
    sampler: Any  # a torch.Generator, None when greedy
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Batch:
    """Rows decoding together. The cache is left-padded: `mask[i]` marks row i's real columns; `pending[i]` is
    its last sampled token, not yet fed to the model, and `position[i]` the position that token takes."""

    rows: list[_Row]
    cache: Any
    mask: Any
    pending: Any = None
    position: Any = None

    def keep(self, kept: list[int]) -> None:
        """Only rows `kept` stay; cache columns no remaining row uses are dropped."""
        torch = require("torch")
        index = torch.tensor(kept, dtype=torch.long)
        self.rows = [self.rows[i] for i in kept]
        self.mask, self.pending, self.position = self.mask[index], self.pending[index], self.position[index]
        _each_layer(self.cache, lambda t: t[index])
        lead = int(self.mask.any(dim=0).long().argmax())
        if lead:
            self.mask = self.mask[:, lead:]
            _each_layer(self.cache, lambda t: t[:, :, lead:])

    def join(self, other: _Batch) -> None:
        """Append `other`'s rows, left-padding the narrower cache to the wider one's width."""
        torch = require("torch")
        pad = torch.nn.functional.pad
        width = max(self.mask.shape[1], other.mask.shape[1])
        a, b = width - self.mask.shape[1], width - other.mask.shape[1]
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([pad(mine.keys, (0, 0, a, 0)), pad(theirs.keys, (0, 0, b, 0))])
            mine.values = torch.cat([pad(mine.values, (0, 0, a, 0)), pad(theirs.values, (0, 0, b, 0))])
        self.rows += other.rows
        self.mask = torch.cat([pad(self.mask, (a, 0)), pad(other.mask, (b, 0))])
        self.pending = torch.cat([self.pending, other.pending])
        self.position = torch.cat([self.position, other.position])


def _each_layer(cache: Any, change: Callable[[Any], Any]) -> None:
    for layer in cache.layers:
        layer.keys, layer.values = change(layer.keys), change(layer.values)


class TransformersBackend(TokensInBackend):
    """Generates replies with a local causal LM; `adapter` may be a PEFT adapter dir on top of it.

    Safe to call from many threads: concurrent `complete` calls are decoded together, at most `batch_size`
    rows at a time (see the module docstring). Sampling: softmax(logits / temperature) cut to the `top_k` most
    likely tokens, then to the smallest set holding `top_p` of the mass (as transformers' `generate` does);
    greedy when temperature is 0. The pad token is never picked, unless it also ends a turn."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        adapter: str | Path | None = None,
        batch_size: int = 8,
        max_wait_ms: float = 20,
        **options: Unpack[SamplingOptions],
    ) -> None:
        if batch_size < 1 or max_wait_ms < 0:
            raise ConfigError(
                f"TransformersBackend needs batch_size >= 1 and max_wait_ms >= 0 (got {batch_size}, {max_wait_ms})"
            )
        super().__init__(model_dir, adapter=adapter, **options)
        torch = require("torch")
        transformers = require("transformers")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        if adapter is not None:
            peft = require("peft")
            model = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        self.model = model.eval()
        self.batch_size = batch_size
        self.max_wait_ms = max_wait_ms
        self._cond = threading.Condition()  # guards the queue, the worker and the submission count
        self._queue: deque[_Request] = deque()
        self._worker: threading.Thread | None = None
        self._submitted = 0
        self._also_stop_at(self.model.generation_config.eos_token_id)
        forward = inspect.signature(self.model.forward).parameters
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}

    def complete_ids(self, prompt: list[int]) -> Completion:
        with self._cond:
            request = _Request(prompt, self._submitted)
            self._submitted += 1
            self._queue.append(request)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="flowrl-generate", daemon=True)
                self._worker.start()
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    # -- the generation thread --------------------------------------------------------------------------------

    def _work(self) -> None:
        batch: _Batch | None = None
        joiners: list[_Request] | None = []
        try:
            while (joiners := self._next_joiners(batch)) is not None:
                if joiners:
                    batch = self._admit(batch, joiners)
                if batch is not None:
                    batch = self._step(batch)
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("the generation thread failed")
            with self._cond:
                self._worker = None
                stranded = [*(joiners or ()), *(row.request for row in (batch.rows if batch else [])), *self._queue]
                self._queue.clear()
            for request in stranded:
                if not request.done.is_set():
                    self._deliver(request, error=FlowRLError(f"generation failed: {exc!r}"))

    def _next_joiners(self, batch: _Batch | None) -> list[_Request] | None:
        """Queued requests that fit into `batch`; None when the thread has been idle for IDLE_S and ends."""
        with self._cond:
            if batch is None:
                if not self._cond.wait_for(lambda: self._queue, timeout=IDLE_S):
                    self._worker = None
                    return None
                deadline = time.monotonic() + self.max_wait_ms / 1000
                while len(self._queue) < self.batch_size and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            room = self.batch_size - (len(batch.rows) if batch is not None else 0)
            return [self._queue.popleft() for _ in range(min(room, len(self._queue)))]

    def _admit(self, batch: _Batch | None, requests: list[_Request]) -> _Batch | None:
        """Prefill `requests` and add them to `batch`; if that fails, each alone, so only a bad one fails."""
        try:
            fresh = self._prefill(requests)
        except Exception as exc:
            if len(requests) == 1:
                self._deliver(requests[0], error=exc)
                return batch
            for request in requests:
                batch = self._admit(batch, [request])
            return batch
        if batch is None or fresh is None:
            return batch or fresh
        batch.join(fresh)
        return batch

    def _prefill(self, requests: list[_Request]) -> _Batch | None:
        torch = require("torch")
        width = max(len(r.prompt) for r in requests)
        ids = torch.full((len(requests), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, request in enumerate(requests):
            ids[i, width - len(request.prompt) :] = torch.tensor(request.prompt, dtype=torch.long)
            mask[i, width - len(request.prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **self._last_logits_only
            )
        layers = getattr(out.past_key_values, "layers", None)
        if self.batch_size > 1 and (
            not layers or any(getattr(layer, "is_sliding", False) or not hasattr(layer, "keys") for layer in layers)
        ):
            raise FlowRLError(
                "this model keeps a KV cache the backend cannot batch (it needs full-attention layers, "
                "as Llama, SmolLM2 and Qwen2 have): use TransformersBackend(..., batch_size=1)"
            )
        rows = [_Row(r, self._sampler(r.number)) for r in requests]
        batch = _Batch(rows, out.past_key_values, mask, position=positions[:, -1] + 1)
        return self._advance(batch, out.logits[:, -1, :])

    def _step(self, batch: _Batch) -> _Batch | None:
        """Feed every row its pending token and sample the next; rows that fail are decoded again alone."""
        torch = require("torch")
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=-1)
        try:
            with torch.no_grad():
                out = self.model(
                    input_ids=batch.pending[:, None],
                    attention_mask=mask,
                    position_ids=batch.position[:, None],
                    past_key_values=batch.cache,
                    use_cache=True,
                    **self._last_logits_only,
                )
        except Exception as exc:
            if len(batch.rows) == 1:
                self._deliver(batch.rows[0].request, error=exc)
            else:
                for row in batch.rows:
                    self._solo(row.request)
            return None
        batch.mask, batch.position = mask, batch.position + 1
        return self._advance(batch, out.logits[:, -1, :])

    def _solo(self, request: _Request) -> None:
        """Decode `request` from its prompt alone, with a fresh sampler from its own seed."""
        batch = self._admit(None, [request])
        while batch is not None:
            batch = self._step(batch)

    def _advance(self, batch: _Batch, logits: Any) -> _Batch | None:
        """Sample each row's next token; rows that end are delivered and leave the batch."""
        picked, logprobs = self._pick(logits.float(), [row.sampler for row in batch.rows])
        kept = []
        for i, (row, token, logprob) in enumerate(zip(batch.rows, picked.tolist(), logprobs.tolist())):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token in self._stop_ids or len(row.tokens) >= self.max_new_tokens:
                self._finish(row)
            else:
                kept.append(i)
        if not kept:
            return None
        batch.pending = picked
        if len(kept) < len(batch.rows):
            batch.keep(kept)
        return batch

    def _sampler(self, number: int) -> Any:
        if self.temperature <= 0:
            return None
        torch = require("torch")
        return torch.Generator().manual_seed(call_seed(self.seed, number))

    def _pick(self, logits: Any, samplers: list[Any]) -> tuple[Any, Any]:
        """Each row's next token and its log-probability under softmax(logits / temperature)."""
        torch = require("torch")
        scaled = logits / (self.temperature if self.temperature > 0 else 1.0)
        allowed = (
            scaled if self._unsampled is None else scaled.index_fill(-1, torch.tensor([self._unsampled]), -torch.inf)
        )
        if self.temperature <= 0:
            picked = allowed.argmax(dim=-1)
        else:
            probs = torch.softmax(_top_k_top_p(allowed, self.top_k, self.top_p), dim=-1)
            picked = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, samplers)])
        return picked, torch.log_softmax(scaled, dim=-1).gather(-1, picked[:, None]).squeeze(-1)

    def _finish(self, row: _Row) -> None:
        try:
            completion = self._completion(row.request.prompt, row.tokens, row.logprobs)
        except Exception as exc:
            self._deliver(row.request, error=exc)
            return
        self._deliver(row.request, result=completion)

    @staticmethod
    def _deliver(request: _Request, *, result: Completion | None = None, error: BaseException | None = None) -> None:
        request.result, request.error = result, error
        request.done.set()


def _top_k_top_p(scores: Any, top_k: int, top_p: float) -> Any:
    """`scores` with the tokens outside the top k, then outside the top-p nucleus, set to -inf
    (transformers' TopKLogitsWarper and TopPLogitsWarper, one token always kept)."""
    torch = require("torch")
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[..., -1] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores
