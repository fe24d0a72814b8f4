"""Ollama Modelfile content (templates, stops, parameters), `ollama create` and pointing an agent at the model."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from helpers_export import LLAMA3_TEMPLATE, tiny_tokenizer  # noqa: E402

from flowrl.export import OllamaDeployer, TemplateConversionError, build_modelfile  # noqa: E402
from flowrl.export.agent import current_models, ollama_model, restore_model, use_model  # noqa: E402
from flowrl.export.errors import ExportError  # noqa: E402
from flowrl.export.ollama import CHATML_TEMPLATE  # noqa: E402
from flowrl.export.ollama import LLAMA3_TEMPLATE as GO_LLAMA3


def _tokenizer_dir(path: Path, template: str | None, *, eos: str = "<|im_end|>", gen: str | None = None) -> Path:
    tok = tiny_tokenizer()
    tok.chat_template = template
    if eos != tok.eos_token:
        tok.add_special_tokens({"eos_token": eos})
    tok.save_pretrained(path)
    (path / "config.json").write_text('{"max_position_embeddings": 16384}')
    if gen:
        (path / "generation_config.json").write_text(gen)
    return path


def test_chatml_modelfile_has_template_system_stops_and_parameters(tmp_path: Path) -> None:
    model_dir = _tokenizer_dir(
        tmp_path, tiny_tokenizer().chat_template, gen='{"temperature": 0.3, "top_p": 0.9, "repetition_penalty": 1.1}'
    )
    text = build_modelfile("./model-q8_0.gguf", model_dir).render()
    assert text.startswith("# Modelfile written by flowrl export\nFROM ./model-q8_0.gguf\n")
    assert f'TEMPLATE """{CHATML_TEMPLATE}"""' in text
    # the Jinja template adds this system prompt when none is given: it becomes SYSTEM
    assert 'SYSTEM """You are a tiny test assistant."""' in text
    stops = [line for line in text.splitlines() if line.startswith("PARAMETER stop")]
    assert stops == ['PARAMETER stop "<|im_start|>"', 'PARAMETER stop "<|im_end|>"']
    assert "PARAMETER temperature 0.3" in text and "PARAMETER top_p 0.9" in text
    assert "PARAMETER repeat_penalty 1.1" in text
    assert "PARAMETER num_ctx 8192" in text  # the model's 16384, capped


def test_chatml_go_template_shape() -> None:
    # Ollama fills .System, .Messages (.Role/.Content); the last user turn opens the assistant turn
    assert "{{- range $i, $_ := .Messages }}" in CHATML_TEMPLATE
    assert "<|im_start|>{{ .Role }}\n{{ .Content }}" in CHATML_TEMPLATE
    assert "<|im_start|>assistant\n{{ end }}" in CHATML_TEMPLATE
    assert '"""' not in CHATML_TEMPLATE and '"""' not in GO_LLAMA3


def test_llama3_modelfile(tmp_path: Path) -> None:
    model_dir = _tokenizer_dir(tmp_path, LLAMA3_TEMPLATE, eos="<|end_of_text|>")
    spec = build_modelfile("/models/m.gguf", model_dir, parameters={"temperature": 0.2}, system="Be brief.")
    assert spec.template == GO_LLAMA3
    assert spec.stops == ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"]
    assert spec.system == "Be brief."
    assert spec.parameters["temperature"] == 0.2
    assert "<|start_header_id|>assistant<|end_header_id|>\n\n{{ end }}" in GO_LLAMA3


def test_unknown_template_falls_back_or_raises_when_strict(tmp_path: Path) -> None:
    model_dir = _tokenizer_dir(tmp_path, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    spec = build_modelfile("./m.gguf", model_dir)
    text = spec.render()
    assert not [line for line in text.splitlines() if line.startswith("TEMPLATE")]
    assert "# TEMPLATE left out" in text and "stored in the model file" in text
    assert spec.stops == ["<|im_end|>"]
    with pytest.raises(TemplateConversionError, match="neither ChatML"):
        build_modelfile("./m.gguf", model_dir, strict=True)


def test_deployer_returns_the_command_when_ollama_is_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    model_dir = _tokenizer_dir(tmp_path / "model", tiny_tokenizer().chat_template)
    (tmp_path / "out").mkdir()
    gguf = tmp_path / "out" / "model-q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    result = OllamaDeployer("flowrl-tiny").deploy(gguf, model_dir, tmp_path / "out")
    assert not result.created
    assert result.command == ["ollama", "create", "flowrl-tiny", "-f", str(tmp_path / "out" / "Modelfile")]
    assert "FROM ./model-q8_0.gguf" in result.modelfile.read_text()


def test_deployer_runs_ollama_create_when_present(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ollama"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\necho success\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    model_dir = _tokenizer_dir(tmp_path / "model", tiny_tokenizer().chat_template)
    result = OllamaDeployer("flowrl-tiny").deploy(model_dir, model_dir, tmp_path / "out")
    assert result.created and result.output == "success"
    assert (bin_dir / "args").read_text().split() == [
        "create",
        "flowrl-tiny",
        "-f",
        str(tmp_path / "out" / "Modelfile"),
    ]


def test_failing_ollama_create_is_an_error(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ollama"
    fake.write_text("#!/bin/sh\necho 'Error: unsupported architecture' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM ./m.gguf\n")
    with pytest.raises(ExportError, match="unsupported architecture"):
        OllamaDeployer("x").create(modelfile)


def test_invalid_ollama_name() -> None:
    with pytest.raises(ExportError, match="invalid Ollama model name"):
        OllamaDeployer("two words")


def test_use_model_points_a_flowagent_at_the_exported_model_and_back() -> None:
    agent = SimpleNamespace(
        amd=SimpleNamespace(fast_llm_model="openrouter/a", complex_llm_model="openrouter/b", api_base=None)
    )
    previous = use_model(agent, ollama_model("flowrl-tiny"))
    assert current_models(agent) == {
        "fast_llm_model": "ollama/flowrl-tiny",
        "complex_llm_model": "ollama/flowrl-tiny",
        "api_base": None,
    }
    restore_model(agent, previous)
    assert agent.amd.fast_llm_model == "openrouter/a" and agent.amd.complex_llm_model == "openrouter/b"

    previous = use_model(agent, "openai/flowrl-tiny", api_base="http://127.0.0.1:8080/v1", api_key="none", which="fast")
    assert agent.amd.fast_llm_model == "openai/flowrl-tiny" and agent.amd.complex_llm_model == "openrouter/b"
    assert agent.amd.api_base == "http://127.0.0.1:8080/v1"
    restore_model(agent, previous)
    assert agent.amd.api_base is None


def test_use_model_rejects_what_it_cannot_do() -> None:
    with pytest.raises(ExportError, match="provider prefix"):
        use_model(SimpleNamespace(fast_llm_model="x"), "flowrl-tiny")
    with pytest.raises(ExportError, match="cannot point it"):
        use_model(object(), "ollama/x")


GO_RENDER = """package main

import (
	"encoding/json"
	"os"
	"text/template"
)

type Message struct{ Role, Content string }

func main() {
	var in struct {
		Template, System string
		Messages         []*Message
	}
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		panic(err)
	}
	t := template.Must(template.New("m").Parse(in.Template))
	if err := t.Execute(os.Stdout, map[string]any{"System": in.System, "Messages": in.Messages}); err != nil {
		panic(err)
	}
}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


@pytest.mark.integration
@pytest.mark.parametrize("jinja", ["chatml", "llama3"])
def test_go_template_renders_like_the_jinja_template(tmp_path: Path, jinja: str) -> None:
    """Runs the Modelfile's TEMPLATE through Go's text/template, fed as Ollama feeds it, against transformers'
    rendering."""
    import json
    import shutil
    import subprocess

    go = shutil.which("go")
    if go is None:
        pytest.skip("needs the Go toolchain (apt-get install golang-go) to run text/template")
    template = tiny_tokenizer().chat_template if jinja == "chatml" else LLAMA3_TEMPLATE
    model_dir = _tokenizer_dir(tmp_path / "model", template)
    spec = build_modelfile("./m.gguf", model_dir)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = template
    (tmp_path / "render.go").write_text(GO_RENDER)
    env = {
        "HOME": str(tmp_path),
        "GOCACHE": str(tmp_path / "gocache"),
        "GOFLAGS": "-mod=mod",
        "PATH": os.environ["PATH"],
        "GO111MODULE": "off",
    }
    binary = tmp_path / "render"
    subprocess.run([go, "build", "-o", str(binary), str(tmp_path / "render.go")], check=True, env=env, cwd=tmp_path)
    for messages in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if jinja == "llama3":  # BOS comes from the tokenizer (add_bos_token), not from Ollama's template
            expected = expected.removeprefix(tokenizer.bos_token)
        # Ollama: the Modelfile SYSTEM becomes a system message when the request has none; .System joins them
        sent = (
            messages
            if messages[0]["role"] == "system" or not spec.system
            else [{"role": "system", "content": spec.system}, *messages]
        )
        system = "\n\n".join(m["content"] for m in sent if m["role"] == "system")
        payload = {
            "Template": spec.template,
            "System": system,
            "Messages": [{"Role": m["role"], "Content": m["content"]} for m in sent],
        }
        rendered = subprocess.run(
            [str(binary)], input=json.dumps(payload), capture_output=True, text=True, check=True
        ).stdout
        assert rendered == expected, messages
