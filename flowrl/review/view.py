"""One trace as the review page shows it: turns, tool calls, rewards, answer, reference, tokens, time and cost.

Everything here is plain text; the templates escape it (Jinja2 autoescape) and show it in `<pre>` blocks, so
HTML, scripts, `javascript:` links and markdown images in a trace stay text. The transcript is read through
`flowrl.trace.transcript.normalize_message` (the one reader of the chat format); a trace without one gets the
synthesized conversation the dataset builders would use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from flowrl.trace.conversation import synthesize_messages
from flowrl.trace.facts import answer_text, label_at, reference, tool_calls
from flowrl.trace.schema import ExecutionTrace
from flowrl.trace.transcript import normalize_message

LONG_CHARS, LONG_LINES = 600, 12  # text longer than this is folded (`<details>`) with a preview
PREVIEW_CHARS = 160


@dataclass(slots=True)
class Block:
    """A piece of text, folded when long."""

    text: str

    @property
    def long(self) -> bool:
        return len(self.text) > LONG_CHARS or self.text.count("\n") >= LONG_LINES

    @property
    def preview(self) -> str:
        first = self.text[:PREVIEW_CHARS].replace("\n", " ")
        return f"{first}… ({len(self.text):,} characters)"


@dataclass(slots=True)
class Call:
    name: str
    call_id: str
    arguments: Block


@dataclass(slots=True)
class Turn:
    role: str
    name: str
    content: Block
    calls: list[Call] = field(default_factory=list)


@dataclass(slots=True)
class RewardLine:
    name: str
    value: str
    low: bool
    details: list[tuple[str, str]]


@dataclass
class TraceView:
    trace_id: str
    timestamp: str
    agent: str
    source: str
    query: str
    turns: list[Turn]
    synthesized: bool
    rewards: list[RewardLine]
    reward_score: str
    label: str
    notes: str
    answer: Block
    reference: Block | None
    numbers: list[tuple[str, str]]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)


def turns(trace: ExecutionTrace) -> tuple[list[Turn], bool]:
    """The transcript as turns, and whether it was synthesized from the logged tool calls."""
    synthesized = not trace.messages
    raw = synthesize_messages(trace) if synthesized else trace.messages
    out = []
    for message in raw:
        m = normalize_message(message)
        if m is None:
            continue
        calls = [
            Call(c["function"]["name"], str(c.get("id") or ""), Block(_text(c["function"]["arguments"])))
            for c in m.get("tool_calls") or ()
        ]
        out.append(Turn(m["role"], str(m.get("name") or ""), Block(m["content"]), calls))
    return out, synthesized


def _value(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def reward_lines(trace: ExecutionTrace) -> list[RewardLine]:
    names = list(trace.rewards) + [n for n in trace.reward_details if n not in trace.rewards]
    lines = []
    for name in names:
        value = trace.rewards.get(name)
        details = trace.reward_details.get(name) or {}
        pairs = [(str(k), _text(v)[:400]) for k, v in details.items()] if isinstance(details, dict) else []
        lines.append(RewardLine(name, _value(value), value is not None and value < 0.5, pairs))
    return lines


def numbers(trace: ExecutionTrace) -> list[tuple[str, str]]:
    """Tokens, latency, cost and calls: the trace's totals, else the sums over its LLM calls."""
    calls = trace.llm_calls
    tin = trace.total_tokens_in if trace.total_tokens_in is not None else sum(c.tokens_in or 0 for c in calls)
    tout = trace.total_tokens_out if trace.total_tokens_out is not None else sum(c.tokens_out or 0 for c in calls)
    latency = sum(c.latency_ms or 0.0 for c in calls)
    out = [("tokens in", f"{tin:,}"), ("tokens out", f"{tout:,}")]
    if trace.execution_duration_ms is not None:
        out.append(("duration", f"{trace.execution_duration_ms / 1000:.2f} s"))
    if latency:
        out.append(("LLM latency", f"{latency / 1000:.2f} s"))
    out.append(("cost", "–" if trace.total_cost is None else f"${trace.total_cost:.4f}"))
    out.append(("LLM calls", str(trace.llm_calls_count if trace.llm_calls_count is not None else len(calls))))
    # the calls every reward reads (flowrl.trace.facts.tool_calls: the recorded ones and the transcript's, control
    # tools such as final_answer left out), not only the `tool_calls` field
    out.append(("tool calls", str(len(tool_calls(trace)))))
    return out


def label_text(trace: ExecutionTrace) -> str:
    label, source = label_at(trace)
    if label is None:
        return "none"
    return f"{'good' if label else 'bad'} ({source})"


def trace_view(trace: ExecutionTrace) -> TraceView:
    ts, synthesized = turns(trace)
    ref = reference(trace).answer
    return TraceView(
        trace_id=trace.trace_id,
        timestamp=trace.timestamp,
        agent=trace.agent_name or "",
        source=trace.source,
        query=trace.user_query,
        turns=ts,
        synthesized=synthesized,
        rewards=reward_lines(trace),
        reward_score=_value(trace.reward_score),
        label=label_text(trace),
        notes=trace.review_notes,
        answer=Block(answer_text(trace)),
        reference=None if ref is None else Block(str(ref)),
        numbers=numbers(trace),
    )
