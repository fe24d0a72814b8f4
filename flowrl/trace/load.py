"""Reading a trace: upgrade a stored dict of any known version, validate it, fill its facts; and the form a
store writes.

`MIGRATIONS[n]` takes a dict of schema version n to version n + 1 (`flowrl.trace.schema.SCHEMA_VERSION`);
the steps apply the rules (`flowrl.trace.facts`, `flowrl.trace.transcript`), which is why they live here and
not in the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from flowrl.errors import SchemaError
from flowrl.trace.facts import honest_tool_calls, result_failed, stored_facts, trace_facts
from flowrl.trace.schema import FACTS_VERSION, SCHEMA_VERSION, ExecutionTrace
from flowrl.trace.transcript import complete_messages


def stored_dict(trace: ExecutionTrace) -> dict[str, Any]:
    """The trace as a store writes it: its fields, with stored `facts` getting the task's facts (key,
    reference) refreshed from the current fields (`flowrl.trace.facts.stored_facts`): the host may have named
    or annotated the task since."""
    data = trace.to_dict()
    if trace.facts is not None:
        data["facts"] = stored_facts(trace).model_dump(mode="json")
    return data


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
            if isinstance(call, dict) and call.get("success") and result_failed(call.get("result", ""))
            else call
            for call in calls
        ]  # the rl module trusted FlowAgent's "success" (docs/reference/flowagent-0.1.28.md, tool results)
    data["schema_version"] = 1
    return data


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Every trace has canonical `messages` (`complete_messages`): a recorded transcript
    gets one tool-call shape and its duplicate tool results dropped; a trace without one gets it
    synthesised from `user_query`, `tool_calls` and `final_response` (its calls get ids, and
    `metadata.transcript` says "synthesized")."""
    data = complete_messages(data)
    data["schema_version"] = 2
    return data


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Tool `success` re-judged by the one rule (`tool_failed`: exec_code's
    `"{'success': False, ...}"` text is a failure too). `facts` is filled by `load_trace` from the validated
    trace (`trace_facts`), so a file is validated once."""
    calls = data.get("tool_calls")
    if isinstance(calls, list):
        data["tool_calls"] = honest_tool_calls(calls)
    data["schema_version"] = 3
    return data


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
