"""Build `ExecutionTrace`s from a checkpoint turn, an obs/live run segment, or both joined.

Field sources:

| field | from |
|---|---|
| `user_query` | the turn's user message; for auto-resumed segments the follow-up after the resume marker |
| `final_response` | the checkpoint's final assistant message, else the segment's `final_answer` argument, else \
the obs `final_answer_summary` |
| `messages` | the run transcript up to the end of the segment (OpenAI format, \
`flowrl.trace.transcript.canonical_messages`); without an obs/live file, `[user, assistant]` |
| `tool_calls` | transcript calls paired with obs records: full arguments and results from the transcript, \
duration, time and status from the record; `success` is honest (`flowrl.trace.facts.tool_failed`, obs \
`status == "error"`) |
| `reasoning_steps` | `think` calls (`THOUGHT: ...` / `ASSESSMENT: ...`), as toolboxv2's rl module writes them |
| `success` | what the run said about itself (`flowrl.trace.facts.reported_success`, as capture decides it): false \
for an error answer (`Error: ...`), else `final_answer(success=...)` (obs `success` for the last segment); null \
without either |
| `facts` | `flowrl.trace.facts.trace_facts`, once the trace is redacted (`flowrl.ingest.engine`) |
| tokens, `llm_calls`, duration | the segment's obs steps (only the last LLM call of each step is recorded); \
null without obs |
| `timestamp` | the segment's first step, else the obs run start; from chat_history alone, the V1 message's \
time when it is a real one, else the checkpoint's (`checkpoint.checkpoint_time`) |

`final_answer` is not a tool call here (its arguments are the answer); `think` is a reasoning step.
Checkpoint `statistics` are lifetime totals and are never spread over turns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from flowrl.ingest.checkpoint import ChatTurn, Checkpoint
from flowrl.ingest.obs import RunView
from flowrl.ingest.times import epoch_time, valid_time
from flowrl.ingest.transcript import FINAL_ANSWER, THINK, Segment
from flowrl.trace.facts import reported_success, tool_failed
from flowrl.trace.schema import ExecutionTrace, LLMCall, ReasoningStep, Source, ToolCallTrace
from flowrl.trace.transcript import canonical_messages, parse_arguments

_ERROR_CHARS = 500


ts = epoch_time  # an obs epoch as ISO time (None: not a time)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _tools(seg: Segment) -> tuple[list[ToolCallTrace], list[ReasoningStep]]:
    calls: list[ToolCallTrace] = []
    reasoning: list[ReasoningStep] = []
    for call in seg.calls:
        if call.name == FINAL_ANSWER:
            continue
        rec = call.record or {}
        result = call.result if call.result is not None else str(rec.get("result_summary") or "")
        args = parse_arguments(call.arguments if call.arguments else rec.get("args_summary", ""))
        if call.name == THINK:
            thought = args.get("thought", "") if isinstance(args, dict) else str(args)
            reasoning.append(
                ReasoningStep(step_type="internal_reasoning", content=f"THOUGHT: {thought}\nASSESSMENT: {result}")
            )
            continue
        failed = bool(tool_failed(result, success=False if rec.get("status") == "error" else None))
        duration = _num(rec.get("duration_s"))
        calls.append(
            ToolCallTrace(
                tool_name=call.name,
                arguments=args,
                result=result,
                success=not failed,
                duration_ms=round((duration or 0.0) * 1000.0, 3),
                error=(str(rec.get("error") or "") or result[:_ERROR_CHARS]) if failed else None,
                timestamp=ts(rec.get("t_start")) or "",
                call_id=call.call_id or None,
            )
        )
    return calls, reasoning


def _llm(seg_steps: list[dict[str, Any]]) -> list[LLMCall]:
    out = []
    for step in seg_steps:
        llm = step.get("llm")
        if not isinstance(llm, dict):
            continue
        latency = _num(llm.get("duration_s"))
        out.append(
            LLMCall(
                model=llm.get("model") or None,
                tokens_in=_int(llm.get("tokens_in")),
                tokens_out=_int(llm.get("tokens_out")),
                latency_ms=None if latency is None else round(latency * 1000.0, 3),
                output=llm.get("output_text"),
            )
        )
    return out


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


class _Tasks(TypedDict):
    """The `ExecutionTrace` task fields `_tasks` fills."""

    tasks_created: list[dict[str, Any]]
    tasks_completed: list[dict[str, Any]]
    tasks_failed: list[dict[str, Any]]


def _tasks(
    run_id: str | None, query: str, success: bool | None, answer: str, iterations: int | None, status: str | None
) -> _Tasks:
    """toolboxv2's rl-module task fields, so its rewards find what they look for."""
    task = {"task_id": run_id or "", "type": "execution_run", "description": query}
    out: _Tasks = {"tasks_created": [{**task, "timestamp": ""}], "tasks_completed": [], "tasks_failed": []}
    done = {**task, "status": status or "completed", "iterations": iterations}
    if success is True:
        out["tasks_completed"].append({**done, "result": answer})
    elif success is False:
        out["tasks_failed"].append({**done, "error": answer})
    return out


def from_segment(
    run: RunView,
    seg: Segment,
    *,
    trace_id: str,
    source: Source,
    query: str,
    answer: str | None,
    checkpoint: Checkpoint | None = None,
    turn: ChatTurn | None = None,
) -> ExecutionTrace:
    single = len(run.segments) == 1
    steps = seg.steps if seg.steps is not None else []
    llm_calls = _llm(steps)
    tool_calls, reasoning = _tools(seg)
    data = run.data
    finished = seg.answer is not None and (run.finished or seg.index < len(run.segments) - 1)
    status = "completed" if finished else run.status
    final = answer if answer is not None else (seg.answer or "")
    success = reported_success(
        answers=(final, seg.answer), status=status, final_answer_success=seg.success if finished else None
    )
    if single and run.finished:
        tokens_in, tokens_out = _int(data.get("total_tokens_in")), _int(data.get("total_tokens_out"))
        duration = _num(data.get("duration_s"))
        duration_ms = None if duration is None else round(duration * 1000.0, 3)
    else:
        tokens_in = _sum([c.tokens_in for c in llm_calls])
        tokens_out = _sum([c.tokens_out for c in llm_calls])
        starts = [_num(s.get("t_start")) for s in steps]
        ends = [_num(s.get("t_end")) for s in steps]
        known_s, known_e = [v for v in starts if v], [v for v in ends if v]
        duration_ms = round((max(known_e) - min(known_s)) * 1000.0, 3) if known_s and known_e else None
    first_step = next((_num(s.get("t_start")) for s in steps if _num(s.get("t_start"))), None)
    timestamp = (
        ts(first_step)
        or (ts(data.get("t_start")) if seg.index == 0 else None)
        or (checkpoint.timestamp if checkpoint else None)
    )
    meta: dict[str, Any] = {
        "segment": seg.index,
        "segments": len(run.segments),
        "auto_resumed": seg.index > 0,
        "transcript": run.transcript_source,
        run.kind + "_file": run.path.name,
    }
    for key in ("parent_run_id", "persona", "skills_matched", "files_modified"):
        if data.get(key):
            meta[key] = data[key]
    if run.bad_lines:
        meta["unreadable_lines"] = run.bad_lines
    if checkpoint is not None:
        meta["checkpoint"] = checkpoint.path.name
    if answer is not None and seg.answer is not None and answer.strip() != seg.answer.strip():
        meta["final_answer_argument"] = seg.answer
    trace = ExecutionTrace(
        trace_id=trace_id,
        session_id=(turn.session_id if turn else run.session_id) or "default",
        timestamp=timestamp or datetime.now().isoformat(),
        user_query=query,
        tool_calls=tool_calls,
        reasoning_steps=reasoning,
        final_response=final,
        total_tokens_in=tokens_in,
        total_tokens_out=tokens_out,
        execution_duration_ms=duration_ms,
        llm_calls_count=len(llm_calls) if steps else None,
        agent_name=(checkpoint.agent if checkpoint else run.agent),
        run_id=run.run_id,
        source=source,
        success=success,
        status=status,
        messages=canonical_messages(run.messages[: seg.end]),
        llm_calls=llm_calls,
        metadata={"flowagent": meta},
        **_tasks(run.run_id, query, success, final, len(steps) or None, status),
    )
    return trace


def from_chat(turn: ChatTurn, checkpoint: Checkpoint, *, trace_id: str) -> ExecutionTrace:
    """A turn known only from chat_history: text in, text out; no tools, tokens or success (an error answer
    aside: `flowrl.trace.facts.reported_success`)."""
    answer = turn.answer or ""
    meta: dict[str, Any] = {
        "checkpoint": checkpoint.path.name,
        "checkpoint_kind": checkpoint.kind,
        "transcript": "chat_history",
        "history_index": turn.index,
    }
    if turn.tool_messages:
        meta["tool_messages_in_history"] = turn.tool_messages
    return ExecutionTrace(
        trace_id=trace_id,
        session_id=turn.session_id or "default",
        timestamp=valid_time(turn.timestamp) or checkpoint.timestamp or datetime.now().isoformat(),
        user_query=turn.query,
        final_response=answer,
        agent_name=checkpoint.agent,
        run_id=turn.run_id,
        source="checkpoint",
        success=reported_success(answers=(answer,), status="completed"),
        status="completed",
        messages=[{"role": "user", "content": turn.query}, {"role": "assistant", "content": answer}],
        metadata={"flowagent": meta},
        **_tasks(turn.run_id, turn.query, None, answer, None, "completed"),
    )


def rejoined(stored: ExecutionTrace, run: RunView, seg: Segment, *, source: Source) -> ExecutionTrace:
    """The trace of a run segment whose id is already stored from a poorer file (`flowrl.ingest.upgrade`),
    built as if both files had been read together: a stored checkpoint turn lends its answer, its file name
    and `source="checkpoint"`, as `from_segment` joins a checkpoint turn to its run."""
    if stored.source != "checkpoint":
        return from_segment(run, seg, trace_id=stored.trace_id, source=source, query=seg.query or "", answer=None)
    trace = from_segment(
        run, seg, trace_id=stored.trace_id, source="checkpoint", query=seg.query or "", answer=stored.final_response
    )
    name = (stored.metadata.get("flowagent") or {}).get("checkpoint")
    if name:
        trace.metadata["flowagent"]["checkpoint"] = name
    return trace
