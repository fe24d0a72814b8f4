"""LlamaCppBackend: the GGUF flowrl writes, run by llama.cpp, gives the replies and log-probabilities the
transformers backend gives, reuses its KV cache without changing a reply, and puts sampled ids back.

The model is `helpers_tiny_model.save_lively_tiny_model`, written as an f16 GGUF. Each greedy reply
is checked against the fp32 transformers model fed the same ids: every token llama.cpp picked is the argmax
there, up to f16 rounding (within 0.02 nats of it; a near-tie may go either way), and its log-probability is the
same within 0.02. Most replies (7 of 8 prompts) come out id for id equal to TransformersBackend's.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers_tiny_model import save_lively_tiny_model

from flowrl.engines.transformers_backend import TransformersBackend
from flowrl.errors import ConfigError

MAX_NEW = 24
PROMPTS = [[{"role": "user", "content": f"What is {i} times {i * 3}?" + " please" * i}] for i in range(8)]
needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed (make setup builds it)"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_lively_tiny_model(tmp_path_factory.mktemp("lively_tiny"), PROMPTS[0])


def _llama(model_dir: Path, tmp_path: Path, **kwargs: Any) -> Any:
    from flowrl.engines.llama_cpp_backend import LlamaCppBackend, gguf_for

    path = gguf_for(model_dir, quant="f16", cache_dir=tmp_path / "gguf")
    return LlamaCppBackend(model_dir, gguf=path, **{"max_new_tokens": MAX_NEW, "temperature": 0.0, **kwargs})


@needs_llama
def test_greedy_replies_and_logprobs_match_transformers(model_dir: Path, tmp_path: Path) -> None:
    import torch

    llama = _llama(model_dir, tmp_path)
    reference = TransformersBackend(model_dir, max_new_tokens=MAX_NEW, temperature=0.0, batch_size=1)
    same = 0
    for messages in PROMPTS:
        ours, theirs = llama.complete(messages), reference.complete(messages)
        assert ours.prompt_token_ids == theirs.prompt_token_ids and ours.tokenizer == theirs.tokenizer
        assert ours.prompt_token_ids is not None and ours.token_ids and ours.logprobs
        same += ours.token_ids == theirs.token_ids
        ids = torch.tensor([ours.prompt_token_ids + ours.token_ids])
        with torch.no_grad():
            rows = torch.log_softmax(reference.model(ids).logits[0, len(ours.prompt_token_ids) - 1 : -1].float(), -1)
        for row, token, logprob in zip(rows, ours.token_ids, ours.logprobs, strict=True):
            assert float(row.max() - row[token]) < 0.02, messages
            assert abs(float(row[token]) - logprob) < 0.02
    assert same >= len(PROMPTS) - 2


@needs_llama
def test_the_kv_cache_never_changes_a_reply(model_dir: Path, tmp_path: Path) -> None:
    llama = _llama(model_dir, tmp_path)
    first = [llama.complete(m).token_ids for m in (PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0][:1])]
    assert first[0] == first[2] == first[3]
    fresh = _llama(model_dir, tmp_path)
    assert fresh.complete(PROMPTS[1]).token_ids == first[1]


@needs_llama
def test_sampling_is_seeded_per_call(model_dir: Path, tmp_path: Path) -> None:
    def replies(seed: int) -> list[list[int] | None]:
        backend = _llama(model_dir, tmp_path, temperature=1.0, seed=seed)
        return [backend.complete(m).token_ids for m in PROMPTS[:4]]

    assert replies(1) == replies(1)
    assert replies(1) != replies(2)


@needs_llama
def test_a_reply_goes_back_as_the_ids_that_were_sampled(model_dir: Path, tmp_path: Path) -> None:
    llama = _llama(model_dir, tmp_path, temperature=1.0, seed=3)
    first = llama.complete(PROMPTS[2])
    second = llama.complete(
        [*PROMPTS[2], {"role": "assistant", "content": first.text}, {"role": "user", "content": "and then?"}]
    )
    assert first.prompt_token_ids is not None and first.token_ids is not None
    assert (
        second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.token_ids)]
        == first.prompt_token_ids + first.token_ids
    )


@needs_llama
def test_a_prompt_longer_than_the_context_is_refused(model_dir: Path, tmp_path: Path) -> None:
    llama = _llama(model_dir, tmp_path, n_ctx=64)
    with pytest.raises(ValueError, match="raise n_ctx"):
        llama.complete([{"role": "user", "content": "word " * 200}])


def test_the_gguf_is_written_once_per_model_and_adapter(model_dir: Path, tmp_path: Path) -> None:
    from flowrl.engines.llama_cpp_backend import gguf_for

    first = gguf_for(model_dir, quant="f16", cache_dir=tmp_path)
    stamp = first.stat().st_mtime_ns
    assert gguf_for(model_dir, quant="f16", cache_dir=tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert gguf_for(model_dir, quant="q8_0", cache_dir=tmp_path) != first


def test_without_llama_cpp_the_error_says_how_to_install_it(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.engines.choice import pick_engine
    from flowrl.engines.llama_cpp_backend import LlamaCppBackend

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ConfigError, match="pip install llama-cpp-python"):
        LlamaCppBackend(model_dir)
    with pytest.raises(ConfigError, match="pip install llama-cpp-python"):
        pick_engine("llama.cpp")
    with pytest.raises(ConfigError, match="use one of"):
        pick_engine("vllm")


def test_auto_says_which_engine_it_took(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from flowrl.engines.choice import pick_engine

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr("flowrl.engines.llama_server.available", lambda: False)
    with caplog.at_level(logging.INFO, logger="flowrl.engines.choice"):
        assert pick_engine("auto") == "transformers"
    assert "several times slower" in caplog.text and "flowrl.engines.llama_server_build" in caplog.text
