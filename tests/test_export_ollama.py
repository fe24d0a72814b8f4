"""Ollama Modelfile content (templates, stops, parameters), `ollama create` and pointing an agent at the model."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")

from helpers_export import LLAMA3_TEMPLATE, tiny_tokenizer  # noqa: E402

from flowrl.export import OllamaDeployer, TemplateConversionError, build_modelfile  # noqa: E402
from flowrl.export.agent import current_models, ollama_model, restore_model, use_model  # noqa: E402
from flowrl.export.errors import ExportError  # noqa: E402
from flowrl.export.ollama import CHATML_TEMPLATE, FORMATS, detect_format  # noqa: E402
from flowrl.export.ollama import LLAMA3_TEMPLATE as GO_LLAMA3  # noqa: E402


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


# --- chat families and tool-aware templates -------------------------------------------------------------------------


def _family_templates() -> dict[str, str]:
    """Each family's Jinja chat template: flowrl's SmolLM2 template, TRL's copies of the model templates, and the
    plain test templates."""
    import flowrl

    trl = pytest.importorskip("trl")
    trl_dir = Path(trl.__file__).parent / "chat_templates"
    return {
        "chatml": tiny_tokenizer().chat_template,
        "llama3": LLAMA3_TEMPLATE,
        "smollm2": (Path(flowrl.__file__).parent / "templates" / "smollm2_chatml.jinja").read_text(encoding="utf-8"),
        "qwen2.5": (trl_dir / "qwen2_5.jinja").read_text(encoding="utf-8"),
        "qwen3": (trl_dir / "qwen3.jinja").read_text(encoding="utf-8"),
        "llama3.1": (trl_dir / "llama3_1.jinja").read_text(encoding="utf-8"),
        "llama3.2": (trl_dir / "llama3_2.jinja").read_text(encoding="utf-8"),
    }


TOOL_FAMILIES = ["smollm2", "qwen2.5", "qwen3", "llama3.1", "llama3.2"]
DEFAULT_SYSTEM = {
    "smollm2": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "qwen2.5": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "qwen3": None,
    "llama3.1": None,  # its "Cutting Knowledge Date" preamble is written by the Go template, not SYSTEM
    "llama3.2": None,
}


def test_each_family_is_detected_from_its_chat_template() -> None:
    templates = _family_templates()
    for family, template in templates.items():
        fmt = detect_format(template)
        assert fmt.name == family
        assert fmt.tools == (family in TOOL_FAMILIES)
    trl_dir = Path(pytest.importorskip("trl").__file__).parent / "chat_templates"
    assert detect_format((trl_dir / "llama3.jinja").read_text()).name == "llama3"
    # Llama 3.1 has a fixed default date; 3.2 takes today's from strftime_now, Ollama's currentDate here
    assert "Today Date: 26 Jul 2024\n" in detect_format(templates["llama3.1"]).template
    assert "Today Date: {{ currentDate }}\n" in detect_format(templates["llama3.2"]).template
    for family in TOOL_FAMILIES:
        go = FORMATS[family].template
        # Ollama enables tools for templates that use .Tools, and takes the first text inside `if .ToolCalls` as
        # the prefix of a tool call in the model's output (`{`, i.e. any JSON object, for Llama)
        assert "{{ json . }}" in go and "if .ToolCalls }}" in go
        start = {"qwen2.5": "{{ range .ToolCalls }}\n<tool_call>", "llama3.1": '{{ range .ToolCalls }}{"name"'}
        start["llama3.2"] = start["llama3.1"]
        assert start.get(family, "{{ range $j, $_ := .ToolCalls }}<tool_call>") in go, family


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_tool_family_modelfile(tmp_path: Path, family: str) -> None:
    model_dir = _tokenizer_dir(tmp_path, _family_templates()[family])
    spec = build_modelfile("./m.gguf", model_dir, strict=True)
    assert spec.template == FORMATS[family].template
    assert spec.system == DEFAULT_SYSTEM[family]
    assert spec.note is None
    assert spec.stops[: len(FORMATS[family].stops)] == list(FORMATS[family].stops)


def test_tool_template_without_a_tool_aware_go_template_is_reported(tmp_path: Path, caplog) -> None:
    """Qwen3-2507's template handles tools in ChatML, but its turns differ from Qwen3's: flowrl has no Go template
    for it, so it gets plain ChatML and says so, rather than silently dropping the tools."""
    trl_dir = Path(pytest.importorskip("trl").__file__).parent / "chat_templates"
    model_dir = _tokenizer_dir(tmp_path, (trl_dir / "qwen3_instruct_2507.jinja").read_text())
    with caplog.at_level(logging.WARNING, logger="flowrl.export.ollama"):
        spec = build_modelfile("./m.gguf", model_dir)
    assert spec.template == CHATML_TEMPLATE
    warnings = [r.getMessage() for r in caplog.records if "no tool-aware Ollama template" in r.getMessage()]
    assert len(warnings) == 1 and "does not support tools" in warnings[0] and "Fix:" in warnings[0]
    text = spec.render()
    assert "# Tools left out: the chat template handles tools" in text
    with pytest.raises(TemplateConversionError, match="no tool-aware Ollama template"):
        build_modelfile("./m.gguf", model_dir, strict=True)


GO_RENDER = """package main

// Renders Ollama templates as Ollama's template/template.go does: the same data (System, Messages with
// Thinking/ToolCalls/ToolName, Tools, Think, IsThinkSet), Option("missingkey=zero") and the json/currentDate funcs.

import (
	"encoding/json"
	"os"
	"strings"
	"text/template"
	"time"
)

type Args map[string]any

func (a Args) String() string {
	if a == nil {
		return "{}"
	}
	b, _ := json.Marshal(a)
	return string(b)
}

type ToolCall struct {
	ID       string
	Function struct {
		Index     int
		Name      string
		Arguments Args
	}
}

type Message struct {
	Role, Content, Thinking string
	ToolCalls               []ToolCall
	ToolName, ToolCallID    string
}

type Tool struct {
	Type     string `json:"type"`
	Items    any    `json:"items,omitempty"`
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  struct {
			Type       string         `json:"type"`
			Defs       any            `json:"$defs,omitempty"`
			Items      any            `json:"items,omitempty"`
			Required   []string       `json:"required,omitempty"`
			Properties map[string]any `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

func (t Tool) String() string {
	b, _ := json.Marshal(t)
	return string(b)
}

var funcs = template.FuncMap{
	"json": func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	},
	"currentDate": func(args ...string) string { return time.Now().Format("2006-01-02") },
}

type Case struct {
	Template, System  string
	Messages          []*Message
	Tools             []Tool
	Think, IsThinkSet bool
}

func main() {
	var cases []Case
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		panic(err)
	}
	out := []string{}
	for _, c := range cases {
		t := template.Must(template.New("m").Option("missingkey=zero").Funcs(funcs).Parse(c.Template))
		var b strings.Builder
		data := map[string]any{
			"System": c.System, "Messages": c.Messages, "Tools": c.Tools, "Response": "",
			"Think": c.Think, "IsThinkSet": c.IsThinkSet,
		}
		if err := t.Execute(&b, data); err != nil {
			panic(err)
		}
		out = append(out, b.String())
	}
	json.NewEncoder(os.Stdout).Encode(out)
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

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a time zone.",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
        },
    },
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = "What's the weather in Paris?"
TOOL_CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": WEATHER}],
    [  # a call, its result, and the generation prompt for the final answer
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": WEATHER},
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", city="Paris", unit="c")]},
        {"role": "tool", "name": "get_weather", "content": '{"temp_c": 21, "sky": "clear"}'},
    ],
    [  # content beside the call, a result with characters JSON encoders treat differently, a final answer
        {"role": "user", "content": WEATHER},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [_call("get_weather", city="Paris")]},
        {"role": "tool", "name": "get_weather", "content": 'Sunny, 21 °C & <b>"dry"</b>\nwind 5 km/h'},
        {"role": "assistant", "content": "It is sunny and 21 °C in Paris."},
        {"role": "user", "content": "And the time there?"},
    ],
]
MULTI_CALL = [  # two calls in one turn and two results in a row (Llama 3.1/3.2 templates allow one call per turn)
    {"role": "user", "content": "Weather and time in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("get_weather", city="Paris"), _call("get_time", tz="CET")],
    },
    {"role": "tool", "name": "get_weather", "content": "21 C"},
    {"role": "tool", "name": "get_time", "content": "14:05"},
]
THINKING = [  # Qwen3: reasoning of the turn in progress is shown, reasoning of an answered turn is dropped
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello", "reasoning_content": "Greet back."},
    {"role": "user", "content": WEATHER},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Use the tool.",
        "tool_calls": [_call("get_weather", city="Paris")],
    },
    {"role": "tool", "name": "get_weather", "content": "21 C"},
]


def _cases(family: str) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool | None]]:
    """(messages, tools, think) for a family: think None leaves it unset, False is Qwen3's enable_thinking=False."""
    cases: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool | None]] = [
        (m, None, None) for m in CONVERSATIONS
    ]
    if family in TOOL_FAMILIES:
        cases += [(m, TOOLS, None) for m in TOOL_CONVERSATIONS]
        if not family.startswith("llama"):
            cases.append((MULTI_CALL, TOOLS, None))
    if family == "qwen3":
        cases += [(THINKING, TOOLS, None), (TOOL_CONVERSATIONS[1], TOOLS, False), (CONVERSATIONS[2], None, False)]
    return cases


def _ollama_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as Ollama hands it to the template (api.Message): reasoning is .Thinking, a tool's name .ToolName."""
    return {
        "Role": m["role"],
        "Content": m.get("content") or "",
        "Thinking": m.get("reasoning_content", ""),
        "ToolName": m.get("name", "") if m["role"] == "tool" else "",
        "ToolCalls": [
            {"Function": {"Name": c["function"]["name"], "Arguments": c["function"]["arguments"]}}
            for c in m.get("tool_calls") or []
        ],
    }


def _split_json(text: str) -> tuple[str, list[Any]]:
    """`text` with every embedded JSON object replaced by a placeholder, and those objects parsed.

    Ollama's `json` (Go's json.Marshal) writes compact JSON with map keys sorted and <, >, & escaped; Jinja's
    `tojson` writes ", "/": " separators (Llama 3.1: indent=4) in insertion order. Tool schemas, tool calls and
    arguments are compared as data; everything outside them must match byte for byte.
    """
    decoder = json.JSONDecoder()
    parts: list[str] = []
    objects: list[Any] = []
    pos, start = 0, text.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        parts += [text[pos:start], "<JSON>"]
        objects.append(value)
        pos, start = end, text.find("{", end)
    parts.append(text[pos:])
    return "".join(parts), objects


def test_split_json_keeps_text_and_compares_objects_as_data() -> None:
    jinja = '<tool_call>\n{"name": "f", "arguments": {"a": "<b>", "z": 1}}\n</tool_call> {"name": function name}'
    go = '<tool_call>\n{"name": "f", "arguments": {"z":1,"a":"\\u003cb\\u003e"}}\n</tool_call> {"name": function name}'
    assert _split_json(jinja) == _split_json(go)
    assert _split_json(jinja)[0] == '<tool_call>\n<JSON>\n</tool_call> {"name": function name}'
    assert _split_json(jinja.replace('"z": 1', '"z": 2')) != _split_json(go)


@pytest.fixture(scope="module")
def go_render(tmp_path_factory):
    """A function rendering a list of cases through Go's text/template, built once per module."""
    import shutil
    import subprocess

    go = shutil.which("go")
    if go is None:
        pytest.skip("needs the Go toolchain (apt-get install golang-go) to run text/template")
    work = tmp_path_factory.mktemp("gorender")
    (work / "render.go").write_text(GO_RENDER)
    env = {
        "HOME": str(work),
        "GOCACHE": str(work / "gocache"),
        "GOFLAGS": "-mod=mod",
        "PATH": os.environ["PATH"],
        "GO111MODULE": "off",
    }
    binary = work / "render"
    subprocess.run([go, "build", "-o", str(binary), str(work / "render.go")], check=True, env=env, cwd=work)

    def render(cases: list[dict[str, Any]]) -> list[str]:
        proc = subprocess.run([str(binary)], input=json.dumps(cases), capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    return render


@pytest.mark.integration
@pytest.mark.parametrize("family", ["chatml", "llama3", *TOOL_FAMILIES])
def test_go_template_renders_like_the_jinja_template(tmp_path: Path, family: str, go_render) -> None:
    """Runs the Modelfile's TEMPLATE through Go's text/template, fed as Ollama feeds it (Modelfile SYSTEM, Tools,
    ToolCalls, Thinking, think flag), against transformers' rendering of the same conversation."""
    template = _family_templates()[family]
    spec = build_modelfile("./m.gguf", _tokenizer_dir(tmp_path / "model", template), strict=True)
    assert spec.template is not None
    tokenizer = tiny_tokenizer(template)
    payloads, expected = [], []
    for messages, tools, think in _cases(family):
        extra = {} if think is None else {"enable_thinking": think}
        want = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **extra)
        if family.startswith("llama"):  # BOS comes from the tokenizer (add_bos_token), not from Ollama's template
            want = want.removeprefix(tokenizer.bos_token)
        if family == "llama3.2":  # strftime_now("%d %b %Y"); Ollama's currentDate writes YYYY-MM-DD
            want = re.sub(
                r"Today Date: (\d\d \w\w\w \d{4})",
                lambda m: "Today Date: " + datetime.strptime(m[1], "%d %b %Y").date().isoformat(),
                want,
            )
        if tools:  # the reference itself shows the definitions, the call and the result the template must keep
            assert "Current weather in a city." in want and "get_weather" in want
            if any(m["role"] == "tool" for m in messages):
                assert '"Paris"' in want and ("21" in want)
        expected.append(want)
        # Ollama: the Modelfile SYSTEM becomes a system message when the request has none; .System joins them
        sent = (
            messages
            if messages[0]["role"] == "system" or not spec.system
            else [{"role": "system", "content": spec.system}, *messages]
        )
        payloads.append(
            {
                "Template": spec.template,
                "System": "\n\n".join(m["content"] for m in sent if m["role"] == "system"),
                "Messages": [_ollama_message(m) for m in sent],
                "Tools": tools,
                "Think": bool(think),
                "IsThinkSet": think is not None,
            }
        )
    for (messages, tools, think), got, want in zip(_cases(family), go_render(payloads), expected, strict=True):
        assert _split_json(got) == _split_json(want), (messages, tools, think, got, want)
