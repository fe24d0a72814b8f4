"""Langfuse: its observations (OTel spans with `langfuse.*` attributes) and its scores, as flowrl reads them.

The Langfuse Python SDK v3 is built on OpenTelemetry: observations are spans exported over OTLP/HTTP to
`{LANGFUSE_HOST}/api/public/otel/v1/traces`, so `flowrl.ingest.otlp` reads them with the other conventions; this
module holds the Langfuse one:

| attribute | read as |
|---|---|
| `langfuse.observation.type` | `agent` -> a run (like `invoke_agent`), `generation` -> an LLM call (like `chat`), \
`tool` -> a tool span (like `execute_tool`) |
| `langfuse.observation.input` (JSON) | the call's input messages: a list of OpenAI messages, `{"messages": [...], \
"tools": [...]}` (Langfuse's OpenAI integration when tools are given), or a text (one user message) |
| `langfuse.observation.output` (JSON) | the output message: an OpenAI message, a text, or a chat completion |
| `langfuse.observation.model.name`, `langfuse.observation.usage_details` | model; tokens (`input`/`output`, \
`prompt_tokens`/`completion_tokens` or `input_tokens`/`output_tokens`) |
| `langfuse.observation.level` `ERROR`, `langfuse.observation.status_message` | the span's error |
| `langfuse.trace.name`, `session.id` / `langfuse.session.id`, `user.id` / `langfuse.user.id` | agent name, \
session, `metadata.otlp.user_id` |

Scores do not travel over OTLP: the SDK posts them to `{host}/api/public/ingestion` as a batch of `score-create`
events (`{"batch": [{"type": "score-create", "body": {"traceId", "observationId", "name", "value",
"dataType"}}]}`), and `GET /api/public/scores` lists them under `data`. `scores_of` reads both (and a bare list
of score objects). A score names its trace by the OTel trace id; flowrl's id of that run is
`sha256("otlp-run/1", otel trace id, run span id)`, so `record_scores` finds the runs of an OTel trace in the
store (`metadata.otlp.trace_id`) and records the scores there as host outcomes
(`TraceStore.record_outcome(..., rewards={...}, source="langfuse")`, see `flowrl.trace.outcomes`): the trace file is
never rewritten, and the outcome may come before or after the trace. Values: NUMERIC as they are, BOOLEAN 1/0;
CATEGORICAL and TEXT scores are skipped (noted), and so is a number outside 0..1 (a host reward's scale), a score
with no trace (session or dataset-run scores), and a score whose trace is not in the store. A score already
recorded (same Langfuse score id) is not recorded twice.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import IngestError
from flowrl.ingest.unpickler import read_bytes
from flowrl.trace.outcomes import HostOutcome

TYPE = "langfuse.observation.type"
INPUT = "langfuse.observation.input"
OUTPUT = "langfuse.observation.output"
SOURCE = "langfuse"
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]+")

CATEGORICAL = "Langfuse categorical or text score (not a number) was not made a reward"
OUT_OF_RANGE = "Langfuse score outside 0..1 (a host reward is a number from 0 to 1) was not recorded"
NO_TRACE = "Langfuse score without a trace id (a session or dataset-run score) was not recorded"
NOT_SCORE = "Langfuse ingestion event that is not a score-create (only scores are read from the ingestion API)"
NOT_STORED = "Langfuse score whose trace is not in the store (ingest or receive its OTel spans first)"


# ---------------------------------------------------------------------------------------------
# observations (spans)


def kind(attrs: dict[str, Any]) -> str:
    return str(attrs.get(TYPE) or "").lower()


def json_value(value: Any) -> Any:
    """A span attribute that may hold JSON text, parsed (text that is not JSON, and any other value, as it is)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _message(value: Any, role: str) -> dict[str, Any] | None:
    if isinstance(value, dict) and ("role" in value or "content" in value or "tool_calls" in value):
        msg = {k: v for k, v in value.items() if v is not None or k == "content"}
        msg["role"] = str(msg.get("role") or role)
        msg.setdefault("content", None if msg.get("tool_calls") else "")
        return msg
    if isinstance(value, str):
        return {"role": role, "content": value}
    if value is None:
        return None
    return {"role": role, "content": json.dumps(value, ensure_ascii=False, default=str)}


def generation(attrs: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(input messages, output messages, tool definitions) of a Langfuse generation's attributes."""
    raw_in = json_value(attrs.get(INPUT))
    tools: list[dict[str, Any]] = []
    if isinstance(raw_in, dict) and isinstance(raw_in.get("messages"), list):
        for t in raw_in.get("tools") or []:
            if isinstance(t, dict):
                tools.append(
                    t
                    if "function" in t or t.get("type") not in (None, "function")
                    else {"type": "function", "function": t}
                )
        for f in raw_in.get("functions") or []:
            if isinstance(f, dict):
                tools.append({"type": "function", "function": f})
        raw_in = raw_in["messages"]
    inputs: list[dict[str, Any]] = []
    for m in raw_in if isinstance(raw_in, list) else [raw_in]:
        msg = _message(m, "user")
        if msg is not None:
            inputs.append(msg)
    raw_out = json_value(attrs.get(OUTPUT))
    if isinstance(raw_out, dict) and isinstance(raw_out.get("choices"), list) and raw_out["choices"]:
        first = raw_out["choices"][0]
        raw_out = first.get("message") if isinstance(first, dict) else first
    if isinstance(raw_out, list):  # a list of messages: the assistant's
        raw_out = next(
            (m for m in raw_out if isinstance(m, dict) and m.get("role") == "assistant"), raw_out[-1:] or None
        )
    out = _message(raw_out, "assistant")
    return inputs, [out] if out is not None else [], tools


def usage(attrs: dict[str, Any]) -> tuple[int | None, int | None]:
    """(tokens in, tokens out) from `langfuse.observation.usage_details`."""
    details = json_value(attrs.get("langfuse.observation.usage_details"))
    if not isinstance(details, dict):
        return None, None

    def first(*keys: str) -> int | None:
        for key in keys:
            value = details.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(value)
        return None

    return first("input", "prompt_tokens", "input_tokens"), first("output", "completion_tokens", "output_tokens")


def error(attrs: dict[str, Any]) -> str | None:
    if str(attrs.get("langfuse.observation.level") or "").upper() == "ERROR":
        return str(attrs.get("langfuse.observation.status_message") or "error")
    return None


# ---------------------------------------------------------------------------------------------
# scores


@dataclass(frozen=True)
class Score:
    trace_id: str  # the OTel trace id (32 hex digits)
    name: str
    value: float
    observation_id: str = ""
    score_id: str = ""


@dataclass
class Scores:
    scores: list[Score] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)  # the ingestion events read (to answer them)


def sniff(head: bytes) -> bool:
    """A Langfuse ingestion batch with scores, or a scores export, from a file's first bytes."""
    if b'"batch"' in head and b'"score-create"' in head:
        return True
    return b'"traceId"' in head and b'"dataType"' in head and b'"name"' in head and b'"value"' in head


def _reward_name(name: str) -> str:
    return _NAME_BAD.sub("_", name).strip("_.-")[:64] or "score"


def _score(body: Any, out: Scores) -> None:
    if not isinstance(body, dict) or "name" not in body:
        out.skipped.append("Langfuse score that is not an object with a name and a value")
        return
    trace_id = str(body.get("traceId") or "").lower()
    if not trace_id:
        out.skipped.append(NO_TRACE)
        return
    data_type = str(body.get("dataType") or "").upper()
    value = body.get("value")
    if data_type in ("CATEGORICAL", "TEXT", "CORRECTION") or (not data_type and isinstance(value, str)):
        out.notes.append(CATEGORICAL)
        return
    if data_type == "BOOLEAN":
        string = str(body.get("stringValue") or "").lower()
        number = 1.0 if (value in (1, 1.0, True) or string == "true") else 0.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        number = float(value)
    else:
        out.skipped.append("Langfuse score whose value is not a number")
        return
    if not 0.0 <= number <= 1.0:
        out.skipped.append(OUT_OF_RANGE)
        return
    out.scores.append(
        Score(
            trace_id=trace_id,
            name=_reward_name(str(body["name"])),
            value=number,
            observation_id=str(body.get("observationId") or "").lower(),
            score_id=str(body.get("id") or ""),
        )
    )


def scores_of(doc: Any) -> Scores:
    """The scores of an ingestion batch (`{"batch": [...]}`), a scores export (`{"data": [...]}`) or a list."""
    out = Scores()
    if isinstance(doc, dict) and isinstance(doc.get("batch"), list):
        for event in doc["batch"]:
            if not isinstance(event, dict):
                out.skipped.append(NOT_SCORE)
                continue
            if event.get("id") is not None:
                out.event_ids.append(str(event["id"]))
            if event.get("type") == "score-create":
                _score(event.get("body"), out)
            else:
                out.notes.append(NOT_SCORE)
        return out
    items = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise IngestError("neither a Langfuse ingestion batch nor a list of scores")
    for item in items:
        _score(item, out)
    return out


def read_scores(path: Path, raw: bytes | None = None) -> Scores:
    raw = read_bytes(path) if raw is None else raw
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise IngestError(f"{path}: not JSON ({exc})") from exc
    try:
        return scores_of(doc)
    except IngestError as exc:
        raise IngestError(f"{path}: {exc}") from exc


# OTel trace id -> [(flowrl trace id, run span id)] for the runs of those OTel traces
Runs = Callable[[set[str]], dict[str, list[tuple[str, str]]]]


def store_runs(store: Any) -> Runs:
    """A `Runs` lookup over the store's imported traces (one pass over them per call)."""

    def find(otel_ids: set[str]) -> dict[str, list[tuple[str, str]]]:
        found: dict[str, list[tuple[str, str]]] = {}
        if not otel_ids:
            return found
        for trace in store.iter_traces(source="import"):
            meta = (trace.metadata or {}).get("otlp")
            if isinstance(meta, dict) and meta.get("trace_id") in otel_ids:
                found.setdefault(str(meta["trace_id"]), []).append((trace.trace_id, str(meta.get("span_id") or "")))
        return found

    return find


def outcomes_for(
    scores: Iterable[Score], runs: dict[str, list[tuple[str, str]]]
) -> tuple[dict[str, list[Score]], list[Score]]:
    """Scores per flowrl trace id, and the scores with no run. A score on an observation that is a run span goes
    to that run only; any other goes to every run of its OTel trace."""
    per: dict[str, list[Score]] = {}
    lost: list[Score] = []
    for s in scores:
        targets = runs.get(s.trace_id) or []
        if s.observation_id and any(span == s.observation_id for _, span in targets):
            targets = [(tid, span) for tid, span in targets if span == s.observation_id]
        if not targets:
            lost.append(s)
        for tid, _ in targets:
            per.setdefault(tid, []).append(s)
    return per, lost


def record(store: Any, per_trace: dict[str, list[Score]]) -> int:
    """Record the scores as one host outcome per trace (source `langfuse`); scores whose Langfuse id is already
    recorded there are left out. Returns how many scores were recorded."""
    n = 0
    for tid, scores in per_trace.items():
        seen: set[str] = set()
        for o in store.outcomes(tid):
            if o.source == SOURCE:
                seen.update(map(str, (o.model_extra or {}).get("langfuse_scores") or []))
        fresh = [s for s in scores if not s.score_id or s.score_id not in seen]
        if not fresh:
            continue
        outcome = HostOutcome(
            rewards={s.name: s.value for s in fresh},
            source=SOURCE,
            langfuse_scores=[s.score_id for s in fresh if s.score_id],
        )
        store.record_outcome(tid, outcome)
        n += len(fresh)
    return n


def record_scores(store: Any, scores: list[Score], runs: Runs | None = None) -> tuple[int, list[Score]]:
    """Record scores into the store as host outcomes of the runs they name: (how many recorded, the scores
    whose trace is not there)."""
    found = (runs or store_runs(store))({s.trace_id for s in scores})
    per, lost = outcomes_for(scores, found)
    return record(store, per), lost


__all__ = ["Score", "Scores", "generation", "read_scores", "record_scores", "scores_of", "sniff"]
