"""Ollama Modelfile from a model's own chat template, and `ollama create`.

The tokenizer's Jinja chat template is recognised by its markers and mapped to a hand-written Go template of
the same format (`flowrl.export.ollama_templates`): plain ChatML and Llama 3, and tool-aware templates for
flowrl's SmolLM2, Qwen2.5, Qwen3 and Llama 3.1/3.2, which render `.Tools`, tool calls and tool results so that
Ollama serves the model with tools.

A default system prompt that the Jinja template inserts by itself (SmolLM2 and Qwen2.5 do) is found by rendering
the template with and without a system message and becomes the Modelfile's `SYSTEM`. Stop tokens are the
format's turn markers plus the tokenizer's EOS token.

A template of no known format raises TemplateConversionError with `strict=True`; otherwise (the default) the
Modelfile is written without TEMPLATE, with a comment saying so: Ollama then uses the chat template stored in the
GGUF file (`tokenizer.chat_template`), which it auto-detects for known formats. A template that handles tools but
has no tool-aware Go template gets its format's plain template, with a warning and a Modelfile comment (or
TemplateConversionError with `strict=True`): it is never silently stripped of its tools.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.export.errors import ExportError, TemplateConversionError
from flowrl.export.ollama_templates import (
    CHATML_TEMPLATE,
    FORMATS,
    LLAMA3_TEMPLATE,
    ChatFormat,
    detect_format,
    missing_tool_support,
)

__all__ = [
    "CHATML_TEMPLATE",
    "FORMATS",
    "LLAMA3_TEMPLATE",
    "ChatFormat",
    "DeployResult",
    "ModelfileSpec",
    "OllamaDeployer",
    "build_modelfile",
    "default_system_prompt",
    "detect_format",
]

log = logging.getLogger(__name__)


def default_system_prompt(tokenizer: Any, fmt: ChatFormat) -> str | None:
    """The system prompt the Jinja template adds when the conversation has none, if any.

    The template is rendered for one user message with and without a marker system message: what stands in the
    marker's place in a system turn (`fmt.system_open`) of the bare rendering is the default. Comparing the two
    renderings, rather than reading the first system turn, skips text the template writes around every system
    prompt (Llama 3.1's "Cutting Knowledge Date" preamble), which the Go template writes itself.
    """
    user, system = "FLOWRL-USER-MESSAGE", "FLOWRL-SYSTEM-PROMPT"

    def render(messages: list[dict[str, str]]) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    try:
        bare = render([{"role": "user", "content": user}])
        with_system = render([{"role": "system", "content": system}, {"role": "user", "content": user}])
    except Exception as exc:  # a template that needs more context (tools, dates) renders nothing useful here
        log.debug("cannot render the chat template: %s", exc)
        return None
    head, found, tail = with_system.partition(system)
    if not found or fmt.system_open not in head or not bare.startswith(head):
        return None
    follow = tail.split(user, 1)[0]  # what separates the system prompt from the user message
    end = bare.find(follow + user, len(head))
    if end < 0:
        return None
    return bare[len(head) : end].strip() or None


def _quote(value: str) -> str:
    if '"""' in value:
        raise ExportError('a Modelfile value cannot contain """; remove it from the system prompt')
    return f'"""{value}"""'


@dataclass
class ModelfileSpec:
    source: str  # what FROM points at: a .gguf file or a safetensors folder
    template: str | None
    stops: list[str]
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    def render(self) -> str:
        lines = ["# Modelfile written by flowrl export", f"FROM {self.source}", ""]
        if self.template is not None:
            lines.append(f"TEMPLATE {_quote(self.template)}")
        if self.note:
            lines += [f"# {line}" for line in self.note.splitlines()]
        if self.system:
            lines.append(f"SYSTEM {_quote(self.system)}")
        lines.append("")
        for stop in self.stops:
            lines.append(f"PARAMETER stop {json.dumps(stop)}")
        for key, value in self.parameters.items():
            lines.append(f"PARAMETER {key} {value}")
        return "\n".join(lines) + "\n"


def _generation_defaults(model_dir: Path) -> dict[str, Any]:
    params: dict[str, Any] = {}
    path = model_dir / "generation_config.json"
    if path.is_file():
        try:
            gen = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            gen = {}
        for key in ("temperature", "top_p", "top_k"):
            if gen.get(key) is not None:
                params[key] = gen[key]
        if gen.get("repetition_penalty") is not None:
            params["repeat_penalty"] = gen["repetition_penalty"]
    return params


def build_modelfile(
    source: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    parameters: dict[str, Any] | None = None,
    system: str | None = None,
    strict: bool = False,
) -> ModelfileSpec:
    """A Modelfile for `source` (GGUF file or safetensors folder) using the tokenizer and config in `model_dir`.

    Parameters: `temperature` (0.7 unless generation_config.json says otherwise), `top_p`/`top_k`/
    `repeat_penalty` when generation_config.json sets them, `num_ctx` (the model's context length, at most
    8192); `parameters` overrides any of them.
    """
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    eos = getattr(tokenizer, "eos_token", None)
    spec = ModelfileSpec(source=str(source), template=None, stops=[])
    try:
        fmt = detect_format(template)
    except TemplateConversionError as exc:
        if strict:
            raise
        spec.note = f"TEMPLATE left out: {exc}.\nOllama uses the chat template stored in the model file instead."
        log.warning("Modelfile: %s", exc)
    else:
        gap = missing_tool_support(template or "", fmt)
        if gap is not None:
            if strict:
                raise TemplateConversionError(gap)
            spec.note = f"Tools left out: {gap}."
            log.warning("Modelfile: %s", gap)
        spec.template = fmt.template
        spec.stops = list(fmt.stops)
        spec.system = default_system_prompt(tokenizer, fmt)
    if eos and eos not in spec.stops:
        spec.stops.append(eos)
    if system is not None:
        spec.system = system

    params: dict[str, Any] = {"temperature": 0.7}
    params.update(_generation_defaults(model_dir))
    config_path = model_dir / "config.json"
    if config_path.is_file():
        ctx = json.loads(config_path.read_text(encoding="utf-8")).get("max_position_embeddings")
        if ctx:
            params["num_ctx"] = min(int(ctx), 8192)
    params.update(parameters or {})
    spec.parameters = params
    return spec


@dataclass
class DeployResult:
    modelfile: Path
    command: list[str]
    created: bool
    output: str = ""

    @property
    def command_line(self) -> str:
        import shlex

        return shlex.join(self.command)


class OllamaDeployer:
    """Write a Modelfile and register the model with Ollama.

    `deploy(source, model_dir, out_dir)` writes `out_dir/Modelfile` and runs `ollama create NAME -f Modelfile`
    when the `ollama` binary is on PATH; otherwise it returns the exact command to run (`created=False`).
    """

    def __init__(self, name: str, *, binary: str = "ollama", timeout: float = 1800.0) -> None:
        if not name or any(c.isspace() for c in name):
            raise ExportError(f"invalid Ollama model name {name!r}: use letters, digits, '-', '_', '.', ':' and '/'")
        self.name = name
        self.binary = binary
        self.timeout = timeout

    def write_modelfile(
        self,
        source: str | os.PathLike[str],
        model_dir: str | os.PathLike[str],
        out_dir: str | os.PathLike[str],
        **options: Any,
    ) -> Path:
        out_dir = Path(out_dir)
        source = Path(source)
        # Ollama resolves FROM relative to the Modelfile's folder.
        try:
            shown = "./" + str(source.resolve().relative_to(out_dir.resolve()))
        except ValueError:
            shown = str(source.resolve())
        text = build_modelfile(shown, model_dir, **options).render()
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "Modelfile"
        tmp = path.with_name(".Modelfile.partial")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return path

    def command(self, modelfile: Path) -> list[str]:
        return [self.binary, "create", self.name, "-f", str(modelfile)]

    def create(self, modelfile: Path) -> DeployResult:
        cmd = self.command(modelfile)
        exe = shutil.which(self.binary)
        if exe is None:
            return DeployResult(
                modelfile=modelfile,
                command=cmd,
                created=False,
                output=f"{self.binary} is not on PATH; run this where Ollama is installed",
            )
        try:
            proc = subprocess.run(
                [exe, *cmd[1:]], capture_output=True, text=True, timeout=self.timeout, cwd=str(modelfile.parent)
            )
        except subprocess.TimeoutExpired as exc:
            raise ExportError(f"`{' '.join(cmd)}` did not finish in {self.timeout:.0f} s") from exc
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise ExportError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {output[-2000:]}")
        return DeployResult(modelfile=modelfile, command=cmd, created=True, output=output)

    def deploy(
        self,
        source: str | os.PathLike[str],
        model_dir: str | os.PathLike[str],
        out_dir: str | os.PathLike[str],
        **options: Any,
    ) -> DeployResult:
        return self.create(self.write_modelfile(source, model_dir, out_dir, **options))
