"""The loop closed: `flowrl serve` runs a model, the example agent runs on it, and its trace is captured with the
ids the served model saw and sampled, so the next round of data comes from the served model."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flowrl.capture import hook_into_agent
from flowrl.store.files import TraceStore
from tests.helpers_export import save_tiny_adapter, save_tiny_model


class FakeSandbox:
    def run(self, code: str, language: str = "python", timeout: float | None = None) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(status="ok", stdout="1\n", stderr="")


def _serve(args: list[str], tmp_path: Path, wait_s: float = 240) -> tuple[subprocess.Popen[str], str, str]:
    """`flowrl serve ARGS --port 0` in a subprocess; (process, url, model name) once it listens."""
    env = dict(os.environ, COLUMNS="400", FLOWRL_MODELS=os.environ.get("FLOWRL_MODELS", str(tmp_path / "models")))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowrl.cli", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=_ctrl_c_reaches_it,
    )
    deadline = time.monotonic() + wait_s
    seen = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"serving (\S+) .* at (http://\S+/v1);", line)
        if found:
            return proc, found.group(2), found.group(1)
    proc.kill()
    raise AssertionError("flowrl serve did not start:\n" + "".join(seen))


def _ctrl_c_reaches_it() -> None:
    """In the server before it starts: Ctrl-C as a terminal sends it. A shell without job control (`make test &`,
    `nohup`) starts its background jobs with SIGINT ignored, and the server would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # not stopped: fail, and leave no server behind
            proc.kill()
            proc.communicate()
    return out


def _run_agent(url: str, name: str, store_dir: Path, query: str) -> Any:
    from flowrl.demo.agent import ExampleAgent
    from flowrl.serve.client import ServedBackend

    agent = ExampleAgent(ServedBackend(url, name, max_tokens=24), sandbox=FakeSandbox())
    store = TraceStore(store_dir)
    hook = hook_into_agent(agent, store=store)
    answer = asyncio.run(agent.a_run(query, session_id="s", max_iterations=2))
    assert hook.flush(timeout=30)
    hook.unhook()
    (trace,) = list(store.iter_traces())
    return answer, trace


def test_example_agent_on_flowrl_serve_is_captured_with_the_served_ids(tmp_path: Path) -> None:
    """A base model plus a LoRA adapter from `flowrl train`, served by the transformers engine (no build)."""
    base = save_tiny_model(tmp_path / "base")
    adapter = save_tiny_adapter(base, tmp_path / "adapter")
    proc, url, name = _serve([str(adapter), "--engine", "transformers"], tmp_path)
    try:
        assert name == "adapter"
        _answer, trace = _run_agent(url, name, tmp_path / "store", "What is 2 + 2?")
    finally:
        out = _stop(proc)
    assert trace.llm_calls and all(call.has_token_ids for call in trace.llm_calls)
    first = trace.llm_calls[0]
    from transformers import AutoTokenizer

    from flowrl.trace.tokenizer import fingerprint, same_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    assert first.tokens_in == len(first.prompt_token_ids) and same_tokenizer(first.tokenizer, fingerprint(tokenizer))
    assert "What is 2 + 2?" in tokenizer.decode(first.prompt_token_ids)  # the agent's prompt, as the server rendered it
    assert re.search(r"served [1-9]\d* requests", out), out


@pytest.mark.slow
@pytest.mark.integration
def test_example_agent_on_the_default_model_through_llama_cpp(tmp_path: Path) -> None:
    """The default model (SmolLM2-135M-Instruct), served by llama.cpp: the agent answers, its trace is captured."""
    pytest.importorskip("llama_cpp")
    from flowrl.models import ensure_default_model

    ensure_default_model()
    proc, url, name = _serve(["default"], tmp_path)
    try:
        _answer, trace = _run_agent(url, name, tmp_path / "store", "What is the capital of France?")
    finally:
        _stop(proc)
    assert {call.model for call in trace.llm_calls} == {name} and trace.final_response
    assert all(call.has_token_ids for call in trace.llm_calls)
