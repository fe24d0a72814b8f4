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

Where the store is read and the rewards computed is a `ScoringBackend`: `ThreadBackend` (the default, this
process's threads) or the Ray one (`flowrl.rewards.ray_scoring`, `flowrl score --ray`), which only moves the
computing elsewhere. Everything else is `score_store`'s for both: `consider` (count a trace, pick it for
scoring), `pack` (batches of whole task groups), `Tally` (count results, the error budget) and `write_back`
(read again, keep a manual label, update).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from flowrl.errors import ConfigError, FlowRLError, SchemaError
from flowrl.rewards.engine import Results, RewardEngine
from flowrl.rewards.views import group_key, is_manual_label
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace

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


def consider(
    trace: ExecutionTrace,
    engine: RewardEngine,
    summary: ScoreSummary,
    rescore_all: bool,
    labelled: list[ExecutionTrace] | None,
) -> bool:
    """Count one trace read from the store; True when it is to be scored. A manual label goes to `labelled`
    (the traces `engine.prepare` learns from) when that list is given. Shared by every way of scoring."""
    summary.seen += 1
    if labelled is not None and is_manual_label(trace):
        labelled.append(trace)
    if rescore_all or needs_scoring(trace, engine):
        return True
    summary.skipped += 1
    return False


def new_summary(engine: RewardEngine, max_error_rate: float) -> ScoreSummary:
    """An empty summary for a run of `engine`; ConfigError when the error budget is not a share."""
    if not 0 <= max_error_rate <= 1:
        raise ConfigError(f"max_error_rate must be between 0 and 1, got {max_error_rate}")
    return ScoreSummary(weights=dict(engine.weights), max_error_rate=max_error_rate)


Key = TypeVar("Key")  # what the write-back reads a trace again by: its path, or its id
Item = TypeVar("Item")  # what the computing gets of a trace: its path (read again there), or its encoded JSON
Row = tuple[Key, Results | None, str | None]  # one trace's results, or None and why it could not be read


@dataclass(frozen=True, slots=True)
class Work(Generic[Item]):
    """What a backend's `compute` gets from `score_store`."""

    store: TraceStore
    engine: RewardEngine
    todo: list[tuple[str, Item]]  # (task group, item) of each trace picked; a whole group goes to one batch
    batch_size: int  # traces a batch, about (`pack`)
    workers: int  # batches computed at once (per Ray worker on Ray)
    stop: Callable[[], bool]  # true once the error budget is blown: compute no more


class ScoringBackend(Protocol[Item, Key]):
    """Where `score_store` reads the store and computes the rewards. The rest is `score_store`'s whichever the
    backend: picking the traces (`consider`), preparing learned rewards, counting results against the error budget
    (`Tally`) and writing them back (`write_back`). `ThreadBackend` is the default."""

    def select(
        self, store: TraceStore, problems: list[str], pick: Callable[[ExecutionTrace], bool]
    ) -> Iterator[tuple[ExecutionTrace, Item]]:
        """The store's traces that `pick` takes (it sees every trace read), each with what `compute` needs of it;
        what cannot be read is named in `problems`."""
        ...

    def compute(self, work: Work[Item]) -> Generator[list[Row[Key]], None, None]:
        """The results of `work.todo`, packed into batches, one batch at a time as they come."""
        ...

    def reread(self, store: TraceStore, key: Key) -> ExecutionTrace:
        """The trace of `key` as the store has it now, read right before its write."""
        ...


class Tally(Generic[Key]):
    """Counts computed results as they arrive, keeps them for the write, and says when the error budget can no
    longer be met (`hopeless`: compute no more). `key` is whatever the write-back reads the trace again by."""

    def __init__(
        self, summary: ScoreSummary, engine: RewardEngine, total: int, progress: Progress | None = None
    ) -> None:
        self.summary, self.progress = summary, progress
        self.total, self.done = total, 0
        self.planned = total * len(engine.names)
        self.computed: list[tuple[Key, Results]] = []
        summary.todo = total
        if progress:
            progress(0, total)

    def add(self, items: Iterable[Row[Key]]) -> None:
        """Count one batch of (key, results, error); results None: the trace could not be read."""
        for key, results, error in items:
            self.done += 1
            if results is None:
                self.summary.failed += 1
                self.summary.errors.append(error or "unknown error")
            else:
                self.summary.add_results(results)
                self.computed.append((key, results))
        if self.progress:
            self.progress(self.done, self.total)

    @property
    def hopeless(self) -> bool:
        """The budget is blown whatever the rest of the results are."""
        return self.summary.over_budget(self.planned)

    def finish(self) -> list[tuple[Key, Results]]:
        """What to write; ErrorBudgetExceeded (nothing to write) when the computed results are over budget."""
        if self.summary.over_budget():
            raise ErrorBudgetExceeded(self.summary)
        return self.computed


def write_back(
    store: TraceStore,
    engine: RewardEngine,
    summary: ScoreSummary,
    computed: list[tuple[Key, Results]],
    reread: Callable[[Key], ExecutionTrace],
    workers: int = 4,
) -> None:
    """Write each trace's results with `store.update`, onto a copy read again right before (`reread(key)`), so
    a label given while scoring ran survives; counts what was written or failed in `summary`."""

    def write(key: Key, results: Results) -> tuple[ExecutionTrace | None, str | None]:
        try:
            fresh = reread(key)  # a label given meanwhile must survive
        except FlowRLError as exc:
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


def pack(items: list[tuple[str, Key]], size: int) -> list[list[Key]]:
    """Pack whole groups (same task) into batches of about `size` items; a big group gets its own batch."""
    groups: dict[str, list[Key]] = {}
    for group, item in items:
        groups.setdefault(group, []).append(item)
    batches: list[list[Key]] = []
    current: list[Key] = []
    for members in groups.values():
        if current and len(current) + len(members) > size:
            batches.append(current)
            current = []
        current.extend(members)
        if len(current) >= size:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


class ThreadBackend:
    """`score_store`'s default backend: the store's files read by path, and the batches computed by `workers`
    threads of this process sharing its engine (the sandbox reward batches its own programs)."""

    def select(
        self, store: TraceStore, problems: list[str], pick: Callable[[ExecutionTrace], bool]
    ) -> Iterator[tuple[ExecutionTrace, Path]]:
        for path in store.iter_paths():
            try:
                trace = store.read_path(path)
            except SchemaError as exc:
                problems.append(str(exc))
                continue
            if pick(trace):
                yield trace, path

    def compute(self, work: Work[Path]) -> Generator[list[Row[Path]], None, None]:
        def batch(paths: list[Path]) -> list[Row[Path]]:
            if work.stop():
                return []
            traces, kept = [], []
            out: list[Row[Path]] = []
            for p in paths:
                try:
                    traces.append(work.store.read_path(p))
                    kept.append(p)
                except SchemaError as exc:
                    out.append((p, None, str(exc)))
            out.extend((path, results, None) for path, results in zip(kept, work.engine.compute_batch(traces)))
            return out

        with ThreadPoolExecutor(max_workers=max(1, work.workers)) as pool:
            futures = [pool.submit(batch, b) for b in pack(work.todo, max(1, work.batch_size))]
            for fut in as_completed(futures):
                yield fut.result()

    def reread(self, store: TraceStore, key: Path) -> ExecutionTrace:
        return store.read_path(key)


def score_store(
    store: TraceStore,
    engine: RewardEngine,
    rescore_all: bool = False,
    progress: Progress | None = None,
    workers: int = 4,
    batch_size: int = 16,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
    backend: ScoringBackend[Any, Any] | None = None,
) -> ScoreSummary:
    """Score what has no score yet (or everything with `rescore_all`) and write it back. Never prints.

    Computes every result first; raises ErrorBudgetExceeded, having written nothing, when more than
    `max_error_rate` of the (trace, reward) results are errors (a reward crashed). `backend` reads the store and
    computes: `ThreadBackend` (None) in this process, `flowrl.rewards.ray_scoring.RayBackend` on Ray workers."""
    backend = backend or ThreadBackend()
    summary = new_summary(engine, max_error_rate)
    labelled: list[ExecutionTrace] | None = [] if engine.needs_preparation() else None

    def pick(trace: ExecutionTrace) -> bool:
        return consider(trace, engine, summary, rescore_all, labelled)

    todo = [(group_key(trace), item) for trace, item in backend.select(store, summary.problems, pick)]
    if labelled is not None:
        summary.prepared = engine.prepare(labelled)
        labelled.clear()

    tally: Tally[Any] = Tally(summary, engine, len(todo), progress)
    hopeless = threading.Event()  # the budget is already blown: compute no more
    work = Work(store, engine, todo, batch_size, workers, hopeless.is_set)
    with contextlib.closing(backend.compute(work)) as computed:
        for rows in computed:
            tally.add(rows)
            if tally.hopeless:
                hopeless.set()
    write_back(store, engine, summary, tally.finish(), functools.partial(backend.reread, store), workers)
    return summary
