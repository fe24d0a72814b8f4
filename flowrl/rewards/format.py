"""FormatComplianceReward: is the answer clean, and are the tool calls well formed?

A turn is one of two kinds:
- a **tool-call turn**: the model asked for tools and said nothing else. That is a turn with structured
  `tool_calls` and no text, or a turn whose text is only tool-call markup that parses (`parse_tool_markup`):
  Hermes/Qwen `<tool_call>{json}</tool_call>` (what flowrl's example agent writes; the closing tag may be
  missing at the very end, as a stop string leaves it), Qwen3-Coder `<tool_call><function=f><parameter=k>…`,
  Llama `<|python_tag|>{json}` and `<function=f>{json}</function>`, Mistral `[TOOL_CALLS][{json}]` and
  `[TOOL_CALLS]f[ARGS]{json}`, or a bare `{"name": …, "arguments": {…}}`. It is judged on its calls alone;
- an **answer**: anything else. Its text is checked for leaks.

Checks (each passes or fails; the value is the share that pass):
- `non_empty` (answers): the answer (`final_response`, else the `final_answer` call's answer, else the last
  assistant text) is not blank. A blank answer scores 0 whatever else passes;
- `no_leaked_tags` (answers): no reasoning or chat-template markup outside code: `<think>`, `<thinking>`,
  `<reasoning>`, `<|im_start|>`-style special tokens, `[INST]`;
- `no_raw_tool_markup` (answers): no tool-call syntax in the prose (`<tool_call>`, `<function=…>`,
  `[TOOL_CALLS]`, `<|python_tag|>`, `{"name": …, "arguments": …}`): a call written into an answer is a leak;
- `json_arguments`: the share of the turn's tool calls that are well formed: structured calls whose
  arguments are a JSON object, and calls written as markup that parse into a name and a JSON-object
  arguments (a missing `arguments` means none, as the example agent reads it). Markup that does not parse
  (broken JSON, no name) is a malformed call, so a turn of broken markup scores 0.

None when there is neither an answer nor a tool call to look at; an empty trace is not judged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.syntax import check_json_object
from flowrl.rewards.views import answer_text, message_tool_calls, strip_code, tool_calls
from flowrl.trace.schema import ExecutionTrace

LEAK_TAGS = ("think", "thinking", "reasoning", "reflection", "scratchpad", "analysis")
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]{2,40}\|>|\[/?INST\]|<<SYS>>|</?s>")
_TOOL_MARKUP = re.compile(
    r"</?tool_call>|</?tool_calls>|</?function_calls?>|<function=[\w.\-]+>|</?tool_response>|\[TOOL_CALLS\]"
    r"|<\|python_tag\|>|<\|tool_call[a-z_]*\|>"
    r"""|\{\s*"name"\s*:\s*"[\w.\-]+"\s*,\s*"(arguments|parameters)"\s*:""",
    re.IGNORECASE,
)
# Where a call written as text starts; `parse_tool_markup` reads what follows each.
_OPENER = re.compile(r"<tool_call>|<\|python_tag\|>|\[TOOL_CALLS\]|<function=([\w.\-]+)>", re.IGNORECASE)
_CODE = re.compile(r"```[^\n]*\n.*?```|`[^`\n]*`", re.DOTALL)  # markup inside code is not a call
_XML_FUNCTION = re.compile(r"\s*<function=([\w.\-]+)>(.*?)</function>\s*", re.DOTALL)
_XML_PARAMETER = re.compile(r"\s*<parameter=([\w.\-]+)>\n?(.*?)\n?</parameter>\s*", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\][\w\-]+)?\[ARGS\]")
_LLAMA_END = re.compile(r"<\|eom_id\|>|<\|eot_id\|>")


@dataclass(slots=True)
class MarkupCall:
    """One tool call the model wrote as text."""

    name: str | None  # None: no name could be read
    arguments: dict[str, Any] | None  # None: the arguments are not a JSON object
    raw: str

    @property
    def well_formed(self) -> bool:
        return bool(self.name) and self.arguments is not None


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in `text` (separated by blanks, `;` or `,`), lists flattened; None if any part is not JSON."""
    decoder, i = json.JSONDecoder(), 0
    out: list[Any] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out or None
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.extend(value if isinstance(value, list) else [value])


def _call(value: Any, raw: str, *, need_arguments: bool = False) -> MarkupCall:
    """A call from one parsed JSON value: {"name", "arguments" | "parameters"}, or OpenAI's {"function": {…}}."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict):
        return MarkupCall(None, None, raw)
    name = value.get("name")
    name = name.strip() if isinstance(name, str) and name.strip() else None
    has_args = "arguments" in value or "parameters" in value
    args = value.get("arguments", value.get("parameters", None if need_arguments else {}))
    if isinstance(args, str):  # arguments sent as a JSON string, as the OpenAI API does
        args = (json.loads(args) if args.strip() else {}) if check_json_object(args) is None else None
    if need_arguments and not has_args:
        name = None
    return MarkupCall(name, args if isinstance(args, dict) else None, raw)


def _calls_in(body: str, raw: str) -> list[MarkupCall]:
    values = _json_values(body)
    if values is None:
        return [MarkupCall(None, None, raw)]
    return [_call(v, raw) for v in values]


def _until(text: str, start: int, closing: str) -> tuple[str, int]:
    """The text from `start` to the closing tag (or to the end when it is missing), and where the block ends."""
    close = text.lower().find(closing, start)
    if close < 0:
        return text[start:], len(text)
    return text[start:close], close + len(closing)


def _read_block(text: str, m: re.Match[str]) -> tuple[list[MarkupCall], int]:
    """The calls of the markup block opened by `m`, and where the block ends."""
    opener, start = m.group(0).lower(), m.end()
    if opener == "<tool_call>":
        body, end = _until(text, start, "</tool_call>")
        raw = text[m.start() : end]
        xml = _XML_FUNCTION.fullmatch(body)
        if xml is None:
            return _calls_in(body, raw), end
        params = _XML_PARAMETER.findall(xml.group(2))
        ok = _XML_PARAMETER.sub("", xml.group(2)).strip() == ""
        return [MarkupCall(xml.group(1), dict(params) if ok else None, raw)], end
    if opener.startswith("<function="):
        body, end = _until(text, start, "</function>")
        raw = text[m.start() : end]
        values = _json_values(body)
        args = values[0] if values and len(values) == 1 and isinstance(values[0], dict) else None
        return [MarkupCall(m.group(1), args, raw)], end
    if opener == "<|python_tag|>":
        stop = _LLAMA_END.search(text, start)
        end = len(text) if stop is None else stop.end()
        body = text[start : len(text) if stop is None else stop.start()]
        return _calls_in(body, text[m.start() : end]), end
    # [TOOL_CALLS]: a JSON list of calls, or `name[ARGS]{json}` repeated
    decoder, i, calls = json.JSONDecoder(), start, []
    while True:
        j = i
        while j < len(text) and text[j].isspace():
            j += 1
        named = _MISTRAL_NAMED.match(text, j)
        try:
            value, k = decoder.raw_decode(text, named.end() if named else j)
        except ValueError:
            break
        if named:
            calls.append(MarkupCall(named.group(1), value if isinstance(value, dict) else None, text[j:k]))
        else:
            calls.extend(_call(v, text[j:k]) for v in (value if isinstance(value, list) else [value]))
        i = k
    if not calls:
        return [MarkupCall(None, None, text[m.start() :])], len(text)
    return calls, i


def parse_tool_markup(text: str) -> tuple[list[MarkupCall], str]:
    """The tool calls written as text in `text`, and the text left around them.

    Markup inside code blocks and inline code is not a call. A bare JSON call (`{"name": …, "arguments": …}`,
    or a list of them) counts only when it is the whole text: in prose it is an answer quoting a call.
    """
    text = text or ""
    code = [c.span() for c in _CODE.finditer(text)]
    calls: list[MarkupCall] = []
    rest: list[str] = []
    pos = 0
    for m in _OPENER.finditer(text):
        if m.start() < pos or any(a <= m.start() < b for a, b in code):
            continue
        found, end = _read_block(text, m)
        calls.extend(found)
        rest.append(text[pos : m.start()])
        pos = end
    rest.append(text[pos:])
    if not calls and text.strip()[:1] in ("{", "["):
        values = _json_values(text.strip())
        if values and all(isinstance(v, dict) and ("name" in v or "function" in v) for v in values):
            return [_call(v, text.strip(), need_arguments=True) for v in values], ""
    return calls, "".join(rest)


def _ends_with_tool_call(trace: ExecutionTrace) -> bool:
    """The transcript's last word is the model asking for a tool: that turn has no answer to judge."""
    for msg in reversed(trace.messages):
        if isinstance(msg, dict) and msg.get("role") in ("assistant", "tool"):
            calls = (msg.get("tool_calls") or []) if msg.get("role") == "assistant" else []
            names = {(c.get("function") or {}).get("name") for c in calls if isinstance(c, dict)}
            return bool(calls) and "final_answer" not in names
    return False


def _structured_arguments(trace: ExecutionTrace) -> list[tuple[bool, str]]:
    """(arguments are a JSON object, what they were) for each structured call whose arguments can be seen."""
    in_messages = [fn.get("arguments") for fn, _ in message_tool_calls(trace)]
    if in_messages:
        out = []
        for a in in_messages:
            if isinstance(a, str):
                out.append((check_json_object(a) is None, a[:80]))
            elif a is not None:  # TRL's tool loop hands dicts: a JSON object when it is a dict
                out.append((isinstance(a, dict), repr(a)[:80]))
        return out
    strs = [c.arguments for c in tool_calls(trace) if isinstance(c.arguments, str) and c.arguments.strip()]
    return [(check_json_object(a) is None, a[:80]) for a in strs]


class FormatComplianceReward(Reward):
    name = "format"

    def __init__(
        self, leak_tags: list[str] | tuple[str, ...] = LEAK_TAGS, allow_tags: list[str] | tuple[str, ...] = ()
    ) -> None:
        tags = [t for t in leak_tags if t not in set(allow_tags)]
        alternatives = "|".join(map(re.escape, tags))
        self._leak = re.compile(rf"</?({alternatives})\b[^>]*>", re.IGNORECASE) if tags else None
        allowed = "|".join(map(re.escape, allow_tags))
        self._allowed_block = (
            re.compile(rf"<({allowed})\b[^>]*>.*?</\1>", re.IGNORECASE | re.DOTALL) if allow_tags else None
        )

    def score(self, trace: ExecutionTrace) -> RewardResult:
        answer = answer_text(trace)
        written, prose = parse_tool_markup(answer)
        arguments = _structured_arguments(trace)
        if not answer.strip() and not arguments and not tool_calls(trace):
            return RewardResult(None, {"reason": "no answer and no tool calls to check"})

        checks: dict[str, float] = {}
        found: dict[str, Any] = {}
        if self._allowed_block is not None:  # an allowed reasoning block before the calls is part of the turn
            prose = self._allowed_block.sub("", prose)
        markup_turn = bool(written) and not prose.strip()
        only_calls = markup_turn or (not answer.strip() and _ends_with_tool_call(trace))
        if markup_turn:
            found["written_calls"] = [m.name for m in written][:10]
        if not only_calls:
            checks["non_empty"] = 1.0 if answer.strip() else 0.0
            text = strip_code(answer)
            markup = sorted({m.group(0) for m in _TOOL_MARKUP.finditer(text)})
            leaks = sorted(
                (
                    {m.group(0) for m in (self._leak.finditer(text) if self._leak else ())}
                    | {m.group(0) for m in _SPECIAL_TOKEN.finditer(text)}
                )
                - set(markup)
            )
            checks["no_leaked_tags"] = 0.0 if leaks else 1.0
            checks["no_raw_tool_markup"] = 0.0 if markup else 1.0
            if leaks:
                found["leaked_tags"] = leaks[:10]
            if markup:
                found["raw_tool_markup"] = markup[:10]
        judged = arguments + [(m.well_formed, m.raw[:80]) for m in written]
        if judged:
            bad = [raw for ok, raw in judged if not ok]
            checks["json_arguments"] = 1 - len(bad) / len(judged)
            if bad:
                found["invalid_arguments"] = bad[:5]
        if not checks:  # structured calls whose arguments were not recorded: nothing to judge
            return RewardResult(None, {"reason": "tool calls without recorded arguments"})

        details: dict[str, Any] = {"checks": checks, **found}
        if checks.get("non_empty") == 0.0:
            return RewardResult(0.0, details)
        return RewardResult(sum(checks.values()) / len(checks), details)
