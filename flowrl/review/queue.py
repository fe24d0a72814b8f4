"""The review queue: which traces to look at, in what order, and labelling them.

`QueueFilter` is what the page's filter form says (dates, agent, source, label, reward range, sort). `Reviewer`
owns the store, the learned reward's suggestions (`flowrl.review.suggest`) and the counters; every label goes
through the store's own `label` (what `flowrl traces label` calls), so it lands where the CLI's would, atomically
and under the store's lock. Two reviewers labelling one trace: the later label wins, whole.

"Unlabelled" means no manual label: a label a person gave. The engine's label is what the rewards said.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import urlencode

from flowrl.data.grouping import GroupBy, Grouper
from flowrl.errors import ConfigError
from flowrl.review.suggest import Suggester, Suggestion
from flowrl.store.files import TraceFilter
from flowrl.trace.facts import DEFAULT_THRESHOLD, is_manual_label, label_at
from flowrl.trace.schema import SOURCES, ExecutionTrace

LABELS = ("any", "unlabelled", "manual", "good", "bad")
SORTS = ("unlabelled", "disagreements", "oldest", "newest")
BEST_NOTE, WORST_NOTE = "review: best of group {}", "review: worst of group {}"


def _date(value: str, name: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(f"{name} {value!r} is not a date: use YYYY-MM-DD") from exc


def _number(value: str, name: str) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError as exc:
        raise ConfigError(f"{name} {value!r} is not a number") from exc


@dataclass
class QueueFilter:
    """The queue's filters. Text in, text out (`from_params`, `query`), so a page link keeps the queue."""

    since: date | None = None
    until: date | None = None
    agent: str = ""
    source: str = ""
    label: str = "any"
    min_reward: float | None = None
    max_reward: float | None = None
    sort: str = "unlabelled"

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> QueueFilter:
        """From a query string; ConfigError names a value that cannot be one."""
        flt = cls(
            since=_date(params.get("since", ""), "since"),
            until=_date(params.get("until", ""), "until"),
            agent=params.get("agent", ""),
            source=params.get("source", ""),
            label=params.get("label", "") or "any",
            min_reward=_number(params.get("min_reward", ""), "min reward"),
            max_reward=_number(params.get("max_reward", ""), "max reward"),
            sort=params.get("sort", "") or "unlabelled",
        )
        if flt.label not in LABELS:
            raise ConfigError(f"label {flt.label!r}: use one of {', '.join(LABELS)}")
        if flt.sort not in SORTS:
            raise ConfigError(f"sort {flt.sort!r}: use one of {', '.join(SORTS)}")
        if flt.source and flt.source not in SOURCES:
            raise ConfigError(f"source {flt.source!r}: use one of {', '.join(SOURCES)}")
        flt.trace_filter()  # the store's own checks (since after until, min above max)
        return flt

    def trace_filter(self) -> TraceFilter:
        return TraceFilter(
            since=self.since,
            until=self.until,
            agent=self.agent or None,
            source=self.source or None,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
        )

    def query(self) -> str:
        """The filters that differ from the defaults, as a query string ("" when none do)."""
        default = QueueFilter()
        pairs = [
            (f.name, "" if getattr(self, f.name) is None else str(getattr(self, f.name)))
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        return urlencode(pairs)

    def keeps(self, trace: ExecutionTrace) -> bool:
        manual = is_manual_label(trace)
        label, _ = label_at(trace)
        return {
            "any": True,
            "unlabelled": not manual,
            "manual": manual,
            "good": label is True,
            "bad": label is False,
        }[self.label]


@dataclass(slots=True)
class Row:
    """One trace in the queue."""

    trace_id: str
    timestamp: str
    agent: str
    source: str
    query: str
    reward: float | None
    label: bool | None
    label_from: str
    manual: bool
    group_id: str
    suggestion: Suggestion

    @property
    def disagrees(self) -> bool:
        """The label (the engine's, or yours) and the learned reward's suggestion say different things."""
        return self.suggestion.good is not None and self.label is not None and self.suggestion.good != self.label

    @property
    def distance(self) -> float:
        """How far the reward sits from the label threshold (inf without a reward)."""
        return math.inf if self.reward is None else abs(self.reward - DEFAULT_THRESHOLD)


def _sort_key(sort: str) -> Any:
    if sort == "disagreements":
        return lambda r: (r.manual, not r.disagrees, r.distance, r.timestamp, r.trace_id)
    if sort == "newest":
        return lambda r: (_reverse(r.timestamp), r.trace_id)
    if sort == "oldest":
        return lambda r: (r.timestamp, r.trace_id)
    return lambda r: (r.manual, r.timestamp, r.trace_id)


def _reverse(text: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in text)


@dataclass
class Position:
    """Where a trace sits in its queue: the neighbours, its number, and how many are left unlabelled."""

    prev: str | None
    next: str | None
    index: int | None
    total: int
    left: int


@dataclass
class Reviewer:
    """The store under review, its suggestions and counters. One per app."""

    store: Any
    group_by: GroupBy = "query"
    min_labels: int = 20
    suggester: Suggester = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _today: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.grouper = Grouper(group_by=self.group_by)
        if self.grouper.needs_fit:
            raise ConfigError("flowrl review groups by query or group_key, not by embedding")
        self.suggester = Suggester(min_labels=self.min_labels)

    # -- reading --------------------------------------------------------------------------------
    def traces(self, flt: TraceFilter | None = None) -> Iterator[ExecutionTrace]:
        return iter(self.store.iter_traces(flt))

    def get(self, trace_id: str) -> ExecutionTrace:
        return self.store.get(trace_id)

    def row(self, trace: ExecutionTrace) -> Row:
        label, source = label_at(trace)
        return Row(
            trace_id=trace.trace_id,
            timestamp=trace.timestamp,
            agent=trace.agent_name or "",
            source=trace.source,
            query=trace.user_query,
            reward=trace.reward_score,
            label=label,
            label_from=source,
            manual=is_manual_label(trace),
            group_id=self.grouper.key(trace),
            suggestion=self.suggester.suggest(trace),
        )

    def rows(self, flt: QueueFilter, traces: list[ExecutionTrace] | None = None) -> list[Row]:
        """The queue, sorted. Given `traces` (one listing of the whole store), it is filtered here instead."""
        tf = flt.trace_filter()
        if traces is None:
            found: Iterable[ExecutionTrace] = self.traces(tf)
        else:
            found = (t for t in traces if tf.day_ok(t.date()) and tf.matches(t))
        rows = [self.row(t) for t in found if flt.keeps(t)]
        return sorted(rows, key=_sort_key(flt.sort))

    def position(self, flt: QueueFilter, trace_id: str, traces: list[ExecutionTrace] | None = None) -> Position:
        rows = self.rows(flt, traces)
        ids = [r.trace_id for r in rows]
        left = sum(not r.manual for r in rows)
        if trace_id not in ids:
            return Position(None, ids[0] if ids else None, None, len(ids), left)
        i = ids.index(trace_id)
        return Position(ids[i - 1] if i else None, ids[i + 1] if i + 1 < len(ids) else None, i, len(ids), left)

    def group(self, group_id: str) -> list[ExecutionTrace]:
        """The runs of one task, best reward first (the dataset builder's grouping)."""
        members = [t for t in self.traces() if self.grouper.key(t) == group_id]
        return sorted(members, key=lambda t: (-(t.reward_score if t.reward_score is not None else -1.0), t.trace_id))

    # -- writing --------------------------------------------------------------------------------
    def label(self, trace_id: str, good: bool, notes: str = "") -> ExecutionTrace:
        """Label through the store (`flowrl traces label`'s path); counts it, and remembers the suggestion that
        was on screen for the agreement figure."""
        shown = self.suggester.suggest(self.get(trace_id)).good
        with self._lock:
            trace = self.store.label(trace_id, good, notes)
            self.store.flush()  # a SegmentStore buffers its side records: make the label durable now
            today = datetime.now(UTC).date().isoformat()
            self._today = {today: self._today.get(today, 0) + 1}
        self.suggester.record(shown, good)
        return trace

    def pick(self, group_id: str, best: str, worst: str) -> None:
        """A person's best and worst of a group: labelled good and bad, so DPO pairs them."""
        if best == worst:
            raise ConfigError("best and worst are the same run: pick two different runs")
        ids = {t.trace_id for t in self.group(group_id)}
        for trace_id in (best, worst):
            if trace_id not in ids:
                raise ConfigError(f"trace {trace_id!r} is not in group {group_id}")
        self.label(best, True, BEST_NOTE.format(group_id))
        self.label(worst, False, WORST_NOTE.format(group_id))

    def refit(self) -> str:
        self.suggester.refit(self.traces())
        return self.suggester.status

    @property
    def labelled_today(self) -> int:
        return self._today.get(datetime.now(UTC).date().isoformat(), 0)
