"""Rebuild a run's OpenAI-format transcript from obs steps and split it at auto-resume points.

An obs run file keeps, per step, the input messages of the step's *last* LLM call and the step's tool
records (docs/reference/flowagent-0.1.28.md §3.5). The working history is recovered as follows:

1. *main-loop inputs* are the steps whose input holds the run's query as a user message (a think
   sub-call's input does not);
2. the *anchor* is the main-loop input that holds the most tool calls (the latest view; the run-summary
   call at the last step, when it was recorded, holds them all);
3. the anchor is cut to start at the first message of the earliest main-loop input (dropping the
   summary call's own preamble) and to end after the last `final_answer` call (dropping its prompt);
4. per-call system messages (the dynamic tool-slot context FlowAgent re-inserts before each call, at a
   new place each time) are dropped: a system message is kept only when the previous main-loop input
   has it after the same message;
5. duplicate tool results (FlowAgent appends a think result twice under one id) are dropped
   (`flowrl.trace.transcript.dedup_tool_results`);
6. tool calls made by the last steps, which no recorded input shows yet, are appended from the
   step's tool records (assistant `tool_calls` + `tool` results, ids `obs-<step>-<n>`; a record's
   `args_summary` that parses is written back as JSON, `flowrl.trace.transcript.arguments_json`).

A live file's `ctx_snapshot.working_history` is the exact working history and is used as is (step 6
still adds what happened after the snapshot).

Auto-resume appends `system: "Continue with old task using new user information's"` and the new user
message to the same run's history; each such marker starts a new *segment* whose query is the user
message after it. Segment 0's query is the run's own query.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from flowrl.ingest.checkpoint import text_of
from flowrl.trace.transcript import (
    FINAL_ANSWER,
    arguments_json,
    dedup_tool_results,
    parse_arguments,
    tool_call_parts,
)
from flowrl.trace.transcript import (
    transcript_calls as _transcript_calls,
)

RESUME_MARKER = "Continue with old task"
THINK = "think"


def is_resume_marker(m: dict[str, Any]) -> bool:
    return m.get("role") == "system" and text_of(m.get("content")).startswith(RESUME_MARKER)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a.get("role") == b.get("role")
        and a.get("content") == b.get("content")
        and a.get("tool_calls") == b.get("tool_calls")
        and a.get("tool_call_id") == b.get("tool_call_id")
    )


def call_ids(msgs: list[dict[str, Any]]) -> list[str]:
    return [c.call_id for c in _transcript_calls(msgs) if c.call_id]


def _calls_final(m: dict[str, Any]) -> bool:
    return m.get("role") == "assistant" and any(
        tool_call_parts(tc)[0] == FINAL_ANSWER for tc in m.get("tool_calls") or []
    )


def _inputs(step: dict[str, Any]) -> list[dict[str, Any]]:
    llm = step.get("llm") if isinstance(step.get("llm"), dict) else None
    msgs = (llm or {}).get("input_messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []


def _is_main(msgs: list[dict[str, Any]], query: str) -> bool:
    return any(m.get("role") == "user" and text_of(m.get("content")) == query for m in msgs) or any(
        is_resume_marker(m) for m in msgs
    )


def _drop_per_call_system(anchor: list[dict[str, Any]], previous: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out = []
    last_user = max((i for i, m in enumerate(anchor) if m.get("role") == "user"), default=-1)
    for i, m in enumerate(anchor):
        if i == 0 or m.get("role") != "system" or is_resume_marker(m):
            out.append(m)
            continue
        pred = anchor[i - 1]
        if previous is not None:
            stable = any(_same(p, m) and j > 0 and _same(previous[j - 1], pred) for j, p in enumerate(previous))
        else:  # one main-loop input only: the slot context sits right before the last user message or at the end
            stable = not (i + 1 == last_user or i == len(anchor) - 1)
        if stable:
            out.append(m)
    return out


def from_steps(steps: list[dict[str, Any]], query: str) -> list[dict[str, Any]]:
    """Steps 1-5 of the module docstring: the working history the recorded inputs show."""
    mains = [(i, msgs) for i, step in enumerate(steps) if (msgs := _inputs(step)) and _is_main(msgs, query)]
    if not mains:
        return [{"role": "user", "content": query}]
    first = mains[0][1][0]
    pos, (anchor_step, anchor) = max(enumerate(mains), key=lambda t: (len(set(call_ids(t[1][1]))), t[0]))
    start = next((i for i, m in enumerate(anchor) if _same(m, first)), 0)
    msgs = anchor[start:]
    finals = [i for i, m in enumerate(msgs) if _calls_final(m)]
    if finals and not any(is_resume_marker(m) for m in msgs[finals[-1] :]):
        msgs = msgs[: finals[-1] + 1]  # what follows the run's last final_answer is the summary call's prompt
    previous = mains[pos - 1][1] if pos > 0 else None
    return dedup_tool_results(_drop_per_call_system(msgs, previous))


# ---------------------------------------------------------------------------------------------
# tool records <-> transcript calls


@dataclass
class Call:
    """One tool call in the transcript, with its obs record when there is one."""

    call_id: str
    name: str
    arguments: str
    message_index: int
    result: str | None = None
    record: dict[str, Any] | None = None


def step_records(steps: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(step position, tool record), without the duplicate think record FlowAgent writes after each think."""
    out: list[tuple[int, dict[str, Any]]] = []
    for pos, step in enumerate(steps):
        for rec in step.get("tool_calls") or []:
            if not isinstance(rec, dict):
                continue
            if (
                rec.get("name") == THINK
                and not rec.get("args_summary")
                and out
                and out[-1][1].get("name") == THINK
                and out[-1][1].get("result_summary") == rec.get("result_summary")
            ):
                continue
            out.append((pos, rec))
    return out


def transcript_calls(msgs: list[dict[str, Any]]) -> list[Call]:
    """The transcript's tool calls (`flowrl.trace.transcript.transcript_calls`), ready to pair with obs records."""
    return [
        Call(c.call_id or "", c.name, c.arguments if c.arguments is not None else "", c.message_index, c.result)
        for c in _transcript_calls(msgs)
    ]


def _record_arguments(summary: Any) -> str:
    """An obs record's `args_summary` as tool-call arguments: as written when it is JSON (or not a value at
    all), JSON text when it is a Python repr (FlowAgent writes think's that way)."""
    text = summary if isinstance(summary, str) else ""
    try:
        json.loads(text)
        return text
    except ValueError:
        parsed = parse_arguments(text)
        return text if isinstance(parsed, str) else arguments_json(parsed)


def _pair(calls: list[Call], records: list[tuple[int, dict[str, Any]]]) -> tuple[dict[int, int], int, int]:
    """In-order matching by tool name. Returns {call index: record index}, and how far the records and
    the calls were consumed. A record with no call of its name among the next few is passed over."""
    pairs: dict[int, int] = {}
    ci = ri = 0
    while ri < len(records) and ci < len(calls):
        name = records[ri][1].get("name")
        k = next((k for k in range(ci, min(ci + 4, len(calls))) if calls[k].name == name), None)
        if k is not None:
            pairs[k] = ri
            ci = k + 1
        ri += 1
    return pairs, ri, ci


def attach_records(msgs: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append the tool calls that obs records show after the last call the transcript has (step 6)."""
    calls = transcript_calls(msgs)
    records = step_records(steps)
    _, ri, ci = _pair(calls, records)
    tail = records[ri:] if ci >= len(calls) else []
    if not tail:
        return msgs
    msgs = list(msgs)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for pos, rec in tail:
        by_step.setdefault(pos, []).append(rec)
    for pos, recs in by_step.items():
        step_id = steps[pos].get("step_id", pos + 1)
        tcs = []
        results = []
        for n, rec in enumerate(recs):
            cid = f"obs-{step_id}-{n}"
            name = str(rec.get("name") or "")
            tcs.append(
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": _record_arguments(rec.get("args_summary"))},
                }
            )
            if name != FINAL_ANSWER:
                results.append(
                    {"role": "tool", "tool_call_id": cid, "name": name, "content": str(rec.get("result_summary") or "")}
                )
        msgs.append({"role": "assistant", "content": None, "tool_calls": tcs})
        msgs.extend(results)
    return msgs


def calls_with_records(msgs: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[Call]:
    """Transcript calls, each paired with its obs record when one matches."""
    calls = transcript_calls(msgs)
    records = step_records(steps)
    pairs, _, _ = _pair(calls, records)
    for k, ri in pairs.items():
        calls[k].record = records[ri][1]
    return calls


# ---------------------------------------------------------------------------------------------
# segments


@dataclass
class Segment:
    index: int
    query: str | None
    start: int  # transcript slice [start:end]
    end: int
    answer: str | None = None
    success: bool | None = None
    steps: list[dict[str, Any]] | None = None  # obs steps of this segment (None: cannot be told apart)
    calls: list[Call] = field(default_factory=list)


def segments(msgs: list[dict[str, Any]], query: str) -> list[Segment]:
    """Split a transcript at resume markers; each segment's answer is its last final_answer call."""
    bounds = [0] + [i for i, m in enumerate(msgs) if is_resume_marker(m)] + [len(msgs)]
    out = []
    for k in range(len(bounds) - 1):
        start, end = bounds[k], bounds[k + 1]
        if k == 0:
            seg_query: str | None = query
        else:
            seg_query = next((text_of(m.get("content")) for m in msgs[start:end] if m.get("role") == "user"), None)
        seg = Segment(k, seg_query, start, end)
        for m in msgs[start:end]:
            if not _calls_final(m):
                continue
            for tc in m.get("tool_calls") or []:
                name, raw, _ = tool_call_parts(tc)
                if name == FINAL_ANSWER:
                    args = parse_arguments(raw)
                    if isinstance(args, dict) and isinstance(args.get("answer"), str):
                        seg.answer = args["answer"]
                        seg.success = args.get("success") if isinstance(args.get("success"), bool) else None
        out.append(seg)
    return out


def split_steps(steps: list[dict[str, Any]], n_segments: int) -> list[list[dict[str, Any]] | None]:
    """Obs steps per segment, split at `is_resume_point` steps; None each when the counts disagree."""
    parts: list[list[dict[str, Any]]] = [[]]
    for step in steps:
        if step.get("is_resume_point"):
            parts.append([])
            continue
        parts[-1].append(step)
    if len(parts) != n_segments:
        return [None] * n_segments
    return list(parts)
