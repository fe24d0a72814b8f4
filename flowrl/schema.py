"""The trace model: one agent run, as stored on disk.

A superset of the JSON written by toolboxv2's rl module (`ExecutionTrace.to_dict()`), so those files
load unchanged. Everything else of flowrl's imports it.

Files carry `schema_version`. Older files (toolboxv2's have none: version 0) are upgraded by the
ordered list of small functions in `MIGRATIONS`, each taking a dict of version N to version N+1.

What a trace means (a tool failed, the run's outcome, its task, its reference answer, its label) is decided
by `flowrl.facts`, the module beside this one; its decisions are stored in `facts` (`TraceFacts`, defined
there with the rules that fill it). This module imports only `flowrl.facts`, `flowrl.outcomes`, `flowrl.transcript`
and `flowrl.errors`, which import nothing of flowrl's above them: no import circle.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flowrl.errors import SchemaError
from flowrl.facts import TraceFacts, honest_tool_calls, result_failed, stored_facts, trace_facts
from flowrl.outcomes import HostOutcome

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3

Source = Literal["live", "checkpoint", "obs", "live-file", "import", "train"]  # train: an online training rollout
SOURCES: tuple[str, ...] = ("live", "checkpoint", "obs", "live-file", "import", "train")


def now_iso() -> str:
    """Local wall-clock time as an ISO string without timezone, the way toolboxv2 writes it."""
    return datetime.now().isoformat()


def new_trace_id() -> str:
    """A random trace id for live captures (ingest derives ids from content instead): 16 hex digits, 64 random
    bits. Capture makes one as each run starts, on the host's thread (`os.urandom`: 6x cheaper than uuid4)."""
    return os.urandom(8).hex()


def result_is_failure(result: Any) -> bool:
    """Honest tool success: is this result a failure whatever the framework said? The rule is
    `flowrl.facts.result_failed` (an `Error`/`System-Error` head, a traceback, a dict or dict text with
    `success: False`); this name is kept for callers of the schema."""
    return result_failed(result)


class _Model(BaseModel):
    # Unknown keys survive a load/save round trip: files written by newer tools keep their data.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ToolCallTrace(_Model):
    tool_name: str
    arguments: Any = Field(default_factory=dict)
    result: str = ""
    success: bool = True
    duration_ms: float = 0.0
    error: str | None = None
    timestamp: str = ""
    call_id: str | None = None


class ReasoningStep(_Model):
    step_type: str = "internal_reasoning"
    content: str = ""
    confidence: float = 0.0
    insights: list[Any] = Field(default_factory=list)
    issues: list[Any] = Field(default_factory=list)


class LLMCall(_Model):
    """One model call. The token fields are filled only where the backend returned them:
    `prompt_token_ids` (what the model was given), `token_ids` (what it sampled, end-of-turn token
    included) and `logprobs` (the sampling log-probability of each sampled token). `tokenizer` is a
    fingerprint of the tokenizer those ids belong to (`name@sha256-prefix-of-vocab`).
    `token_ids_dropped` says why ids were removed (e.g. "redacted": a secret was masked in the text
    they encode, so the ids would leak it); such a call is not usable for token-faithful rows."""

    model: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_ms: float | None = None
    output: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None
    token_ids_dropped: str | None = None

    @property
    def has_token_ids(self) -> bool:
        return bool(self.prompt_token_ids) and bool(self.token_ids) and self.token_ids_dropped is None


class ExecutionTrace(_Model):
    """One run of an agent: the user turn, what the agent did, and how it was scored."""

    # toolboxv2 rl-module fields
    trace_id: str = Field(default_factory=new_trace_id)
    session_id: str = "default"
    timestamp: str = Field(default_factory=now_iso)
    user_query: str = ""
    tool_calls: list[ToolCallTrace] = Field(default_factory=list)
    reasoning_steps: list[ReasoningStep] = Field(default_factory=list)
    tasks_created: list[dict[str, Any]] = Field(default_factory=list)
    tasks_completed: list[dict[str, Any]] = Field(default_factory=list)
    tasks_failed: list[dict[str, Any]] = Field(default_factory=list)
    final_response: str = ""
    total_tokens_in: int | None = None
    total_tokens_out: int | None = None
    total_cost: float | None = None
    execution_duration_ms: float | None = None
    llm_calls_count: int | None = None
    label: bool | None = None
    reward_score: float | None = None
    manual_review: bool = False
    review_notes: str = ""

    # flowrl fields
    schema_version: int = SCHEMA_VERSION
    agent_name: str | None = None
    run_id: str | None = None
    source: Source = "live"
    success: bool | None = None
    status: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    llm_calls: list[LLMCall] = Field(default_factory=list)
    rewards: dict[str, float | None] = Field(default_factory=dict)
    reward_details: dict[str, dict[str, Any]] = Field(default_factory=dict)
    label_source: Literal["manual", "engine"] | None = None
    group_key: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    facts: TraceFacts | None = None
    # the host's outcomes (`flowrl.outcomes`): side records the store attaches when it reads the trace, never
    # written into the trace file (a re-score rewrites that file; the side records are append-only)
    outcomes: list[HostOutcome] = Field(default_factory=list, exclude=True)

    def date(self) -> str:
        """The store's date folder for this trace (YYYY-MM-DD), from `timestamp`."""
        return trace_date(self.timestamp)

    def to_dict(self) -> dict[str, Any]:
        """The trace as stored. Stored `facts` get the task's facts (key, reference) refreshed from the current
        fields (`flowrl.facts.stored_facts`): the host may have named or annotated the task since."""
        data = self.model_dump(mode="json")
        if self.facts is not None:
            data["facts"] = stored_facts(self).model_dump(mode="json")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str = "<dict>") -> ExecutionTrace:
        """Validate a dict of any known schema version, upgrading older ones first."""
        return load_trace(data, origin=origin)


_DATE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})")


def trace_date(timestamp: str) -> str:
    match = _DATE_RE.match(timestamp or "")
    if match:
        return match.group(1)
    return datetime.now(UTC).strftime("%Y-%m-%d")


def _valid_input(data: Any, origin: str) -> bool:
    if not isinstance(data, dict):
        raise SchemaError(f"{origin}: a trace must be a JSON object, got {type(data).__name__}")
    return True


# ---------------------------------------------------------------------------------------------
# Upgrades: MIGRATIONS[n] takes a dict of schema version n to version n + 1.


def _v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """toolboxv2 rl-module files: no schema_version, no source, zero means 'unknown' for tokens."""
    data.setdefault("source", "import")
    calls = data.get("tool_calls")
    if isinstance(calls, list):  # copies: `upgrade` leaves its input untouched
        data["tool_calls"] = [
            {**call, "success": False}
            if isinstance(call, dict) and call.get("success") and result_is_failure(call.get("result", ""))
            else call
            for call in calls
        ]  # the rl module trusted FlowAgent's "success" (docs/reference/flowagent-0.1.28.md, tool results)
    data["schema_version"] = 1
    return data


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Every trace has canonical `messages` (`flowrl.transcript.complete_messages`): a recorded transcript
    gets one tool-call shape and its duplicate tool results dropped; a trace without one gets it
    synthesised from `user_query`, `tool_calls` and `final_response` (its calls get ids, and
    `metadata.transcript` says "synthesized")."""
    from flowrl.transcript import complete_messages  # the transcript module sits beside this one

    data = complete_messages(data)
    data["schema_version"] = 2
    return data


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Tool `success` re-judged by the one rule (`flowrl.facts.tool_failed`: exec_code's
    `"{'success': False, ...}"` text is a failure too). `facts` is filled by `load_trace` from the validated
    trace (`flowrl.facts.trace_facts`), so a file is validated once."""
    calls = data.get("tool_calls")
    if isinstance(calls, list):
        data["tool_calls"] = honest_tool_calls(calls)
    data["schema_version"] = 3
    return data


FACTS_VERSION = 3  # files older than this get their facts computed when they are loaded


MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [_v0_to_v1, _v1_to_v2, _v2_to_v3]
assert len(MIGRATIONS) == SCHEMA_VERSION


def upgrade(data: dict[str, Any], *, origin: str = "<dict>") -> dict[str, Any]:
    """Bring a trace dict to the current schema version (a copy; the input is untouched)."""
    data = dict(data)
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version < 0:
        raise SchemaError(f"{origin}: schema_version {version!r} is not a non-negative integer")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{origin}: schema_version {version} is newer than this flowrl understands "
            f"({SCHEMA_VERSION}): upgrade flowrl"
        )
    for step in MIGRATIONS[version:]:
        data = step(data)
    return data


def load_trace(data: dict[str, Any], *, origin: str = "<dict>") -> ExecutionTrace:
    """Validate and upgrade a trace dict; SchemaError names `origin` and the first problem. A file older than
    version 3 gets its `facts` from the trace once it is valid."""
    _valid_input(data, origin)
    try:
        trace = ExecutionTrace.model_validate(upgrade(data, origin=origin))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise SchemaError(f"{origin}: field {where or '?'}: {first.get('msg')}") from exc
    if trace.facts is None and data.get("schema_version", 0) < FACTS_VERSION:
        trace.facts = trace_facts(trace)
    return trace
