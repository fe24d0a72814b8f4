"""score_store: score the traces of a store and write the rewards back onto each trace.

What `flowrl score` runs. It picks the traces that lack a value for one of the engine's rewards or got an
outcome from the host since they were scored (or all of them with `rescore_all`), keeps traces of the same
task together (so the judge can compare them in one call), scores batches in a thread pool (the sandbox reward
batches its own programs), and writes `rewards`, `reward_details`, `reward_score` and an engine `label` onto
each trace with `TraceStore.update` (atomic). A manual label (`flowrl traces label`) is never overwritten: the
file is read again right before the write, so a label given while scoring runs survives too.

A reward that crashes is an error, not "cannot judge" (see engine.py). Every result is computed before anything
is written. When more than `max_error_rate` (1% by default) of the (trace, reward) results are errors,
`score_store` writes nothing and raises `ErrorBudgetExceeded`, which carries the summary. It stops computing
as soon as the budget can no longer be met. Within the budget, the traces are written; a trace with an error
gets its other rewards, the error in `reward_details[name]["error"]`, no combined score and no engine label;
`rescore_all` (`flowrl score --all`) scores it again once the reward is fixed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, FlowRLError, SchemaError
from flowrl.rewards.engine import Results, RewardEngine
from flowrl.rewards.views import group_key, is_manual_label
from flowrl.schema import ExecutionTrace
from flowrl.store import TraceStore

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
DEFAULT_MAX_ERROR_RATE = 0.01  # of the (trace, reward) results; past it `flowrl score` writes nothing


@dataclass
class RewardStats:
    values: int = 0
    none: int = 0  # cannot judge
    total: float = 0.0
    errors: int = 0  # the reward crashed (for `combined`: no score because a reward crashed)
    first_error: str | None = None

    @property
    def mean(self) -> float | None:
        return self.total / self.values if self.values else None


@dataclass
class ScoreSummary:
    """What a scoring run did, for the CLI's table and for callers."""

    seen: int = 0
    scored: int = 0  # written back
    computed: int = 0  # traces whose rewards were computed (all of `scored`, and those not written)
    skipped: int = 0  # already scored (run with rescore_all to redo them)
    failed: int = 0  # could not be read back or written
    errored: int = 0  # written with a crashed reward (no combined score and no engine label, unless weight 0)
    todo: int = 0  # traces that needed scoring
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    rewards: dict[str, RewardStats] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    combined: RewardStats = field(default_factory=RewardStats)
    good: int = 0
    bad: int = 0
    unlabelled: int = 0
    manual_kept: int = 0
    errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    prepared: dict[str, Any] = field(default_factory=dict)

    @property
    def results(self) -> int:
        """(trace, reward) results computed."""
        return sum(s.values + s.none + s.errors for s in self.rewards.values())

    @property
    def error_results(self) -> int:
        return sum(s.errors for s in self.rewards.values())

    @property
    def error_rate(self) -> float:
        return self.error_results / self.results if self.results else 0.0

    def over_budget(self, planned: int | None = None) -> bool:
        """More errors than the budget allows out of `planned` results (default: those computed so far)."""
        total = self.results if planned is None else planned
        return self.error_results > self.max_error_rate * total if total else False

    def add_results(self, results: Results) -> None:
        """Count one trace's computed results per reward."""
        self.computed += 1
        for name, r in results.items():
            stats = self.rewards.setdefault(name, RewardStats())
            if r.error is not None:
                stats.errors += 1
                stats.first_error = stats.first_error or r.error
            elif r.value is None:
                stats.none += 1
            else:
                stats.values += 1
                stats.total += r.value

    def add(self, trace: ExecutionTrace, results: Results) -> None:
        """Count a trace written back with `results` (already counted by `add_results`)."""
        self.scored += 1
        crashed = any(r.error is not None for r in results.values())
        self.errored += crashed
        if trace.reward_score is None and crashed:
            self.combined.errors += 1
        elif trace.reward_score is None:
            self.combined.none += 1
        else:
            self.combined.values += 1
            self.combined.total += trace.reward_score
        if trace.label is None:
            self.unlabelled += 1
        elif trace.label:
            self.good += 1
        else:
            self.bad += 1
        if is_manual_label(trace):
            self.manual_kept += 1


class ErrorBudgetExceeded(FlowRLError):
    """Rewards crashed on more results than the budget allows; nothing was written. Carries the summary."""

    def __init__(self, summary: ScoreSummary) -> None:
        self.summary = summary
        crashed = sorted(((s.errors, n) for n, s in summary.rewards.items() if s.errors), reverse=True)
        count, name = crashed[0]
        others = "".join(f", {n!r} on {c}" for c, n in crashed[1:])
        stopped = (
            f" (stopped after {summary.computed} of {summary.todo} traces)" if summary.computed < summary.todo else ""
        )
        super().__init__(
            f"reward {name!r} crashed on {count} of {summary.computed} traces{others} "
            f"({summary.rewards[name].first_error}): {summary.error_results} of {summary.results} results are errors, "
            f"over the {summary.max_error_rate * 100:g}% budget{stopped}, so nothing was written; "
            "fix the reward, turn it "
            f"off with `enabled = false` under [rewards.{name}] in the reward config, or allow more with "
            f"--max-error-rate"
        )


def needs_scoring(trace: ExecutionTrace, engine: RewardEngine) -> bool:
    """True when a reward of the engine has no stored result, or the host recorded an outcome since the trace was
    scored (`host_outcome`'s details count the outcomes it saw). A stored error counts as a result: retrying it
    on every run would make one trace that a reward always crashes on blow the budget of every later small run."""
    if any(name not in trace.rewards for name in engine.names):
        return True
    if "host_outcome" in engine.names:
        seen = (trace.reward_details.get("host_outcome") or {}).get("outcomes", 0)
        return seen != len(trace.outcomes)
    return False


def apply_results(trace: ExecutionTrace, results: Results, engine: RewardEngine) -> ExecutionTrace:
    """Write an engine result onto a trace (in place); a manual label stays as it is."""
    trace.rewards = {n: r.value for n, r in results.items()}
    trace.reward_details = {n: dict(r.details) for n, r in results.items()}
    trace.reward_score = engine.compute_combined(results)
    if not is_manual_label(trace):
        trace.label = engine.get_binary_label(results)
        trace.label_source = "engine" if trace.label is not None else None
    return trace


def _batches(items: list[tuple[str, Path]], size: int) -> list[list[Path]]:
    """Pack whole groups (same task) into batches of about `size` paths; a big group gets its own batch."""
    groups: dict[str, list[Path]] = {}
    for key, path in items:
        groups.setdefault(key, []).append(path)
    batches: list[list[Path]] = []
    current: list[Path] = []
    for paths in groups.values():
        if current and len(current) + len(paths) > size:
            batches.append(current)
            current = []
        current.extend(paths)
        if len(current) >= size:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


def score_store(
    store: TraceStore,
    engine: RewardEngine,
    rescore_all: bool = False,
    progress: Progress | None = None,
    workers: int = 4,
    batch_size: int = 16,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
) -> ScoreSummary:
    """Score what has no score yet (or everything with `rescore_all`) and write it back. Never prints.

    Computes every result first; raises ErrorBudgetExceeded, having written nothing, when more than
    `max_error_rate` of the (trace, reward) results are errors (a reward crashed)."""
    if not 0 <= max_error_rate <= 1:
        raise ConfigError(f"max_error_rate must be between 0 and 1, got {max_error_rate}")
    summary = ScoreSummary(weights=dict(engine.weights), max_error_rate=max_error_rate)
    todo: list[tuple[str, Path]] = []
    labelled: list[ExecutionTrace] = []
    prepare = engine.needs_preparation()
    for path in store.iter_paths():
        try:
            trace = store.read_path(path)
        except SchemaError as exc:
            summary.problems.append(str(exc))
            continue
        summary.seen += 1
        if prepare and is_manual_label(trace):
            labelled.append(trace)
        if rescore_all or needs_scoring(trace, engine):
            todo.append((group_key(trace), path))
        else:
            summary.skipped += 1
    if prepare:
        summary.prepared = engine.prepare(labelled)
        labelled.clear()

    batches = _batches(todo, max(1, batch_size))
    total, done = len(todo), 0
    summary.todo = total
    planned = total * len(engine.names)
    hopeless = threading.Event()  # the budget is already blown: compute no more
    if progress:
        progress(0, total)

    def compute(paths: list[Path]) -> list[tuple[Path, Results | None, str | None]]:
        if hopeless.is_set():
            return []
        traces, kept = [], []
        out: list[tuple[Path, Results | None, str | None]] = []
        for p in paths:
            try:
                traces.append(store.read_path(p))
                kept.append(p)
            except SchemaError as exc:
                out.append((p, None, str(exc)))
        out.extend((path, results, None) for path, results in zip(kept, engine.compute_batch(traces)))
        return out

    computed: list[tuple[Path, Results]] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(compute, b) for b in batches]
        for fut in as_completed(futures):
            for path, results, error in fut.result():
                done += 1
                if results is None:
                    summary.failed += 1
                    summary.errors.append(error or "unknown error")
                else:
                    summary.add_results(results)
                    computed.append((path, results))
            if summary.over_budget(planned):
                hopeless.set()
            if progress:
                progress(done, total)
    if summary.over_budget():
        raise ErrorBudgetExceeded(summary)

    def write(path: Path, results: Results) -> tuple[ExecutionTrace | None, str | None]:
        try:
            fresh = store.read_path(path)  # a label given meanwhile must survive
        except SchemaError as exc:
            return None, str(exc)
        try:
            store.update(apply_results(fresh, results, engine))
        except FlowRLError as exc:
            return None, str(exc)
        return fresh, None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (_, results), (written, error) in zip(computed, pool.map(lambda item: write(*item), computed)):
            if written is None:
                summary.failed += 1
                summary.errors.append(error or "unknown error")
            else:
                summary.add(written, results)
    return summary
