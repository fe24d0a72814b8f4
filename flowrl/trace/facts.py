"""Trace facts: the one place that decides what a trace means.

Capture, ingest, the rewards, the dataset builders, the judge, the report and eval all ask this module, so a
trace means the same thing to each of them. The rules, one each:

1. **A tool call failed** (`tool_failed`) when the framework said so (`success` false), when it carries an
   error, or when its result is a failure whatever the framework said (`result_failed`): text that starts
   with `Error`/`System-Error`, a Python traceback anywhere (FlowAgent's `exec_code` reports
   `{'success': True, ...}` for code that raised), a dict with `success: False`, or the text of one
   (`"{'success': False, ...}"`: exec_code's own failure shape), or TRL's `{'error': '...'}` for a tool
   that raised. A call without a result, flag or error cannot be judged (None). The calls of a trace
   (`tool_calls`) are its logged `tool_calls` plus the transcript's calls that no entry records, one per
   call id; `final_answer` steers the loop and is not counted as a tool.
2. **The run's outcome** (`run_outcome`), first match wins: the host's `success` (`flowrl.trace.outcomes`, said
   during the run or later); an error answer (`Error:`, `Error executing`, `System-Error`, after any leading
   `<think>` block) -> 0; a failed status (`max_iterations`, `cancelled`, `failed`, `error`) -> 0, an
   unfinished one (`running`, `paused`) -> None; the `final_answer` call's own `success` flag; the trace's
   `success`; toolboxv2's `tasks_completed` vs `tasks_failed` -> their share; status `completed` with an answer
   -> 1; else None. What a run reported about itself (the error answer to the trace's `success`) is what
   capture stores as `success` (`reported_success`).
3. **The task key** (`task_key`): the host's `group_key` when set, else the user turn after `query_key`
   (case, runs of spaces and trailing `.?!` ignored): "What is 2+2?" and "what is 2+2" are one task.
4. **The reference answer** (`reference`): the host's outcome's reference, else the first of `REFERENCE_KEYS`
   set in the trace's metadata, else in the dataset columns a fresh completion carries
   (`metadata.grpo_columns`). A value a dataset builder took from another run's answer
   (`reference_source == "best_trace"`) is a guess, never a reference.
5. **The label** (`label_at`): a manual label always wins; then the host's `success`; else, with a score,
   the run is good when the score reaches the threshold (`DEFAULT_THRESHOLD`, 0.6, unless one is given) and
   no correctness reward (`CORRECTNESS`) is 0; a label the engine stored stands when no threshold is asked
   for.

Capture and ingest store the facts on the trace (`ExecutionTrace.facts`, schema version 3; older files get
them on upgrade); a trace without them (one built in memory: a fresh GRPO completion, an eval answer) gets
them decided on the spot by the same rules. The run's facts (outcome, tool tallies) are read back from the
stored copy; the task's facts (key, reference) come from fields the host may set after the run
(`group_key`, `metadata`), so they are read from those fields and refreshed in the stored copy whenever the
trace is written (`ExecutionTrace.to_dict`). Labels depend on scores given later and are never stored here.

The stored shape (`TraceFacts`, `ToolTally`) is the schema's (`flowrl.trace.schema`); the rules that fill it
are here. The import runs one way: this module imports the schema, `flowrl.trace.transcript` and
`flowrl.trace.outcomes`; the schema imports no rule.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flowrl.trace.outcomes import HostVerdict, merge
from flowrl.trace.schema import ExecutionTrace, ToolTally, TraceFacts
from flowrl.trace.transcript import (
    FINAL_ANSWER,
    TranscriptCall,
    final_answer,
    is_synthesized,
    parse_arguments,
    transcript_calls,
)

# Tools that steer the agent loop rather than act on the world: not "tool calls" for success or budgets.
CONTROL_TOOLS: frozenset[str] = frozenset({FINAL_ANSWER})
ERROR_PREFIXES: tuple[str, ...] = ("Error:", "Error executing", "System-Error")
FAILED_STATUSES = frozenset({"max_iterations", "cancelled", "canceled", "failed", "error"})
UNFINISHED_STATUSES = frozenset({"running", "paused", "learning"})
# Where a host puts a task's reference answer (metadata) or a dataset row carries it (columns); first wins.
REFERENCE_KEYS: tuple[str, ...] = ("reference_answer", "expected_answer", "reference", "expected", "answer")
GUESSED_REFERENCE = "best_trace"  # reference_source of a reference taken from another run's answer
CORRECTNESS: tuple[str, ...] = ("reference_answer", "task_completion", "host_outcome")  # at 0, the run failed its task
DEFAULT_THRESHOLD = 0.6

_TOOL_ERROR_PREFIXES = ("Error", "System-Error")
_TRACEBACK = "Traceback (most recent call last)"
_DICT_FAILURE = re.compile(r"""["']success["']\s*:\s*(False|false)\b""")
_DICT_ERROR = re.compile(r"""^\{\s*["']error["']\s*:\s*["']""")  # TRL's tool loop: {'error': '...'}
_LEADING_REASONING = re.compile(r"^\s*<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_WS = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------
# 1. tool calls and their failure


def result_failed(result: Any) -> bool:
    """Is this tool result a failure, whatever the framework said? (rule 1; dicts judged as their repr too)"""
    if isinstance(result, Mapping) and result.get("success") is False:
        return True
    text = result if isinstance(result, str) else repr(result)
    head = text.lstrip()
    if head.startswith(_TOOL_ERROR_PREFIXES) or _TRACEBACK in text:
        return True
    return head.startswith("{") and (_DICT_FAILURE.search(head) is not None or _DICT_ERROR.match(head) is not None)


def tool_failed(result: Any = None, *, success: bool | None = None, error: Any = None) -> bool | None:
    """Did a tool call fail? None when there is nothing to judge by (no result, flag or error)."""
    if result is None and success is None and not error:
        return None
    if success is False or error:
        return True
    return result is not None and result_failed(result)


@dataclass
class ToolCallView:
    """One tool call, whichever field of the trace it came from."""

    name: str
    arguments: Any  # a dict when parsed, the raw string otherwise
    raw_arguments: str | None  # the JSON text the model wrote, when the transcript has it
    result: str | None  # None: no result recorded (e.g. a fresh completion that only asked for the call)
    success: bool | None  # the framework's own flag, when there is one
    error: str | None
    call_id: str | None

    @property
    def failed(self) -> bool | None:
        return tool_failed(self.result, success=self.success, error=self.error)

    def signature(self) -> str:
        """Name plus canonical arguments: equal for repeated identical calls."""
        args = self.arguments
        try:
            canon = json.dumps(args, sort_keys=True, default=str) if not isinstance(args, str) else args.strip()
        except (TypeError, ValueError):
            canon = repr(args)
        return f"{self.name}\x00{canon}"


def recorded_transcript(trace: ExecutionTrace) -> list[dict[str, Any]]:
    """The trace's messages when they are what the run said; [] when flowrl synthesised them."""
    return [] if is_synthesized(trace.metadata) else trace.messages


def _view(call: TranscriptCall) -> ToolCallView:
    raw = call.arguments
    return ToolCallView(
        call.name, parse_arguments(raw), raw if isinstance(raw, str) else None, call.result, None, None, call.call_id
    )


def _first_per_id(views: list[ToolCallView]) -> list[ToolCallView]:
    seen: set[str] = set()
    out = []
    for v in views:
        if v.call_id:
            if v.call_id in seen:
                continue
            seen.add(v.call_id)
        out.append(v)
    return out


def tool_calls(trace: ExecutionTrace, *, include_control: bool = False) -> list[ToolCallView]:
    """Every tool call of the trace, one per call id (FlowAgent records `think` twice).

    `tool_calls` when the trace has them (the framework's success flags and errors), plus the transcript's
    calls that no entry records (ingest keeps FlowAgent's `think` and `final_answer` out of `tool_calls`,
    capture keeps only `final_answer` out): matched by call id, else by name and arguments. When the
    transcript adds a call, the calls follow the transcript's order. Without `tool_calls`, the transcript's."""
    spoken = [_view(c) for c in transcript_calls(recorded_transcript(trace))]
    if not trace.tool_calls:
        views = _first_per_id(spoken)
    else:
        raw_by_id = {v.call_id: v.raw_arguments for v in spoken if v.call_id}
        logged = _first_per_id(
            [
                ToolCallView(
                    tc.tool_name,
                    parse_arguments(tc.arguments),
                    raw_by_id.get(tc.call_id) if tc.call_id else None,
                    tc.result,
                    tc.success,
                    tc.error or None,
                    tc.call_id,
                )
                for tc in trace.tool_calls
            ]
        )
        views = _merge(logged, _first_per_id(spoken), include_control)
    if include_control:
        return views
    return [v for v in views if v.name not in CONTROL_TOOLS]


def _merge(logged: list[ToolCallView], spoken: list[ToolCallView], include_control: bool) -> list[ToolCallView]:
    ids = {v.call_id for v in logged if v.call_id}
    anonymous = [v for v in logged if not v.call_id]
    extra: list[ToolCallView] = []
    for v in spoken:
        if v.call_id and v.call_id in ids:
            continue
        twin = next((a for a in anonymous if a.name == v.name and a.signature() == v.signature()), None)
        if twin is not None:
            anonymous.remove(twin)
            continue
        extra.append(v)
    if not any(include_control or v.name not in CONTROL_TOOLS for v in extra):
        return logged
    by_id = {v.call_id: v for v in logged if v.call_id}
    extra_ids = {id(v) for v in extra}
    ordered: list[ToolCallView] = []
    for v in spoken:
        if v.call_id and v.call_id in by_id:
            ordered.append(by_id.pop(v.call_id))
        elif id(v) in extra_ids:
            ordered.append(v)
    placed = {id(v) for v in ordered}
    return ordered + [v for v in logged if id(v) not in placed]


def tool_tallies(trace: ExecutionTrace) -> dict[str, ToolTally]:
    """Per tool name: the calls that could be judged and how many of them failed (`final_answer` left out)."""
    tallies: dict[str, ToolTally] = {}
    for view in tool_calls(trace):
        failed = view.failed
        if failed is None:
            continue
        tally = tallies.setdefault(view.name, ToolTally())
        tally.calls += 1
        tally.failed += failed
    return tallies


def final_answer_call(trace: ExecutionTrace) -> dict[str, Any] | None:
    """The arguments of the last `final_answer` call ({"answer", "success"}), if the agent made one."""
    for view in reversed(tool_calls(trace, include_control=True)):
        if view.name == FINAL_ANSWER:
            return view.arguments if isinstance(view.arguments, dict) else {"answer": str(view.arguments)}
    return None


def answer_text(trace: ExecutionTrace) -> str:
    """The agent's answer (`flowrl.trace.transcript.final_answer`): the final_answer call's answer, else
    `final_response`, else the last assistant text."""
    return final_answer(trace.messages, trace.final_response, call_args=final_answer_call(trace) or {})


# ---------------------------------------------------------------------------------------------
# 2. the run's outcome


@dataclass(slots=True)
class Outcome:
    """Did the task succeed: `value` 1 or 0, a share of sub-tasks, or None (cannot tell); `source` names the
    rule that decided (error_answer, status, unfinished, final_answer.success, trace.success, tasks, none)."""

    value: float | None
    source: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """succeeded, failed, partial (a share of sub-tasks) or unknown."""
        if self.value is None:
            return "unknown"
        return "succeeded" if self.value >= 1.0 else ("failed" if self.value <= 0.0 else "partial")

    @property
    def success(self) -> bool | None:
        return None if self.value is None or 0.0 < self.value < 1.0 else self.value >= 1.0


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def error_answer(text: Any, prefixes: tuple[str, ...] = ERROR_PREFIXES) -> bool:
    """Is this answer an error report (FlowAgent's `a_run` returns `Error: ...` instead of raising)?"""
    return isinstance(text, str) and _LEADING_REASONING.sub("", text).lstrip().startswith(prefixes)


def decide_outcome(
    *,
    answers: Iterable[Any],
    status: str | None,
    final_answer_success: Any = None,
    success: bool | None = None,
    completed: int = 0,
    failed: int = 0,
    reported_only: bool = False,
    error_prefixes: tuple[str, ...] = ERROR_PREFIXES,
) -> Outcome:
    """Rule 2 on its inputs. `reported_only` stops after what the run said about itself (no tasks share, no
    "completed with an answer"): what capture stores as `success`."""
    texts = [a for a in answers if isinstance(a, str)]
    bad = next((a for a in texts if error_answer(a, error_prefixes)), None)
    if bad is not None:
        return Outcome(0.0, "error_answer", {"answer_head": _LEADING_REASONING.sub("", bad).lstrip()[:120]})
    status = (status or "").lower() or None
    if status in FAILED_STATUSES:
        return Outcome(0.0, "status", {"status": status})
    flag = _flag(final_answer_success)
    if flag is not None:
        return Outcome(1.0 if flag else 0.0, "final_answer.success")
    if success is not None:
        return Outcome(1.0 if success else 0.0, "trace.success")
    # a status still "running" when the run ended (a_stream's `done` arrives before FlowAgent sets it) says
    # nothing once the run reported its own verdict above
    if status in UNFINISHED_STATUSES:
        return Outcome(None, "unfinished", {"status": status})
    if reported_only:
        return Outcome(None, "none")
    if completed or failed:
        return Outcome(completed / (completed + failed), "tasks", {"completed": completed, "failed": failed})
    if status == "completed" and any(t.strip() for t in texts):
        return Outcome(1.0, "status", {"status": status})
    return Outcome(None, "none")


def reported_success(
    *, answers: Iterable[Any], status: str | None, final_answer_success: Any = None, reported: Any = None
) -> bool | None:
    """What a run said about its own success (capture's `success`): rule 2 without the inferred steps."""
    return decide_outcome(
        answers=answers,
        status=status,
        final_answer_success=final_answer_success,
        success=reported if isinstance(reported, bool) else None,
        reported_only=True,
    ).success


def compute_outcome(trace: ExecutionTrace, *, error_prefixes: tuple[str, ...] = ERROR_PREFIXES) -> Outcome:
    """Rule 2 from the trace's fields (what `run_outcome` falls back to when no facts are stored)."""
    fa = final_answer_call(trace) or {}
    return decide_outcome(
        answers=(answer_text(trace), trace.final_response),
        status=trace.status,
        final_answer_success=fa.get("success"),
        success=trace.success,
        completed=len(trace.tasks_completed),
        failed=len(trace.tasks_failed),
        error_prefixes=error_prefixes,
    )


def host_verdict(trace: ExecutionTrace) -> HostVerdict:
    """The host's outcomes of the run read as one (`flowrl.trace.outcomes.merge`; empty when it has none)."""
    return merge(getattr(trace, "outcomes", None) or ())


def run_outcome(trace: ExecutionTrace) -> Outcome:
    """The run's outcome: the host's `success` when it gave one, else the stored fact when the trace has one,
    else decided now."""
    verdict = host_verdict(trace)
    if verdict.success is not None:
        return Outcome(1.0 if verdict.success else 0.0, "host", {"by": verdict.success_by})
    if trace.facts is not None:
        return Outcome(trace.facts.outcome, trace.facts.outcome_source, dict(trace.facts.outcome_detail))
    return compute_outcome(trace)


# ---------------------------------------------------------------------------------------------
# 3. the task key


def query_key(text: Any) -> str:
    """A user turn as a task: case, runs of spaces and trailing `.?!` ignored."""
    return _WS.sub(" ", str(text or "").casefold()).strip().rstrip(".?!").strip()


def task_key(trace: ExecutionTrace) -> str:
    """Traces of the same task share this: the host's `group_key` when set, else `query_key(user_query)`."""
    return trace.group_key if trace.group_key else query_key(trace.user_query)


# ---------------------------------------------------------------------------------------------
# 4. the reference answer


@dataclass(slots=True, frozen=True)
class Reference:
    """A task's known answer (None: there is none) and where it came from (metadata, dataset)."""

    answer: str | None
    source: str | None = None


def reference_in(columns: Mapping[str, Any] | None) -> str | None:
    """The reference in host metadata or a dataset row: the first of `REFERENCE_KEYS` set, except a
    `reference_answer` the row says was guessed from another run (`reference_source == "best_trace"`)."""
    if not isinstance(columns, Mapping):
        return None
    guessed = columns.get("reference_source") == GUESSED_REFERENCE
    for key in REFERENCE_KEYS:
        if guessed and key == "reference_answer":
            continue
        value = columns.get(key)
        if value not in (None, ""):
            return value if isinstance(value, str) else str(value)
    return None


def reference(trace: ExecutionTrace) -> Reference:
    """The trace's reference: the host's outcome first, then host metadata, then the dataset columns of a fresh
    completion."""
    answer = host_verdict(trace).reference
    if answer is not None:
        return Reference(answer, "host")
    answer = reference_in(trace.metadata)
    if answer is not None:
        return Reference(answer, "metadata")
    answer = reference_in(trace.metadata.get("grpo_columns"))
    return Reference(answer, "dataset") if answer is not None else Reference(None)


# ---------------------------------------------------------------------------------------------
# 5. the label


def is_manual_label(trace: ExecutionTrace) -> bool:
    """A label a person gave (`flowrl traces label`, or toolboxv2's `manual_review`): never overwritten."""
    return manual_label(trace.label, trace.label_source, trace.manual_review)


def manual_label(label: bool | None, label_source: str | None, manual_review: bool) -> bool:
    """`is_manual_label` on plain values (a trace dict's, a column's)."""
    return label is not None and (label_source == "manual" or (label_source is None and bool(manual_review)))


def _number(value: Any) -> float | None:
    value = getattr(value, "value", value)  # a RewardResult or a plain number
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def label_for(
    score: float | None, *, threshold: float = DEFAULT_THRESHOLD, rewards: Mapping[str, Any] | None = None
) -> bool | None:
    """Good when `score` reaches `threshold` and no correctness reward in `rewards` (values or RewardResults)
    is 0; None without a score."""
    if score is None:
        return None
    if rewards and any(_number(rewards.get(name)) == 0.0 for name in CORRECTNESS):
        return False
    return float(score) >= threshold


def label_at(trace: ExecutionTrace, threshold: float | None = None) -> tuple[bool | None, str]:
    """(label, where it came from: manual, host, threshold, engine or none). A manual label always wins; then
    the host's `success`; then `label_for(reward_score)` at `threshold` when one is given; then the engine's
    stored label; then `label_for(reward_score)` at `DEFAULT_THRESHOLD`."""
    success = host_verdict(trace).success
    fields = (trace.label, trace.label_source, trace.manual_review, success, trace.reward_score, trace.rewards)
    return label_of(*fields, threshold)


def label_of(
    label: bool | None,
    label_source: str | None,
    manual_review: bool,
    host_success: bool | None,
    score: float | None,
    rewards: Mapping[str, Any] | None,
    threshold: float | None = None,
) -> tuple[bool | None, str]:
    """`label_at` from a trace's fields as plain values (`host_success`: `host_verdict(trace).success`), for a
    build that reads them from columns (`flowrl.data.columnar`)."""
    if manual_label(label, label_source, manual_review):
        return bool(label), "manual"
    if host_success is not None:
        return host_success, "host"
    if score is not None and math.isnan(score):
        score = None
    if threshold is not None and score is not None:
        return label_for(score, threshold=threshold, rewards=rewards), "threshold"
    if label is not None:
        return bool(label), "engine"
    if score is not None:
        return label_for(score, rewards=rewards), "threshold"
    return None, "none"


# ---------------------------------------------------------------------------------------------
# stored facts


def trace_facts(trace: ExecutionTrace) -> TraceFacts:
    """Every stored fact of a trace, computed from its fields."""
    outcome = compute_outcome(trace)
    ref = reference(trace)
    return TraceFacts(
        outcome=outcome.value,
        outcome_source=outcome.source,
        outcome_detail=outcome.detail,
        tools=tool_tallies(trace),
        task_key=task_key(trace),
        reference_answer=ref.answer,
        reference_source=ref.source,
    )


def stored_facts(trace: ExecutionTrace) -> TraceFacts:
    """The facts to write with a trace: the run's facts as stored (computed when there are none), the task's
    facts from the current fields (the host may have named or annotated the task since)."""
    if trace.facts is None:
        return trace_facts(trace)
    ref = reference(trace)
    return trace.facts.model_copy(
        update={"task_key": task_key(trace), "reference_answer": ref.answer, "reference_source": ref.source}
    )


def tally_tools(trace: ExecutionTrace) -> dict[str, ToolTally]:
    """Per-tool tallies: stored ones when the trace has facts, else computed."""
    return dict(trace.facts.tools) if trace.facts is not None else tool_tallies(trace)


def declared_tools(trace: ExecutionTrace) -> frozenset[str] | None:
    """The tool names the run offered the model (`trace.tools`, OpenAI or plain schemas) and the control tools
    (`CONTROL_TOOLS`); None when the trace records no tools, so nothing can be called undeclared."""
    names = set()
    for schema in trace.tools:
        if isinstance(schema, dict):
            function = schema.get("function")
            name = (function if isinstance(function, dict) else schema).get("name")
            if isinstance(name, str):
                names.add(name)
    return frozenset(names | set(CONTROL_TOOLS)) if names else None


def honest_tool_calls(calls: list[Any]) -> list[Any]:
    """Logged tool-call dicts (a trace file's `tool_calls`) with `success` made honest by rule 1 (copies)."""
    out = []
    for call in calls:
        if isinstance(call, dict) and call.get("success", True) is not False:
            if tool_failed(call.get("result", ""), success=None, error=call.get("error")):
                call = {**call, "success": False}
        out.append(call)
    return out


__all__ = [
    "CONTROL_TOOLS",
    "declared_tools",
    "CORRECTNESS",
    "DEFAULT_THRESHOLD",
    "ERROR_PREFIXES",
    "FAILED_STATUSES",
    "GUESSED_REFERENCE",
    "REFERENCE_KEYS",
    "UNFINISHED_STATUSES",
    "Outcome",
    "Reference",
    "ToolCallView",
    "ToolTally",
    "TraceFacts",
    "answer_text",
    "compute_outcome",
    "decide_outcome",
    "host_verdict",
    "error_answer",
    "final_answer_call",
    "is_manual_label",
    "honest_tool_calls",
    "label_at",
    "label_for",
    "query_key",
    "recorded_transcript",
    "reference",
    "reference_in",
    "reported_success",
    "result_failed",
    "run_outcome",
    "stored_facts",
    "tally_tools",
    "task_key",
    "tool_calls",
    "tool_failed",
    "tool_tallies",
    "trace_facts",
]
