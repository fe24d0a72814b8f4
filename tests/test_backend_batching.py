"""TransformersBackend batches concurrent `complete` calls; every caller still gets what a lone call gives.

The model is `helpers_tiny_model.save_lively_tiny_model`: greedy replies depend on the prompt and end at
different steps, so the batch loses rows as it decodes. The weights come from a fixed seed. Batched greedy
replies must equal lone ones id for id; logprobs are compared within 1e-4, since left padding changes the
shapes of the fp32 matrix products (observed differences: about 1e-6). Sampled replies are compared only where
the submission order is fixed, since each call's sampler is seeded by its submission number.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers_tiny_model import save_lively_tiny_model

from flowrl.demo.agent import Completion
from flowrl.engines.transformers_backend import TransformersBackend
from flowrl.errors import ConfigError

MAX_NEW = 24
PROMPTS = [[{"role": "user", "content": f"What is {i} times {i * 3}?" + " please" * i}] for i in range(8)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_lively_tiny_model(tmp_path_factory.mktemp("lively_tiny"), PROMPTS[0])


class _Spy:
    """Stands in for the model: records the rows of every prefill and every decode step, takes `step_s`
    longer over each step, and raises where `fail(input_ids, position_ids, is_prefill)` says so."""

    def __init__(self, model: Any, fail: Callable[[Any, Any, bool], bool] | None = None, step_s: float = 0) -> None:
        self.model, self.fail, self.step_s = model, fail, step_s
        self.prefills: list[int] = []
        self.steps: list[int] = []

    def __call__(self, *, input_ids: Any, position_ids: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        prefill = past_key_values is None
        (self.prefills if prefill else self.steps).append(int(input_ids.shape[0]))
        time.sleep(0 if prefill else self.step_s)
        if self.fail is not None and self.fail(input_ids, position_ids, prefill):
            raise ValueError("the model rejects this input")
        return self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=past_key_values, **kwargs)


def _backend(model_dir: Path, **kwargs: Any) -> TransformersBackend:
    kwargs = {"max_new_tokens": MAX_NEW, "temperature": 0.0, **kwargs}
    return TransformersBackend(model_dir, **kwargs)


def _together(calls: list[Callable[[], Completion]]) -> list[Completion | BaseException]:
    """Run `calls` in threads released at the same moment; each result or exception in call order."""
    results: list[Completion | BaseException] = [RuntimeError("did not run")] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _complete_all(backend: TransformersBackend, prompts: list[list[dict[str, Any]]]) -> list[Completion]:
    results = _together([lambda m=m: backend.complete(m) for m in prompts])
    assert all(isinstance(r, Completion) for r in results), results
    return results  # type: ignore[return-value]


def _assert_same_reply(batched: Completion, alone: Completion) -> None:
    assert batched.prompt_token_ids == alone.prompt_token_ids
    assert batched.token_ids == alone.token_ids
    assert batched.text == alone.text
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)  # padding moves fp32 sums only slightly


def test_batched_greedy_equals_sequential_greedy(model_dir: Path) -> None:
    sequential = _backend(model_dir, batch_size=1)
    alone = [sequential.complete(m) for m in PROMPTS]
    batched = _backend(model_dir, batch_size=8, max_wait_ms=10_000)
    spy = batched.model = _Spy(batched.model)
    together = _complete_all(batched, PROMPTS)

    assert spy.prefills == [8]  # one prefill of all eight callers
    lengths = {len(c.token_ids) for c in alone}
    assert len(lengths) > 2 and MAX_NEW in lengths, "rows should leave the batch at different steps"
    for got, want in zip(together, alone):
        _assert_same_reply(got, want)


def test_concurrent_callers_get_their_own_replies(model_dir: Path) -> None:
    backend = _backend(model_dir, batch_size=4, max_wait_ms=50, temperature=0.7)
    replies = _complete_all(backend, PROMPTS * 2)
    for messages, reply in zip(PROMPTS * 2, replies):
        rendered = backend.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert reply.prompt_token_ids == list(rendered)
        assert reply.prompt_tokens == len(rendered)
    assert len({tuple(r.token_ids) for r in replies}) > len(PROMPTS)  # sampled copies of a prompt differ


def test_replies_hold_no_pad_or_post_eos_ids_and_a_logprob_per_id(model_dir: Path) -> None:
    for temperature in (0.0, 1.0):
        backend = _backend(model_dir, batch_size=8, max_wait_ms=10_000, temperature=temperature)
        pad, eos = backend.tokenizer.pad_token_id, backend.tokenizer.eos_token_id
        assert pad != eos
        for reply in _complete_all(backend, PROMPTS):
            ids = reply.token_ids
            assert ids and pad not in ids
            assert eos not in ids[:-1]
            assert ids[-1] == eos or len(ids) == MAX_NEW
            assert len(reply.logprobs) == len(ids) == reply.completion_tokens
            assert all(lp <= 0 for lp in reply.logprobs)
            assert reply.text == backend.tokenizer.decode(ids, skip_special_tokens=True).strip()


def test_sampling_is_reproducible_for_the_same_submission_order(model_dir: Path) -> None:
    def one_by_one(seed: int) -> list[Completion]:
        backend = _backend(model_dir, batch_size=1, temperature=1.0, seed=seed)
        return [backend.complete(m) for m in PROMPTS[:4]]

    first = one_by_one(7)
    assert [r.token_ids for r in one_by_one(7)] == [r.token_ids for r in first]
    assert [r.token_ids for r in one_by_one(8)] != [r.token_ids for r in first]

    batched = _backend(model_dir, batch_size=4, max_wait_ms=10_000, temperature=1.0, seed=7)
    spy = batched.model = _Spy(batched.model)
    results: list[Any] = [None] * 4
    threads = []
    for i, messages in enumerate(PROMPTS[:4]):  # submitted one after another, decoded as one batch
        threads.append(threading.Thread(target=lambda i=i, m=messages: results.__setitem__(i, batched.complete(m))))
        threads[-1].start()
        deadline = time.monotonic() + 30
        while batched._submitted <= i and time.monotonic() < deadline:
            time.sleep(0.005)
    for thread in threads:
        thread.join(timeout=120)
    assert spy.prefills == [4]
    for got, want in zip(results, first):
        _assert_same_reply(got, want)


def _next_turn(messages: list[dict[str, Any]], reply: Completion) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": reply.text}, {"role": "user", "content": "And then?"}]


def test_tokens_in_reuse_gives_back_the_sampled_ids(model_dir: Path) -> None:
    backend = _backend(model_dir, temperature=1.0)
    first = backend.complete(PROMPTS[1])
    second = backend.complete(_next_turn(PROMPTS[1], first))
    assert second.prompt_token_ids[: first.prompt_tokens + first.completion_tokens] == (
        first.prompt_token_ids + first.token_ids
    )


def test_tokens_in_reuse_keeps_concurrent_conversations_apart(model_dir: Path) -> None:
    """Four runs of one task at once share their first prompt: each one's second turn must carry back the
    ids that run sampled, not another run's."""
    backend = _backend(model_dir, batch_size=4, max_wait_ms=10_000, temperature=1.0)
    firsts = _complete_all(backend, [PROMPTS[3]] * 4)
    assert len({tuple(r.token_ids) for r in firsts}) == 4
    seconds = _complete_all(backend, [_next_turn(PROMPTS[3], r) for r in firsts])
    for first, second in zip(firsts, seconds):
        assert second.prompt_token_ids[: first.prompt_tokens + first.completion_tokens] == (
            first.prompt_token_ids + first.token_ids
        )


def test_a_bad_caller_does_not_break_the_others(model_dir: Path) -> None:
    alone = [_backend(model_dir, batch_size=1).complete(m) for m in PROMPTS[:3]]
    backend = _backend(model_dir, batch_size=4, max_wait_ms=10_000)
    poison = backend.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    spy = backend.model = _Spy(backend.model, fail=lambda ids, _, prefill: prefill and bool((ids == poison).any()))
    rejected = [{"role": "user", "content": "<|endoftext|> is not welcome here"}]
    malformed = [{"content": "a message without a role"}]
    results = _together([lambda m=m: backend.complete(m) for m in [*PROMPTS[:3], rejected, malformed]])

    assert isinstance(results[3], ValueError) and "rejects" in str(results[3])
    assert isinstance(results[4], KeyError)
    for got, want in zip(results[:3], alone):
        assert isinstance(got, Completion)
        _assert_same_reply(got, want)
    assert spy.prefills == [4, 1, 1, 1, 1]  # the malformed call never reached the model; then each alone
    backend.max_wait_ms = 0
    _assert_same_reply(backend.complete(PROMPTS[0]), alone[0])  # and the backend still serves


def test_a_row_failing_mid_decode_fails_alone(model_dir: Path) -> None:
    """A row that fails in a shared step (here: one that reaches a position limit, as a too-long context
    would) makes every row of that step decode again alone; only the callers at fault get the error."""
    alone = [_backend(model_dir, batch_size=1).complete(m) for m in PROMPTS]
    limit = max(len(c.prompt_token_ids) for c in alone) + 3

    def reaches_limit(c: Completion) -> bool:  # feeds the model a token at position >= limit
        return len(c.prompt_token_ids) + len(c.token_ids) - 2 >= limit

    assert 0 < sum(map(reaches_limit, alone)) < len(alone)
    backend = _backend(model_dir, batch_size=8, max_wait_ms=10_000)
    spy = backend.model = _Spy(
        backend.model, fail=lambda _, positions, prefill: not prefill and int(positions.max()) >= limit
    )
    results = _together([lambda m=m: backend.complete(m) for m in PROMPTS])
    assert spy.prefills[0] == 8
    for got, want in zip(results, alone):
        if reaches_limit(want):
            assert isinstance(got, ValueError)
        else:
            assert isinstance(got, Completion)
            _assert_same_reply(got, want)


LONG = [{"role": "user", "content": "What is 1 times 3?" + " please" * 30}]


@pytest.mark.parametrize("order", ["longer joins", "shorter joins"])
def test_a_call_joins_a_batch_that_is_already_decoding(model_dir: Path, order: str) -> None:
    """The second call arrives while the first decodes: it is prefilled and merged into the running batch
    (the narrower of the two caches left-padded to the wider), and both replies are what they are alone."""
    short, long = PROMPTS[2], LONG
    reference = _backend(model_dir, batch_size=1)
    alone = {"short": reference.complete(short), "long": reference.complete(long)}
    assert len(alone["long"].prompt_token_ids) > len(alone["short"].prompt_token_ids) + MAX_NEW
    first, second = ("short", "long") if order == "longer joins" else ("long", "short")
    assert len(alone[first].token_ids) >= 12, "the first call must still be decoding when the second comes"
    backend = _backend(model_dir, batch_size=4, max_wait_ms=0)
    spy = backend.model = _Spy(backend.model, step_s=0.1)
    results: dict[str, Completion] = {}
    early = threading.Thread(
        target=lambda: results.__setitem__(first, backend.complete({"short": short, "long": long}[first]))
    )
    early.start()
    deadline = time.monotonic() + 30
    while len(spy.steps) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    results[second] = backend.complete({"short": short, "long": long}[second])
    early.join(timeout=60)

    assert spy.prefills == [1, 1] and spy.steps[0] == 1 and 2 in spy.steps
    for name in ("short", "long"):
        _assert_same_reply(results[name], alone[name])


def test_the_generation_thread_ends_when_idle(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flowrl.engines.transformers_backend as backend_module

    monkeypatch.setattr(backend_module, "IDLE_S", 0.05)
    backend = _backend(model_dir, max_new_tokens=4)
    backend.complete(PROMPTS[0])
    deadline = time.monotonic() + 10
    while backend._worker is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend._worker is None
    assert backend.complete(PROMPTS[1]).token_ids  # a later call starts a new one


def test_bad_batching_options_are_refused(model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        TransformersBackend(model_dir, batch_size=0)
