"""The sampling options every backend takes are declared once (`flowrl.engines.chat_backend.SamplingOptions`, with
`TokensInBackend`'s defaults): each backend's constructor takes them as `**options` beside its own, keeps the
keywords and defaults it had, and refuses what it always refused. No model, no engine: a tiny tokenizer and a
fake llama-server."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from flowrl.engines.chat_backend import SamplingOptions, TokensInBackend, call_seed
from flowrl.engines.llama_cpp_backend import LlamaCppBackend
from flowrl.engines.llama_server import Generated, Sampling
from flowrl.engines.server_backend import LlamaServerBackend
from flowrl.engines.transformers_backend import TransformersBackend
from flowrl.errors import ConfigError
from tests.helpers_export import tiny_tokenizer

BACKENDS = [TransformersBackend, LlamaCppBackend, LlamaServerBackend]
DEFAULTS = {"max_new_tokens": 96, "temperature": 0.8, "seed": 0, "top_p": 0.95, "top_k": 50}


class Bare(TokensInBackend):
    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float] | None]:
        return [self.tokenizer.eos_token_id], None


class FakeServer:
    """Stands in for a started `LlamaServer`: records what it was asked, says one end-of-turn token."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.asked: list[tuple[list[int], Sampling, str | None]] = []

    def generate(self, prompt: list[int], sampling: Sampling, adapter: str | None) -> Generated:
        self.asked.append((prompt, sampling, adapter))
        return Generated([self.eos], [-0.5], "stop")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_tokenizer()


def test_every_keyword_has_one_default() -> None:
    assert {name: getattr(TokensInBackend, name) for name in SamplingOptions.__optional_keys__} == DEFAULTS


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
def test_backends_take_the_shared_options_without_redeclaring_them(backend: type[TokensInBackend]) -> None:
    params = inspect.signature(backend.__init__).parameters
    assert params["options"].kind is inspect.Parameter.VAR_KEYWORD
    assert params["options"].annotation == "Unpack[SamplingOptions]"
    assert not params.keys() & SamplingOptions.__optional_keys__


def test_options_given_are_kept_and_the_rest_default(tokenizer: Any) -> None:
    backend = Bare(".", tokenizer=tokenizer, temperature=0.0, top_k=5)
    assert (backend.temperature, backend.top_k) == (0.0, 5)
    assert (backend.max_new_tokens, backend.seed, backend.top_p) == (96, 0, 0.95)
    assert Bare(".", tokenizer=tokenizer).temperature == 0.8  # one backend's options are not another's


def test_unknown_keyword_is_refused_as_a_signature_would(tokenizer: Any) -> None:
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['temprature'\\]"):
        Bare(".", tokenizer=tokenizer, temprature=0.5)  # type: ignore[call-arg]


@pytest.mark.parametrize("backend", [Bare, TransformersBackend], ids=lambda b: b.__name__)
def test_max_new_tokens_below_one_is_refused_before_anything_loads(backend: type[TokensInBackend]) -> None:
    with pytest.raises(ConfigError, match=f"{backend.__name__} needs max_new_tokens >= 1 \\(got 0\\)"):
        backend("/no/such/model", max_new_tokens=0)


def test_call_seed_is_the_one_rule() -> None:
    assert [call_seed(3, n) for n in range(3)] == [3_000_009, 3_000_010, 3_000_011]


def test_server_backend_samples_with_its_options(tokenizer: Any, tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, tokenizer.eos_token_id]}))
    server = FakeServer(tokenizer.eos_token_id)
    backend = LlamaServerBackend(
        tmp_path, server, adapter="tuned", tokenizer=tokenizer, max_new_tokens=12, temperature=0.3, seed=5, top_k=9
    )
    assert backend.stop_ids == {7, tokenizer.eos_token_id}
    assert backend.model_name == "tuned"
    reply = backend.complete([{"role": "user", "content": "hello"}])
    assert reply.token_ids == [tokenizer.eos_token_id] and reply.logprobs == [-0.5]
    (_, sampling, adapter), *_ = server.asked
    assert adapter == "tuned"
    assert sampling == Sampling(temperature=0.3, top_p=0.95, top_k=9, max_tokens=12, seed=call_seed(5, 0))
    assert backend.call_seed(5) == call_seed(5, 1) % 2**31
