"""The trace model: one agent run, as stored on disk.

A superset of the JSON written by toolboxv2's rl module (`ExecutionTrace.to_dict()`), so those files
load unchanged. Everything else of flowrl's imports it.

Files carry `schema_version` (`SCHEMA_VERSION`). Older files (toolboxv2's have none: version 0) are upgraded
by `flowrl.trace.load.MIGRATIONS`, each taking a dict of version N to version N+1.

This module is the stored shape and imports no rule. What a trace means (a tool failed, the run's outcome, its
task, its reference answer, its label) is decided by `flowrl.trace.facts`, which imports this module; those
decisions are stored in `facts` (`TraceFacts`, here). Reading a file (upgrading older versions, filling their
facts) is `flowrl.trace.load`.
"""

from __future__ import annotations

import logging
import os
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flowrl.trace.outcomes import HostOutcome

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
FACTS_VERSION = 3  # files older than this get their facts computed when they are loaded

Source = Literal["live", "checkpoint", "obs", "live-file", "import", "train"]  # train: an online training rollout
SOURCES: tuple[str, ...] = ("live", "checkpoint", "obs", "live-file", "import", "train")


def now_iso() -> str:
    """Local wall-clock time as an ISO string without timezone, the way toolboxv2 writes it."""
    return datetime.now().isoformat()


def new_trace_id() -> str:
    """A random trace id for live captures (ingest derives ids from content instead): 16 hex digits, 64 random
    bits. Capture makes one as each run starts, on the host's thread (`os.urandom`: 6x cheaper than uuid4)."""
    return os.urandom(8).hex()


class _Stored(BaseModel):
    model_config = ConfigDict(extra="allow")  # keys written by newer tools survive a load/save round trip


class ToolTally(_Stored):
    """One tool's calls in a run: how many could be judged, how many of them failed."""

    calls: int = 0
    failed: int = 0


class TraceFacts(_Stored):
    """What `flowrl.trace.facts` decided about a run, stored with it (capture, ingest, upgrade). `outcome`: did the
    task succeed (1, 0, a share of sub-tasks, None: cannot tell), decided by the rule `outcome_source` names;
    `tools`: per tool, judged calls and failures (`final_answer` not counted); `task_key`: what makes two
    runs the same task; `reference_answer`: the task's known answer (never one guessed from another run) and
    where it came from. The task's facts are refreshed whenever the trace is written."""

    outcome: float | None = None
    outcome_source: str = "none"
    outcome_detail: dict[str, Any] = Field(default_factory=dict)
    tools: dict[str, ToolTally] = Field(default_factory=dict)
    task_key: str = ""
    reference_answer: str | None = None
    reference_source: str | None = None


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
    # the host's outcomes (`flowrl.trace.outcomes`): side records the store attaches when it reads the trace, never
    # written into the trace file (a re-score rewrites that file; the side records are append-only)
    outcomes: list[HostOutcome] = Field(default_factory=list, exclude=True)

    def date(self) -> str:
        """The store's date folder for this trace (YYYY-MM-DD), from `timestamp`."""
        return trace_date(self.timestamp)

    def to_dict(self) -> dict[str, Any]:
        """The trace's fields as JSON values. What a store writes is `flowrl.trace.load.stored_dict(trace)`: this,
        with the task's facts refreshed (the host may have named or annotated the task since)."""
        return self.model_dump(mode="json")


_DATE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})")


def trace_date(timestamp: str) -> str:
    match = _DATE_RE.match(timestamp or "")
    if match:
        return match.group(1)
    return datetime.now(UTC).strftime("%Y-%m-%d")
