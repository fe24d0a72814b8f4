"""Tool calls out of a reply's text, in the form the model's own chat template teaches it, as OpenAI `tool_calls`.

A chat template that renders tools also shows the model how to call one; the reply carries the call as text and
the server turns it back into the structured call an OpenAI client expects (vLLM's and llama-server's tool
parsers do the same job):

* `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (SmolLM2 with
  flowrl's template, Qwen2.5, Qwen3, Hermes and most ChatML fine-tunes). Qwen3's `<think>...</think>` is
  returned apart, as `reasoning_content`.
* `llama3`: the whole reply is `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3's JSON tool calling),
  optionally after `<|python_tag|>`.

A reply whose call does not parse (cut off by max_tokens, not JSON, no name) is returned as text, unchanged,
and counted: the client sees what the model wrote, never a call the model did not make.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

STYLES = ("hermes", "llama3")

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def style_of(chat_template: str | None) -> str | None:
    """The tool-call style a Jinja chat template teaches, or None when it teaches none."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|start_header_id|>" in chat_template and '"parameters"' in chat_template:
        return "llama3"
    return None


@dataclass
class ParsedReply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    unparsed: str | None = None  # why a reply that looked like a tool call was returned as text


def _call(name: Any, arguments: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _hermes(text: str) -> ParsedReply:
    rest = _HERMES.sub("", text).strip()
    if "<tool_call>" in rest:
        return ParsedReply(text, unparsed="a <tool_call> block without its </tool_call> (cut off?)")
    calls = []
    for block in _HERMES.findall(text):
        try:
            data = json.loads(block)
        except ValueError:
            return ParsedReply(text, unparsed=f"a <tool_call> block that is not JSON: {block[:80]!r}")
        call = _call(data.get("name"), data.get("arguments", {})) if isinstance(data, dict) else None
        if call is None:
            why = f"a <tool_call> block without a name and object arguments: {block[:80]!r}"
            return ParsedReply(text, unparsed=why)
        calls.append(call)
    return ParsedReply(rest or None, calls) if calls else ParsedReply(text)


def _llama3(text: str) -> ParsedReply:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedReply(text)
    try:
        data = json.loads(body)
    except ValueError:
        return ParsedReply(text, unparsed="a reply that starts like a JSON tool call but is not JSON")
    call = _call(data.get("name"), data.get("parameters", data.get("arguments"))) if isinstance(data, dict) else None
    if call is None:
        return ParsedReply(text, unparsed="a JSON reply without a name and object parameters")
    return ParsedReply(None, [call])


def parse_reply(text: str, style: str | None) -> ParsedReply:
    """Split a reply into text, tool calls and (Qwen3) reasoning, by the template's `style`."""
    reasoning = None
    think = _THINK.match(text)
    if think:
        reasoning, text = think.group(1).strip() or None, text[think.end() :]
    if style == "hermes":
        parsed = _hermes(text)
    elif style == "llama3":
        parsed = _llama3(text)
    else:
        parsed = ParsedReply(text)
    parsed.reasoning = reasoning
    return parsed
