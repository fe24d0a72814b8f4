"""score_store: score the traces of a store and write the rewards back onto each trace.

What `flowrl score` runs. It picks the traces that lack a value for one of the engine's rewards (or all of
them with `rescore_all`), keeps traces of the same task together (so the judge can compare them in one
call), scores batches in a thread pool (the sandbox reward batches its own programs), and writes
`rewards`, `reward_details`, `reward_score` and an engine `label` onto each trace with `TraceStore.update`
(atomic). A manual label (`flowrl traces label`) is never overwritten: the file is read again right before
the write, so a label given while scoring runs survives too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError, SchemaError
from flowrl.rewards.engine import Results, RewardEngine
from flowrl.rewards.views import group_key, is_manual_label
from flowrl.schema import ExecutionTrace
from flowrl.store import TraceStore

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclass
class RewardStats:
    values: int = 0
    none: int = 0
    total: float = 0.0

    @property
    def mean(self) -> float | None:
        return self.total / self.values if self.values else None


@dataclass
class ScoreSummary:
    """What a scoring run did, for the CLI's table and for callers."""

    seen: int = 0
    scored: int = 0
    skipped: int = 0  # already scored (run with rescore_all to redo them)
    failed: int = 0  # could not be read back or written
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

    def add(self, trace: ExecutionTrace, results: Results) -> None:
        self.scored += 1
        for name, r in results.items():
            stats = self.rewards.setdefault(name, RewardStats())
            if r.value is None:
                stats.none += 1
            else:
                stats.values += 1
                stats.total += r.value
        if trace.reward_score is None:
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


def needs_scoring(trace: ExecutionTrace, engine: RewardEngine) -> bool:
    return any(name not in trace.rewards for name in engine.names)


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


def score_store(store: TraceStore, engine: RewardEngine, rescore_all: bool = False, progress: Progress | None = None,
                workers: int = 4, batch_size: int = 16) -> ScoreSummary:
    """Score what has no score yet (or everything with `rescore_all`) and write it back. Never prints."""
    summary = ScoreSummary(weights=dict(engine.weights))
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
    if progress:
        progress(0, total)

    def run(paths: list[Path]) -> list[tuple[ExecutionTrace | None, Results | None, str | None]]:
        traces, kept = [], []
        out: list[tuple[ExecutionTrace | None, Results | None, str | None]] = []
        for p in paths:
            try:
                traces.append(store.read_path(p))
                kept.append(p)
            except SchemaError as exc:
                out.append((None, None, str(exc)))
        for path, trace, results in zip(kept, traces, engine.compute_batch(traces)):
            try:
                fresh = store.read_path(path)  # a label given meanwhile must survive
            except SchemaError:
                fresh = trace
            try:
                store.update(apply_results(fresh, results, engine))
                out.append((fresh, results, None))
            except FlowRLError as exc:
                out.append((None, None, str(exc)))
        return out

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(run, b) for b in batches]
        for fut in as_completed(futures):
            for trace, results, error in fut.result():
                done += 1
                if error is not None or trace is None or results is None:
                    summary.failed += 1
                    summary.errors.append(error or "unknown error")
                else:
                    summary.add(trace, results)
            if progress:
                progress(done, total)
    return summary
