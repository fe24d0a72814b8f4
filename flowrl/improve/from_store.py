"""`flowrl improve --from-store STORE`: round 1 trains on the runs a deployment already recorded.

Nothing is collected. Each stored run gets its verdict from the one rule in `flowrl.trace.facts.label_at`: a
manual label, then the host's outcome, then what the reward engine judges. The engine scores the runs here, in
memory: the user's store is read, never written. A run whose query is one of the held-out tasks is left out of
training (the eval would measure memory), and counted.

The selection is the method's: SFT (rejection sampling) takes the runs judged right, KTO every run with a verdict.
The unfiltered control draws as many runs at random from all of them, verdict or not.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from flowrl.methods import get_method
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import apply_results
from flowrl.store.opener import open_store
from flowrl.trace.facts import label_at, query_key
from flowrl.trace.schema import ExecutionTrace

# where a verdict came from (`label_at`'s sources), as the round reports it
VERDICT_SOURCES = {"manual": "a manual label", "host": "the host's outcome", "threshold": "the rewards"}
VERDICT_SOURCES["engine"] = VERDICT_SOURCES["threshold"]


@dataclass
class StoreSelection:
    """What round 1 takes from a store: every usable run (`traces`, each labelled by its verdict), the ones the
    method trains on (`chosen`), the control's draw, and the counts the round reports."""

    traces: list[ExecutionTrace] = field(default_factory=list)
    chosen: list[ExecutionTrace] = field(default_factory=list)
    control: list[ExecutionTrace] | None = None
    read: int = 0
    held_out: int = 0  # runs of a held-out task's query: not trained on
    verdicts: Counter[str] = field(default_factory=Counter)  # by where the verdict came from
    right: int = 0

    @property
    def with_verdict(self) -> int:
        return sum(self.verdicts.values())

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "held_out_queries": self.held_out,
            "with_verdict": self.with_verdict,
            "verdicts": dict(self.verdicts),
            "right": self.right,
            "selected": len(self.chosen),
            "control": len(self.control) if self.control is not None else None,
        }

    def describe(self, store: str, method: str) -> str:
        """One line: how many runs had a verdict, from where, how many were selected and why the rest were not."""
        usable = len(self.traces)
        sources = Counter[str]()
        for name, n in self.verdicts.items():
            sources[VERDICT_SOURCES[name]] += n
        said = ", ".join(f"{n} from {where}" for where, n in sources.most_common()) or "none"
        line = f"{self.read} runs in {store}; {self.with_verdict} with a verdict ({said}), {self.right} judged right"
        line += f"; {len(self.chosen)} in the {method} set"
        reasons = [f"{usable - self.with_verdict} without a verdict"] if usable > self.with_verdict else []
        if get_method(method).trains_on_right_runs and self.with_verdict > self.right:
            reasons.append(f"{self.with_verdict - self.right} judged wrong")
        if self.held_out:
            reasons.append(f"{self.held_out} asked a held-out task's query")
        if reasons:
            line += f"; left out: {', '.join(reasons)}"
        if self.control is not None:
            line += f"; {len(self.control)} drawn for the control"
        return line


def select_from_store(
    spec: str, eval_queries: list[str], method: str, *, control: bool = False, seed: int = 0
) -> StoreSelection:
    """The runs of the store at `spec` (a path or URL), verdicts decided, selected for `method`."""
    held = {query_key(q) for q in eval_queries}
    got = StoreSelection()
    for trace in open_store(spec).iter_traces():
        got.read += 1
        if query_key(trace.user_query) in held:
            got.held_out += 1
        else:
            got.traces.append(trace)
    _score_in_memory(got.traces)
    on_right = get_method(method).trains_on_right_runs
    for trace in got.traces:
        label, source = label_at(trace)
        if label is None:
            continue
        got.verdicts[source] += 1
        got.right += label
        if label or not on_right:
            # the verdict is the label the build uses (the pipeline takes a manual label as it is)
            got.chosen.append(trace.model_copy(update={"label": label, "label_source": "manual"}))
    if control:
        draw = random.Random(seed + 1).sample(got.traces, k=min(len(got.traces), len(got.chosen)))
        got.control = [t.model_copy(update={"label": True, "label_source": "manual"}) for t in draw]
    return got


def _score_in_memory(traces: list[ExecutionTrace]) -> None:
    """Rewards for the runs that have none, on the copies read here (the store keeps what it had)."""
    unscored = [t for t in traces if not t.rewards]
    if not unscored:
        return
    with RewardEngine() as engine:
        if engine.needs_preparation():
            engine.prepare(traces)
        for trace, results in zip(unscored, engine.compute_batch(unscored), strict=True):
            apply_results(trace, results, engine)
