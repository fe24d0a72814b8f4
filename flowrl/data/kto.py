"""KTO: unpaired `prompt` / `completion` / `label` rows in conversational form (TRL's KTOTrainer).

`rows="step"` (default) gives one row per assistant message of the run: the prompt is everything
before it (system, user turn, earlier steps and their tool results), the completion is that assistant
message with its tool calls. `rows="final"` gives one row per trace for its last assistant message.
Every row of a trace carries the trace's label (manual label first, then the threshold or the engine's
label: see `effective_label`). Rows over `max_chars` are dropped and counted: a KTO prompt cannot be
shortened without changing what the model is asked.

`kto_weights` turns the class balance of the train split into `desirable_weight` / `undesirable_weight`
inside the range of the KTO paper's Eq. 8 (which KTOTrainer checks):
`1 <= (desirable_weight * n_desirable) / (undesirable_weight * n_undesirable) <= 4/3`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flowrl.data.base import BuildStats, DatasetBuilder, Kept, RowContext, effective_label
from flowrl.data.columnar_kto import Pending, Plan, materialize, plan
from flowrl.data.split import TRAIN
from flowrl.data.tokens import aligned_calls
from flowrl.errors import ConfigError
from flowrl.trace.conversation import Conversation
from flowrl.trace.row import DecisionRow
from flowrl.trace.schema import ExecutionTrace

# The target of (wD * nD) / (wU * nU): the geometric middle of the paper's [1, 4/3], so rounding to the
# trainer's two decimals never pushes it out of range.
KTO_RATIO = (4 / 3) ** 0.5


def kto_weights(n_desirable: int, n_undesirable: int) -> tuple[float, float]:
    """(desirable_weight, undesirable_weight): the smaller weight is 1.0, the minority class is up-weighted
    so that wD*nD / (wU*nU) = sqrt(4/3). With one class missing both are 1.0 (nothing to balance)."""
    if n_desirable <= 0 or n_undesirable <= 0:
        return 1.0, 1.0
    desirable = KTO_RATIO * n_undesirable / n_desirable
    if desirable >= 1.0:
        return round(desirable, 4), 1.0
    return 1.0, round(1.0 / desirable, 4)


@dataclass(kw_only=True)
class KTODatasetBuilder(DatasetBuilder):
    method: ClassVar[str] = "kto"
    grouped: ClassVar[bool] = False
    # KTOTrainer reads rows in order (train_sampling_strategy="sequential") and estimates its KL term
    # from neighbours in a batch, so the train split is shuffled rather than left trace by trace.
    shuffle_train: ClassVar[bool] = True
    columnar: ClassVar[bool] = True  # rows from a segment's chat columns too (`flowrl.data.columnar_kto`)

    rows: Literal["step", "final"] = "step"
    threshold: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rows not in ("step", "final"):
            raise ConfigError(f"KTO rows {self.rows!r}: use step or final")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold {self.threshold}: use a reward in [0, 1]")

    def features(self) -> Any:
        from datasets import Features, Json, List, Value

        return Features(
            {
                "prompt": List(Json()),
                "completion": List(Json()),
                "label": Value("bool"),
                "tools": Json(),
                "trace_id": Value("string"),
                "group_id": Value("string"),
                "step": Value("int32"),
                "reward": Value("float64"),
                "label_source": Value("string"),
                "captured": Json(),
            }
        )

    def trace_label(
        self, trace: ExecutionTrace, ctx: RowContext, plain: tuple[bool | None, str] | None = None
    ) -> tuple[bool, str] | None:
        """The label every row of `trace` carries and where it came from; None (counted) for an unlabelled run.
        `plain`: `effective_label(trace)` when the caller has it (the same without a threshold)."""
        labelled = plain if plain is not None and self.threshold is None else effective_label(trace, self.threshold)
        return self.counted_label(labelled, ctx.stats)

    def counted_label(self, labelled: tuple[bool | None, str], stats: BuildStats) -> tuple[bool, str] | None:
        """`trace_label`'s answer from the trace's label at this builder's threshold, counted in `stats`."""
        label, source = labelled
        if label is None:
            stats.skip("unlabelled (no label, no reward)")
            return None
        stats.label_sources[source] += 1
        return label, source

    def column_rows(
        self,
        run: Pending,
        index: list[int],
        rows: list[DecisionRow],
        kept: list[Kept | None],
        task: Callable[[str], tuple[str, str]],
        stats: BuildStats,
    ) -> None:
        """`trace_rows` for traces decided from their columns: each one's label (counted), and its rows to make
        with the rest of its segment's (`column_plan`, `column_table`)."""
        threshold, counted, first_row, add = self.threshold, self.counted_label, self.first_row, run.add
        for at, row, decision in zip(index, rows, kept, strict=True):
            if decision is None:
                continue
            group_id, split = task(decision.raw_key)
            labelled = counted(decision.label if threshold is None else row.label_at(threshold), stats)
            if labelled is not None:
                add(at, first_row(row.steps), *labelled, split, group_id, row.trace_id, row.reward_score)

    def column_plan(self, run: Pending) -> Plan:
        return plan(run.batch.table, run, self.max_chars)

    def column_table(self, table: Any, made: Plan, schema: Any) -> Any:
        return materialize(table, made, schema)

    def weights(self, stats: BuildStats) -> dict[str, float]:
        """`desirable_weight` and `undesirable_weight` from the train split's labels (`kto_weights`)."""
        train = stats.labels.get(TRAIN) or Counter()
        desirable, undesirable = kto_weights(train.get("true", 0), train.get("false", 0))
        return {"desirable_weight": desirable, "undesirable_weight": undesirable}

    def first_row(self, steps: int) -> int:
        """The first of a run's `steps` assistant messages that gets a row."""
        return 0 if self.rows == "step" else max(0, steps - 1)

    def trace_rows(self, trace: ExecutionTrace, conv: Conversation, ctx: RowContext) -> Iterator[dict[str, Any]]:
        labelled = self.trace_label(trace, ctx)
        if labelled is None:
            return
        label, source = labelled
        all_steps = conv.assistant_indices()
        calls = aligned_calls(trace, len(all_steps))
        first = self.first_row(len(all_steps))
        prompt_chars = conv.chars(0, all_steps[first]) if all_steps else 0
        for n in range(first, len(all_steps)):
            index = all_steps[n]
            if n > first:
                prompt_chars += conv.chars(all_steps[n - 1], index)
            completion = conv.messages[index]
            if not self.fits(prompt_chars + conv.chars(index, index + 1)):
                ctx.stats.dropped_too_long += 1
                continue
            yield {
                "prompt": conv.head(index),
                "completion": [completion],
                "label": label,
                "tools": conv.tools,
                "trace_id": trace.trace_id,
                "group_id": ctx.group_id,
                "step": n,
                "reward": trace.reward_score,
                "label_source": source,
                "captured": {"call": calls[n].to_dict()} if calls else None,
            }
