"""A richer file for a run already stored upgrades its trace in place, under the same id.

A checkpoint read before the obs file of the same run gives a text-only trace (no tool calls, tokens or
success). The obs file gives the same trace id (`flowrl.ingest.ids`), so without this it would be dropped
as a duplicate and the trace stay poor for good. Richness is what the transcript came from:

| `metadata.flowagent.transcript` | rank |
|---|---|
| `chat_history` (a checkpoint turn alone) | 0 |
| `ctx_snapshot` (a live file) | 1 |
| `obs-steps` (an obs run file, alone or joined to its checkpoint turn) | 2 |
| anything else (an imported or captured trace) | never replaced |

A trace is replaced only by a strictly richer one, so reading the same files again writes nothing. The
replacement keeps what belongs to the stored trace rather than to the files (`merged`): the id, a person's
review (a manual label, `manual_review`, `review_notes`), the host's `group_key` and metadata, unknown
fields, and the day folder. Rewards and an engine label were computed from the poorer content, so they are
dropped and `flowrl score` computes them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrl.errors import SchemaError, StoreError
from flowrl.trace.facts import is_manual_label, trace_facts
from flowrl.trace.schema import ExecutionTrace, trace_date

log = logging.getLogger(__name__)

TRANSCRIPT_RANK = {"chat_history": 0, "ctx_snapshot": 1, "obs-steps": 2}
NEVER = 1_000  # the rank of a trace no ingest file replaces

Make = Callable[[ExecutionTrace], ExecutionTrace]


def transcript_rank(transcript: str | None) -> int:
    return TRANSCRIPT_RANK.get(transcript or "", NEVER)


def richness(trace: ExecutionTrace) -> int:
    meta = trace.metadata.get("flowagent") if isinstance(trace.metadata, dict) else None
    return transcript_rank(meta.get("transcript") if isinstance(meta, dict) else None)


def merged(stored: ExecutionTrace, richer: ExecutionTrace, day: str | None = None) -> ExecutionTrace:
    """`richer` (built from the files, redacted) with what belongs to the stored trace kept. `day`: the
    stored file's day folder (default: the stored timestamp's), which the trace keeps."""
    out = richer.model_copy(deep=True)
    out.trace_id = stored.trace_id
    out.manual_review, out.review_notes = stored.manual_review, stored.review_notes
    if is_manual_label(stored):
        out.label, out.label_source = stored.label, stored.label_source
    out.group_key = stored.group_key or out.group_key
    out.tools = out.tools or stored.tools
    flowagent = dict(out.metadata.get("flowagent") or {})
    old = stored.metadata.get("flowagent")
    flowagent["upgraded_from"] = old.get("transcript") if isinstance(old, dict) else None
    out.metadata = {**stored.metadata, **out.metadata, "flowagent": flowagent}
    out.__pydantic_extra__ = {**(stored.__pydantic_extra__ or {}), **(out.__pydantic_extra__ or {})}
    if trace_date(out.timestamp) != (day or trace_date(stored.timestamp)):
        out.timestamp = stored.timestamp  # the file stays in its day folder, and its timestamp agrees
    out.facts = trace_facts(out)
    return out


class _NotRicher(Exception):
    """Raised inside `TraceStore.modify` to leave the stored trace as it is (nothing is written)."""


class StoreUpgrader:
    """`Ingestor(upgrade=StoreUpgrader(store))`: replace a stored trace by a richer one, atomically.

    `before` runs first (the ingest's batch writer flushes, so a trace it still holds is on disk)."""

    def __init__(self, store: Any, before: Callable[[], None] | None = None) -> None:
        self.store = store
        self.before = before

    def __call__(self, trace_id: str, rank: int, make: Make) -> bool:
        """Replace the stored `trace_id` by `make(stored)` when that is richer (`rank`); False, having
        written nothing, when the stored trace is as rich, gone, or unreadable."""
        if self.before is not None:
            self.before()
        try:  # the common case (as rich already) ends here, without the lock or a write
            stored = self.store.get(trace_id)
        except (StoreError, SchemaError) as exc:
            log.debug("flowrl: not upgrading %s: %s", trace_id, exc)
            return False
        if richness(stored) >= rank:
            return False
        path = self.store.find(trace_id)
        # the day it is filed under: a JSON file's folder, or a segment's `date=` partition (a SegmentStore's str)
        day = Path(str(path)).parent.name.removeprefix("date=") if path is not None else None

        def change(trace: ExecutionTrace) -> None:
            if richness(trace) >= rank:  # another writer was first
                raise _NotRicher
            new = merged(trace, make(trace), day)
            for name in type(new).model_fields:
                setattr(trace, name, getattr(new, name))
            trace.__pydantic_extra__ = new.__pydantic_extra__

        try:
            self.store.modify(trace_id, change)
        except _NotRicher:
            return False
        except StoreError:
            if not self.store.exists(trace_id):
                return False  # removed since it was read
            raise
        return True
