"""What every dataset builder shares: filters, labels, per-trace summaries, counters, the builder base.

A builder turns traces into rows of one TRL format. Builders that work trace by trace (`grouped =
False`: KTO) get `trace_rows(trace, conv, ctx)` and stream; builders that compare traces of one task
(`grouped = True`: GRPO, SFT, DPO) get one `TraceInfo` per trace first, then `group_rows` per group,
loading only the traces they use. The pipeline (`flowrl.data.pipeline`) drives both.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any, ClassVar

from flowrl.errors import ConfigError
from flowrl.store.files import TraceFilter
from flowrl.trace.conversation import ArgumentsAs, Conversation
from flowrl.trace.facts import is_manual_label, label_at
from flowrl.trace.row import DecisionRow
from flowrl.trace.schema import ExecutionTrace

HIST_BINS = 10


@dataclass
class DatasetFilter(TraceFilter):
    """Which stored traces a dataset is built from: the store's filters (`flowrl.store.TraceFilter`, checked
    there), and `dedupe` (one trace per user turn)."""

    dedupe: bool = True

    def trace_filter(self) -> TraceFilter:
        return self

    def describe(self) -> dict[str, Any]:
        """The filters that are set, JSON-ready (for the card, the metadata file and error messages)."""
        out = {k: (v.isoformat() if isinstance(v, date) else v) for k, v in asdict(self).items() if v is not None}
        return out


def effective_label(trace: ExecutionTrace, threshold: float | None = None) -> tuple[bool | None, str]:
    """(label, where it came from): the one label rule, `flowrl.trace.facts.label_at`. A manual label always wins;
    then the reward score at `threshold` when one is given; then the engine's stored label; then the reward
    score at the engine's default threshold (0.6); a run whose correctness reward is 0 is never good."""
    return label_at(trace, threshold)


@dataclass(frozen=True, slots=True)
class Kept:
    """The pipeline's decision for a trace it keeps: its raw task key (`Grouper.raw_key_of`) and its label
    without a threshold (`effective_label`)."""

    raw_key: str
    label: tuple[bool | None, str]


@dataclass(slots=True)
class TraceInfo:
    """What a grouped builder knows about a trace before loading it again."""

    ref: Any
    trace_id: str
    group_id: str
    reward: float | None
    label: bool | None
    manual: bool
    timestamp: str


@dataclass
class BuildStats:
    """Counters of one build, reported in the summary, the card and flowrl_dataset.json."""

    traces_read: int = 0
    traces_used: int = 0
    columnar: bool = False  # built from a segment store's columns (`flowrl.data.columnar`)
    read_whole: int = 0  # traces a columnar build read whole
    unreadable: int = 0
    skipped: Counter = field(default_factory=Counter)
    rows: Counter = field(default_factory=Counter)
    labels: dict[str, Counter] = field(default_factory=dict)
    label_sources: Counter = field(default_factory=Counter)
    trace_labels: Counter = field(default_factory=Counter)
    groups: Counter = field(default_factory=Counter)
    truncated: int = 0
    dropped_too_long: int = 0
    synthesized: int = 0
    without_tool_calls: int = 0
    reward_hist: list[int] = field(default_factory=lambda: [0] * HIST_BINS)
    no_reward: int = 0
    token_budget: dict[str, Any] | None = None  # {"model", "max_length"} when rows were measured in tokens
    dropped_rows: list[dict[str, Any]] = field(default_factory=list)  # each row over the token budget

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n

    def add_reward(self, value: float | None) -> None:
        if value is None or math.isnan(value):
            self.no_reward += 1
            return
        self.reward_hist[min(HIST_BINS - 1, max(0, int(value * HIST_BINS)))] += 1

    def add_label(self, split: str, label: bool) -> None:
        self.labels.setdefault(split, Counter())["true" if label else "false"] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces_read": self.traces_read,
            "traces_used": self.traces_used,
            "columnar": self.columnar,
            "read_whole": self.read_whole,
            "unreadable_files": self.unreadable,
            "skipped": dict(self.skipped),
            "rows": dict(self.rows),
            "labels": {k: dict(v) for k, v in self.labels.items()},
            "label_sources": dict(self.label_sources),
            "trace_labels": dict(self.trace_labels),
            "groups": dict(self.groups),
            "truncated": self.truncated,
            "dropped_too_long": self.dropped_too_long,
            "synthesized_conversations": self.synthesized,
            "traces_without_tool_calls": self.without_tool_calls,
            "reward_histogram": {"bins": HIST_BINS, "counts": self.reward_hist, "no_reward": self.no_reward},
            "token_budget": self.token_budget,
            "dropped_rows": list(self.dropped_rows),
        }


@dataclass
class RowContext:
    """What a builder needs besides the trace: its group id and the counters."""

    group_id: str
    stats: BuildStats


Loader = Callable[[TraceInfo], tuple[ExecutionTrace, Conversation]]


@dataclass(kw_only=True)
class DatasetBuilder:
    """Base of the four builders. `max_chars` bounds a row's text (prompt plus completion); rows over it
    are shortened at an assistant-message boundary where the format allows, else dropped, and both are
    counted. `arguments_as` picks dict (Hugging Face templates) or JSON-string tool-call arguments."""

    method: ClassVar[str] = ""
    grouped: ClassVar[bool] = False
    shuffle_train: ClassVar[bool] = False
    # rows made from a segment's precomputed chat columns (`column_row`, `column_plan`, `column_table`), not from
    # parsed traces: a columnar build (`flowrl.data.columnar`)
    columnar: ClassVar[bool] = False
    max_chars: int | None = 32_000
    arguments_as: ArgumentsAs = "dict"

    def __post_init__(self) -> None:
        if self.max_chars is not None and self.max_chars <= 0:
            raise ConfigError(f"max_chars {self.max_chars}: use a positive number of characters, or None")
        if self.arguments_as not in ("dict", "string"):
            raise ConfigError(f"arguments_as {self.arguments_as!r}: use dict or string")

    # -- the format ------------------------------------------------------------------------------
    def features(self) -> Any:  # pragma: no cover - abstract
        """The `datasets.Features` of a row."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The builder's options, JSON-ready, for the card and the metadata file."""
        return {k: v for k, v in asdict(self).items()}

    # -- streaming builders -------------------------------------------------------------------
    def trace_rows(self, trace: ExecutionTrace, conv: Conversation, ctx: RowContext) -> Iterator[dict[str, Any]]:
        raise NotImplementedError  # pragma: no cover

    # -- columnar builders (`columnar = True`) --------------------------------------------------
    def column_rows(
        self,
        run: Any,
        index: list[int],
        rows: list[DecisionRow],
        kept: list[Kept | None],
        task: Callable[[str], tuple[str, str]],
        stats: BuildStats,
    ) -> None:
        """Add the traces of a segment decided from their columns (`rows`, at `index` in its table; `kept`: the
        pipeline's decision for each, None for a skipped one) to `run`, the segment's pending traces, as
        `trace_rows` would make their rows. `task(raw_key)`: a trace's group id and split."""
        raise NotImplementedError  # pragma: no cover

    def column_plan(self, run: Any) -> Any:
        """The rows of `run` (a segment's pending traces), before their text (`flowrl.data.columnar_kto.Plan`)."""
        raise NotImplementedError  # pragma: no cover

    def column_table(self, table: Any, plan: Any, schema: Any) -> Any:
        """The planned rows as an Arrow table in `schema`, from the segment's `table`."""
        raise NotImplementedError  # pragma: no cover

    def weights(self, stats: BuildStats) -> dict[str, float]:
        """What the metadata file records besides the rows (KTO's class weights); none by default."""
        return {}

    # -- grouped builders ---------------------------------------------------------------------
    def info(self, trace: ExecutionTrace, ref: Any, group_id: str) -> TraceInfo | None:
        """The summary kept for a trace, or None to leave it out (after counting why)."""
        label, _ = effective_label(trace)
        return TraceInfo(
            ref=ref,
            trace_id=trace.trace_id,
            group_id=group_id,
            reward=trace.reward_score,
            label=label,
            manual=is_manual_label(trace),
            timestamp=trace.timestamp,
        )

    def prepare(self, infos: list[TraceInfo], stats: BuildStats) -> None:
        """Called once with every kept trace's summary, before `group_rows` (SFT's global top share)."""

    def group_rows(self, members: list[TraceInfo], load: Loader, stats: BuildStats) -> Iterator[dict[str, Any]]:
        raise NotImplementedError  # pragma: no cover

    # -- helpers for subclasses -----------------------------------------------------------------
    def fits(self, chars: int) -> bool:
        return self.max_chars is None or chars <= self.max_chars


def reward_order(info: TraceInfo) -> tuple[float, str]:
    """Sort key: higher reward first, then trace id (deterministic)."""
    return (-(info.reward if info.reward is not None else -math.inf), info.trace_id)
