"""Filter pushdown: which rows of a segment a `TraceFilter` can match, from the scalar columns alone.

A row is dropped before its `trace` JSON is decoded only when its columns prove it cannot match. Rows of a trace
with patches (`flowrl.store.segments.sidecar`) are never dropped here, since a patch may change the label or score the
columns hold; the full `TraceFilter.matches` on the merged trace decides for every row that is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowrl.store.files import TraceFilter
from flowrl.store.segments.format import Segment

COLUMNS = ["trace_id", "agent_name", "session_id", "source", "label", "label_source", "reward_score"]


def row_filter(
    flt: TraceFilter, patched: Callable[[list[str]], Any]
) -> Callable[[Segment, str], list[bool] | None] | None:
    """`keep(segment, location)` giving a mask of rows that may match, or None when `flt` has no column test.
    `patched(ids)`: a bool per id, whether the trace may have patches (its row is kept then)."""
    tests = _tests(flt)
    if not tests:
        return None

    def keep(segment: Segment, _location: str) -> list[bool]:
        cols = segment.columns(COLUMNS)
        maybe = patched(cols["trace_id"]).tolist()
        return [maybe[i] or all(test(cols, i) for test in tests) for i in range(segment.rows)]

    return keep


Test = Callable[[dict[str, list[Any]], int], bool]


def _tests(flt: TraceFilter) -> list[Test]:
    """The column tests of `flt`, each as `TraceFilter.matches` checks the field."""
    tests: list[Test] = []

    def equal(column: str, value: Any) -> None:
        if value is not None:
            tests.append(lambda c, i: c[column][i] == value)

    equal("agent_name", flt.agent)
    equal("session_id", flt.session)
    equal("source", flt.source)
    equal("label_source", flt.label_source)
    if flt.label is not None:
        tests.append(lambda c, i: c["label"][i] is flt.label)
    if flt.labelled is not None:
        tests.append(lambda c, i: (c["label"][i] is not None) == flt.labelled)
    if flt.has_reward is not None:
        tests.append(lambda c, i: (c["reward_score"][i] is not None) == flt.has_reward)
    low, high = flt.min_reward, flt.max_reward
    if low is not None:
        tests.append(lambda c, i: c["reward_score"][i] is not None and c["reward_score"][i] >= low)
    if high is not None:
        tests.append(lambda c, i: c["reward_score"][i] is not None and c["reward_score"][i] <= high)
    return tests
