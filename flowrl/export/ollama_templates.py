"""Ollama Go templates for the chat formats flowrl exports, and which one a Jinja chat template is.

Hugging Face chat templates are Jinja; Ollama's are Go `text/template` over `.System`, `.Messages` (`.Role`,
`.Content`, `.Thinking`, `.ToolCalls` with `.Function.Name` / `.Function.Arguments`, `.ToolName`), `.Tools` and
`.Think` / `.IsThinkSet`, with a `json` function (Go's `json.Marshal`). There is no general translation, so the
Jinja template is recognised by markers and mapped to a hand-written Go template that renders the same text:

* `chatml` / `llama3`: plain ChatML and Llama 3 templates without tool handling;
* `smollm2`: flowrl's SmolLM2 template (`flowrl/templates/smollm2_chatml.jinja`), Hermes-style `<tools>`,
  `<tool_call>`, one `<tool_response>` user turn per tool result;
* `qwen2.5`: Qwen2.5's template, consecutive tool results merged into one user turn;
* `qwen3`: Qwen3's template. The generation prompt is plain (the model opens `<think>` itself) unless the request
  sets `think: false`, which adds the empty `<think>\\n\\n</think>` block Qwen3's `enable_thinking=False` adds; an
  assistant turn after the last user message shows its `.Thinking` in `<think>` tags, as the Jinja template shows
  `reasoning_content`; older turns show only their content;
* `llama3.1` / `llama3.2`: tools as JSON in the first user message, calls as `{"name": ..., "parameters": ...}`,
  results in `ipython` turns. `Today Date` is the Jinja template's fixed default (3.1) or Ollama's
  `currentDate` (3.2, whose Jinja template uses `strftime_now`; Ollama writes the date as YYYY-MM-DD).

Ollama reports tool support when a template uses `.Tools`, and finds the tool-call prefix (`<tool_call>`, or `{`
for Llama) as the first text inside `{{ if .ToolCalls }}`: the templates keep that shape.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from flowrl.export.errors import TemplateConversionError

CHATML_TEMPLATE = """{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if ne .Role "system" }}<|im_start|>{{ .Role }}
{{ .Content }}{{ if or (ne .Role "assistant") (not $last) }}<|im_end|>
{{ end }}
{{- end }}
{{- if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}
{{- end }}"""

LLAMA3_TEMPLATE = """{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>
{{- end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if ne .Role "system" }}<|start_header_id|>\
{{ if eq .Role "tool" }}ipython{{ else }}{{ .Role }}{{ end }}<|end_header_id|>

{{ .Content }}{{ if or (ne .Role "assistant") (not $last) }}<|eot_id|>{{ end }}
{{- end }}
{{- if and $last (ne .Role "assistant") }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}"""

# Per message: whether it is the last one, and the role of the next one (Go templates have no arithmetic).
_LAST_AND_NEXT = """
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- $next := "" }}{{ if not $last }}{{ $next = (index (slice $.Messages $i) 1).Role }}{{ end }}"""

# Hermes-style calls joined by newlines, after a newline when the turn has content (SmolLM2, Qwen3). The first text
# inside `if .ToolCalls` is `<tool_call>`: Ollama takes it as the prefix that starts a call in the model's output.
_HERMES_CALLS = """
{{- $calls := .ToolCalls }}
{{- if and .Content $calls }}
{{ end }}
{{- if .ToolCalls }}{{ range $j, $_ := .ToolCalls }}<tool_call>
{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
</tool_call>{{ if ne (len (slice $calls $j)) 1 }}
{{ end }}{{ end }}{{ end }}"""

# Tool results: consecutive ones share one user turn (Qwen2.5, Qwen3).
_MERGED_TOOL_RESULTS = """
{{- else if eq .Role "tool" }}
{{- if ne $prev "tool" }}<|im_start|>user{{ end }}
<tool_response>
{{ .Content }}
</tool_response>
{{- if ne $next "tool" }}<|im_end|>
{{ end }}"""

_QWEN_TOOLS = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{{ json . }}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>"""

SMOLLM2_TEMPLATE = (
    """<|im_start|>system
{{ .System }}
{{- if .Tools }}

# Tools

You may call one or more functions. The function signatures are within <tools></tools>:
<tools>
{{- range .Tools }}
{{ json . }}
{{- end }}
</tools>

For each function call, return a JSON object with the function name and arguments within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "assistant" }}<|im_start|>assistant
{{ .Content }}"""
    + _HERMES_CALLS
    + """
{{- if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ else if ne .Role "system" }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}
{{- if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}
{{- end }}"""
)

QWEN25_TEMPLATE = (
    """{{- if or .System .Tools }}<|im_start|>system
{{ .System }}
{{- if .Tools }}

"""
    + _QWEN_TOOLS
    + """
{{- end }}<|im_end|>
{{ end }}
{{- $prev := "" }}
{{- range $i, $_ := .Messages }}"""
    + _LAST_AND_NEXT
    + """
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{- $calls := .ToolCalls }}
{{- if or .Content (not $calls) }}
{{ .Content }}
{{- end }}
{{- if .ToolCalls }}{{ range .ToolCalls }}
<tool_call>
{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
</tool_call>
{{- end }}{{ end }}
{{- if not $last }}<|im_end|>
{{ end }}"""
    + _MERGED_TOOL_RESULTS
    + """
{{- end }}
{{- if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}
{{- $prev = .Role }}
{{- end }}"""
)

QWEN3_TEMPLATE = (
    """{{- if .Tools }}<|im_start|>system
{{ if .System }}{{ .System }}

{{ end }}"""
    + _QWEN_TOOLS
    + """<|im_end|>
{{ else if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- $lastUser := -1 }}
{{- range $i, $m := .Messages }}{{ if eq $m.Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- $prev := "" }}
{{- range $i, $_ := .Messages }}"""
    + _LAST_AND_NEXT
    + """
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if and .Thinking (gt $i $lastUser) }}<think>
{{ .Thinking }}
</think>

{{ end }}{{ .Content }}"""
    + _HERMES_CALLS
    + """
{{- if not $last }}<|im_end|>
{{ end }}"""
    + _MERGED_TOOL_RESULTS
    + """
{{- end }}
{{- if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ if and $.IsThinkSet (not $.Think) }}<think>

</think>

{{ end }}{{ end }}
{{- $prev = .Role }}
{{- end }}"""
)


def llama31_template(date: str) -> str:
    """Llama 3.1/3.2 with tools in the first user message; `date` is Go template text for `Today Date:`.

    A tool result is written with `printf "%q"`, which quotes it as the Jinja template's `tojson` does (Go's `json`
    would escape `<`, `>` and `&` as `\\u003c`, which the model never saw in training).
    """
    return (
        """<|start_header_id|>system<|end_header_id|>

{{ if .Tools }}Environment: ipython
{{ end }}Cutting Knowledge Date: December 2023
Today Date: """
        + date
        + """

{{ .System }}<|eot_id|>
{{- $first := -1 }}
{{- range $i, $m := .Messages }}{{ if and (lt $first 0) (ne $m.Role "system") }}{{ $first = $i }}{{ end }}{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "system" }}
{{- else if and $.Tools (eq $i $first) }}<|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best \
answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\
Do not use variables.

{{ range $.Tools }}{{ json . }}

{{ end }}{{ .Content }}<|eot_id|>
{{- else if .ToolCalls }}<|start_header_id|>assistant<|end_header_id|>

{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- if not $last }}<|eot_id|>{{ end }}
{{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>

{{ printf "%q" .Content }}<|eot_id|>
{{- else }}<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}{{ if or (ne .Role "assistant") (not $last) }}<|eot_id|>{{ end }}
{{- end }}
{{- if and $last (ne .Role "assistant") }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}"""
    )


LLAMA31_DEFAULT_DATE = "26 Jul 2024"


@dataclass(frozen=True)
class ChatFormat:
    """A chat format flowrl writes as an Ollama TEMPLATE, with its stop tokens.

    `system_open` / `system_close` are how the rendered Jinja template opens and closes a system turn; `tools` says
    whether the Go template renders tool definitions, tool calls and tool results.
    """

    name: str
    template: str
    stops: tuple[str, ...]
    system_open: str
    system_close: str
    tools: bool = False


_CHATML_STOPS = ("<|im_start|>", "<|im_end|>")
_LLAMA3_STOPS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_CHATML_SYSTEM = ("<|im_start|>system\n", "<|im_end|>")
_LLAMA3_SYSTEM = ("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>")

FORMATS: dict[str, ChatFormat] = {
    "chatml": ChatFormat("chatml", CHATML_TEMPLATE, _CHATML_STOPS, *_CHATML_SYSTEM),
    "llama3": ChatFormat("llama3", LLAMA3_TEMPLATE, _LLAMA3_STOPS, *_LLAMA3_SYSTEM),
    "smollm2": ChatFormat("smollm2", SMOLLM2_TEMPLATE, _CHATML_STOPS, *_CHATML_SYSTEM, tools=True),
    "qwen2.5": ChatFormat("qwen2.5", QWEN25_TEMPLATE, _CHATML_STOPS, *_CHATML_SYSTEM, tools=True),
    "qwen3": ChatFormat("qwen3", QWEN3_TEMPLATE, _CHATML_STOPS, *_CHATML_SYSTEM, tools=True),
    "llama3.1": ChatFormat(
        "llama3.1", llama31_template(LLAMA31_DEFAULT_DATE), _LLAMA3_STOPS, *_LLAMA3_SYSTEM, tools=True
    ),
    "llama3.2": ChatFormat(
        "llama3.2", llama31_template("{{ currentDate }}"), _LLAMA3_STOPS, *_LLAMA3_SYSTEM, tools=True
    ),
}

# Text only each family's Jinja template contains (checked in order: Qwen3 before Qwen2.5, which shares its tool text).
_QWEN_TOOL_TEXT = "You are provided with function signatures within <tools></tools> XML tags"
_FINGERPRINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("smollm2", ("<|im_start|>", "The function signatures are within <tools></tools>", "<tool_response>")),
    ("qwen3", ("<|im_start|>", _QWEN_TOOL_TEXT, "<think>", "last_query_index", "reasoning_content")),
    ("qwen2.5", ("<|im_start|>", _QWEN_TOOL_TEXT, "You are Qwen, created by Alibaba Cloud")),
    (
        "llama3.1",
        (
            "<|start_header_id|>",
            "Environment: ipython",
            "Given the following functions, please respond with a JSON for a function call",
            "set tools_in_user_message = true",
        ),
    ),
)
_TOOL_MARKERS = re.compile(r"\btools\b|\btool_calls\b|<tool_call>|\bipython\b")
_LLAMA31_DATE = re.compile(r"""set date_string = ["']([\w ,.-]+)["']""")


def handles_tools(chat_template: str) -> bool:
    """Whether a Jinja chat template renders tool definitions or calls (it mentions `tools`, `tool_calls`, ...)."""
    return bool(_TOOL_MARKERS.search(chat_template))


def _tool_family(chat_template: str) -> ChatFormat | None:
    for name, markers in _FINGERPRINTS:
        if not all(marker in chat_template for marker in markers):
            continue
        if name != "llama3.1":
            return FORMATS[name]
        if "strftime_now" in chat_template:
            return FORMATS["llama3.2"]
        found = _LLAMA31_DATE.search(chat_template)
        if found is None:
            return None  # no date flowrl can reproduce
        date = found.group(1)
        return dataclasses.replace(FORMATS["llama3.1"], template=llama31_template(date))
    return None


def detect_format(chat_template: str | None) -> ChatFormat:
    """The ChatFormat a Jinja chat template writes, or TemplateConversionError naming the supported ones.

    A template that handles tools but matches no tool-aware family gets the plain ChatML / Llama 3 format (its
    `tools` is False): `missing_tool_support` says so, and the caller decides whether that is an error.
    """
    if not chat_template:
        raise TemplateConversionError("the tokenizer has no chat_template: nothing to convert into an Ollama TEMPLATE")
    if handles_tools(chat_template):
        family = _tool_family(chat_template)
        if family is not None:
            return family
    if "<|im_start|>" in chat_template and "<|im_end|>" in chat_template:
        return FORMATS["chatml"]
    if "<|start_header_id|>" in chat_template and "<|eot_id|>" in chat_template:
        return FORMATS["llama3"]
    raise TemplateConversionError(
        "this chat template is neither ChatML (<|im_start|>) nor Llama 3 (<|start_header_id|>); flowrl converts only "
        "those two into Ollama's Go template syntax. Write TEMPLATE by hand, or leave it out and let Ollama use the "
        "template stored in the GGUF file"
    )


def missing_tool_support(chat_template: str, fmt: ChatFormat) -> str | None:
    """Why `fmt` would lose the tool handling `chat_template` has, or None when nothing is lost."""
    if fmt.tools or not handles_tools(chat_template):
        return None
    tool_families = ", ".join(name for name, f in FORMATS.items() if f.tools)
    return (
        f"the chat template handles tools, but flowrl has no tool-aware Ollama template for it (it has them for "
        f"{tool_families}); the {fmt.name} TEMPLATE written renders plain conversations only, and Ollama will say "
        "the model 'does not support tools'. Fix: write a TEMPLATE that renders .Tools, .ToolCalls and tool "
        "results the way the chat template does, or train with one of those templates"
    )
