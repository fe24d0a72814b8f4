"""`DecisionRow`: the facts of one trace that a dataset build decides on, as one small typed value.

A build's one decision path (`flowrl.data.pipeline.DatasetPipeline`) reads these fields of every trace: whether
its chat has a user turn and an assistant step, its dedupe key, its task keys, its label's inputs (the label rule
is `flowrl.trace.facts.label_of`) and its reward. `decision_row` computes them from a trace and its chat, once: a
segment store when it writes a trace's columns (`flowrl.store.segments.derived`), a build for a trace read whole.
A segment store reads them back from those columns without parsing the trace
(`flowrl.store.segments.derived.decision_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowrl.trace.conversation import Conversation, conversation_key
from flowrl.trace.facts import host_verdict, label_of, query_key
from flowrl.trace.schema import ExecutionTrace


@dataclass(slots=True)
class DecisionRow:
    """What a build decides a trace on. `steps`: its chat's assistant messages; `key`: `conversation_key`;
    `host_success`: `host_verdict(trace).success` (None from columns: a row with host outcomes is read whole).

    A value: nothing changes one after it is made. Not `frozen=True`, as a frozen dataclass takes 3x as long to
    make (a columnar build makes one per stored trace: 40 ms against 13 ms for 20,000, measured)."""

    trace_id: str
    prompt_end: int
    steps: int
    key: bytes
    synthesized: bool
    tool_calls: bool
    group_key: str | None
    query_key: str
    label: bool | None
    label_source: str | None
    manual_review: bool
    host_success: bool | None
    reward_score: float | None
    rewards: Mapping[str, Any]

    def label_at(self, threshold: float | None = None) -> tuple[bool | None, str]:
        """(label, where it came from): `flowrl.trace.facts.label_at` of the trace, from these fields."""
        return label_of(
            self.label,
            self.label_source,
            self.manual_review,
            self.host_success,
            self.reward_score,
            self.rewards,
            threshold,
        )


def decision_row(trace: ExecutionTrace, conv: Conversation) -> DecisionRow:
    """The row of `trace`, whose chat is `conv` (`flowrl.trace.conversation.trace_conversation`)."""
    return DecisionRow(
        trace_id=trace.trace_id,
        prompt_end=conv.prompt_end,
        steps=len(conv.assistant_indices()),
        key=conversation_key(conv),
        synthesized=conv.synthesized,
        tool_calls=conv.has_tool_calls,
        group_key=trace.group_key,
        query_key=query_key(trace.user_query),
        label=trace.label,
        label_source=trace.label_source,
        manual_review=trace.manual_review,
        host_success=host_verdict(trace).success,
        reward_score=trace.reward_score,
        rewards=trace.rewards,
    )
