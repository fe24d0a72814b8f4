"""llama.cpp's server as flowrl's engine: token ids and logprobs out, several requests decoded at once, LoRA
adapters per request (written by flowrl as GGUF LoRA, checked against PEFT in transformers), and a lifetime that
leaves no process behind, even when flowrl is killed. On the default model (SmolLM2-135M-Instruct) and the
llama-server `make setup` builds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flowrl.engines import llama_server
from flowrl.engines.llama_server import LlamaServer, Sampling

pytestmark = pytest.mark.skipif(
    not llama_server.available(), reason=f"no llama-server binary: {llama_server.BUILD_HINT}"
)

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from flowrl.models import resolve_model

    return Path(resolve_model("smollm2-135m").path)


@pytest.fixture(scope="module")
def base_gguf(model_dir: Path) -> Path:
    from flowrl.engines.llama_cpp_backend import gguf_for

    return gguf_for(model_dir)


@pytest.fixture(scope="module")
def adapter(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random LoRA on every linear layer of the default model, strong enough to change its replies."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("adapter")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    peft.save_pretrained(str(out))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def test_a_reply_has_the_ids_the_model_sampled_and_their_logprobs(model_dir: Path, base_gguf: Path) -> None:
    from flowrl.engines.llama_cpp_backend import LlamaCppBackend
    from flowrl.engines.server_backend import LlamaServerBackend

    # flash attention is off, as llama-cpp-python runs (llama-server's default, on, moved logprobs by up to 0.12)
    with LlamaServer(base_gguf, slots=2) as server:
        backend = LlamaServerBackend(model_dir, server, max_new_tokens=24, temperature=0.0)
        reply = backend.complete(QUESTION)
        assert reply.token_ids and len(reply.logprobs or []) == len(reply.token_ids)
        assert reply.prompt_token_ids == backend.render(QUESTION)
        assert backend.tokenizer.decode(reply.token_ids, skip_special_tokens=True).strip() == reply.text
        assert all(lp <= 0 for lp in reply.logprobs or [])
        # the same GGUF in llama-cpp-python, greedy: the same ids, the same logprobs (softmax at T = 1)
        local = LlamaCppBackend(model_dir, gguf=base_gguf, max_new_tokens=24, temperature=0.0).complete(QUESTION)
        assert local.token_ids == reply.token_ids
        assert local.logprobs == pytest.approx(reply.logprobs, abs=2e-3)
        # sampled: each logprob is the sampled token's under the distribution it was drawn from
        hot = server.generate(backend.render(QUESTION), Sampling(temperature=1.0, top_k=1, max_tokens=8, seed=3))
        assert hot.token_ids == reply.token_ids[:8] and hot.logprobs == pytest.approx([0.0] * 8, abs=1e-6)
        capped = server.generate(backend.render(QUESTION), Sampling(temperature=0.0, max_tokens=3))
        assert len(capped.token_ids) == 3 and capped.finish == "length"
        assert reply.token_ids[-1] in backend.stop_ids  # the end-of-turn token is part of the reply


def test_many_requests_are_answered_at_once(model_dir: Path, base_gguf: Path) -> None:
    from flowrl.engines.server_backend import LlamaServerBackend

    with LlamaServer(base_gguf, slots=4) as server:
        backend = LlamaServerBackend(model_dir, server, max_new_tokens=16, temperature=0.0)
        prompt = backend.render(QUESTION)
        alone = server.generate(prompt, Sampling(temperature=0.0, max_tokens=16))
        replies: list[Any] = [None] * 6
        threads = [
            threading.Thread(
                target=lambda i=i: replies.__setitem__(i, server.generate(prompt, Sampling(0.0, max_tokens=16)))
            )
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(r is not None and r.token_ids == alone.token_ids for r in replies)


def test_an_adapter_is_chosen_per_request_and_matches_peft(
    model_dir: Path, base_gguf: Path, adapter: Path, tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from flowrl.engines.lora_gguf import write_lora_gguf
    from flowrl.engines.server_backend import LlamaServerBackend

    lora = write_lora_gguf(adapter, model_dir, tmp_path / "adapter.gguf")
    with LlamaServer(base_gguf, adapters={"tuned": lora}, slots=2) as server:
        backend = LlamaServerBackend(model_dir, server)
        prompt = backend.render(QUESTION)
        tuned = server.generate(prompt, Sampling(temperature=0.0, max_tokens=6), "tuned")
        base = server.generate(prompt, Sampling(temperature=0.0, max_tokens=6), None)
        assert tuned.token_ids != base.token_ids  # the adapter is applied to its requests only
        seconds = server.set_adapters({"tuned": lora, "again": lora})
        assert server.generate(prompt, Sampling(temperature=0.0, max_tokens=6), "again").token_ids == tuned.token_ids
        assert seconds < 60 and server.restarts == 1
        with pytest.raises(Exception, match="not loaded"):
            server.generate(prompt, Sampling(temperature=0.0, max_tokens=6), "missing")
    # PEFT in transformers (fp32) reads llama-server's tuned reply as its own greedy choice at every step: the chosen
    # token is within a small margin of PEFT's best (q8_0 moves logits a little, so a near tie may flip the argmax),
    # while the base model's reply is not what the adapter would say
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32), str(adapter)
    )

    def gaps(reply: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        return [float(v) for v in logits.max(-1).values - logits[range(len(reply)), reply]]

    assert max(gaps(tuned.token_ids)) < 0.5  # seen: 0.22 at the first token, 0.015 at most after it
    assert max(gaps(base.token_ids)) > 1.0  # seen: 2.9


def test_the_server_stops_with_its_owner_even_when_the_owner_is_killed(base_gguf: Path, tmp_path: Path) -> None:
    with LlamaServer(base_gguf, slots=1) as server:
        assert server._proc is not None
        pid = server._proc.pid
    assert not _alive(pid)
    script = textwrap.dedent(
        f"""
        import sys, time
        from flowrl.engines.llama_server import LlamaServer
        server = LlamaServer({str(base_gguf)!r}, slots=1)
        server.start()
        print(server._proc.pid, flush=True)
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    assert _alive(child)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "llama-server outlived the process that started it"


def test_a_start_that_fails_says_why_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(llama_server.EngineError, match="exited with code") as caught:
        LlamaServer(bad, slots=1).start()
    assert "\n" not in str(caught.value)


def test_a_missing_binary_names_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flowrl.errors import ConfigError

    monkeypatch.setenv(llama_server.BINARY_ENV, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="llama_server_build"):
        llama_server.find_binary()


def test_a_reply_split_inside_utf8_characters_keeps_its_ids_and_no_made_up_logprobs(
    model_dir: Path, base_gguf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """llama-server records no probability for a token whose text ends inside a UTF-8 character (emoji are
    several byte tokens). Such a reply made the engine raise (`make demo` stopped on it); it now comes back with
    every sampled id and logprobs None, said once and counted."""
    import logging

    from flowrl.engines.server_backend import LlamaServerBackend

    with LlamaServer(base_gguf, slots=1) as server:
        backend = LlamaServerBackend(model_dir, server, max_new_tokens=24, temperature=0.0)
        with caplog.at_level(logging.WARNING, logger="flowrl.engines.llama_server"):
            replies = [backend.complete([{"role": "user", "content": q}]) for q in ("Write three emoji.",) * 2]
        plain = backend.complete(QUESTION)
    assert all(r.token_ids and len(r.token_ids) == 24 and r.logprobs is None for r in replies)
    assert server.replies_without_logprobs == 2 and caplog.text.count("no probability for") == 1
    assert plain.logprobs is not None and len(plain.logprobs) == len(plain.token_ids or [])
