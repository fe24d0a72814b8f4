"""Numbers for the report, computed by streaming the store and reading training/eval outputs.

Training runs are read from `metrics.jsonl` (one JSON object per logging step with a `step` key, as
`flowrl train` writes it) and evaluations from `eval_report.json` (as `flowrl eval` writes it) and from eval
JSON files (`eval.json`, the per-task outcomes with rates, intervals and paired tests of
`flowrl.evaluate.results`; `flowrl improve` writes one per round as `round-<r>/eval.json`).

What a trace means comes from `flowrl.trace.facts`, as the rewards and datasets read it: tool failures (the
stored per-tool tallies), the run's outcome, and the label a dataset would use (`label_at`).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError
from flowrl.evaluate.results import read_eval_json, verify
from flowrl.store.files import TraceStore
from flowrl.trace.facts import declared_tools, label_at, run_outcome, tally_tools

UNDECLARED = "(a name the run did not offer)"  # tool calls to tools the agent does not have, counted together
log = logging.getLogger(__name__)


@dataclass
class ToolStats:
    calls: int = 0
    failures: int = 0

    @property
    def failure_rate(self) -> float:
        return self.failures / self.calls if self.calls else 0.0


@dataclass
class StoreMetrics:
    root: str
    traces: int = 0
    per_day: Counter[str] = field(default_factory=Counter)
    per_source: Counter[str] = field(default_factory=Counter)
    per_agent: Counter[str] = field(default_factory=Counter)
    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    reward_none: Counter[str] = field(default_factory=Counter)
    combined: list[float] = field(default_factory=list)
    labels: Counter[str] = field(default_factory=Counter)  # good/bad (manual, engine, threshold) or unlabelled
    tools: dict[str, ToolStats] = field(default_factory=lambda: defaultdict(ToolStats))
    success: Counter[str] = field(default_factory=Counter)  # the run's outcome: succeeded/failed/partial/unknown
    unreadable: list[str] = field(default_factory=list)


def store_metrics(store: TraceStore) -> StoreMetrics:
    m = StoreMetrics(root=str(store.root))
    for t in store.iter_traces():
        m.traces += 1
        m.per_day[t.date()] += 1
        m.per_source[t.source] += 1
        m.per_agent[t.agent_name or "(unnamed)"] += 1
        for name, value in t.rewards.items():
            if value is None:
                m.reward_none[name] += 1
            else:
                m.rewards[name].append(float(value))
        if t.reward_score is not None:
            m.combined.append(float(t.reward_score))
        label, source = label_at(t)
        m.labels["unlabelled" if label is None else f"{'good' if label else 'bad'} ({source})"] += 1
        offered = declared_tools(t)
        for name, tally in tally_tools(t).items():
            # a name the run never offered ("Berlin", "Capital of Germany") is the model's invention, not a tool
            stats = m.tools[name if offered is None or name in offered else UNDECLARED]
            stats.calls += tally.calls
            stats.failures += tally.failed
        m.success[run_outcome(t).verdict] += 1
    m.unreadable = [p.message for p in store.problems]
    return m


@dataclass
class TrainingRun:
    name: str
    path: Path
    rows: list[dict[str, Any]]  # every line of metrics.jsonl, the end-of-training summary line included

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The logged steps: the rows less the summary line (`"summary": true`) written when training ends."""
        return [row for row in self.rows if not row.get("summary")]

    def series(self, key: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for row in self.steps:
            value = row.get(key)
            if isinstance(value, (int, float)) and row.get("step") is not None:
                xs.append(float(row["step"]))
                ys.append(float(value))
        return xs, ys


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            log.warning("flowrl: %s line %d is not JSON; skipped", path, i)  # a torn last line is normal
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def find_runs(dirs: list[Path]) -> tuple[list[TrainingRun], list[tuple[Path, dict[str, Any]]]]:
    """Training runs (metrics.jsonl) and eval reports (eval_report.json) in or right below `dirs`."""
    runs: list[TrainingRun] = []
    evals: list[tuple[Path, dict[str, Any]]] = []
    for d in dirs:
        if not Path(d).exists():
            raise FlowRLError(f"--run {d} does not exist: pass the output dir of `flowrl train` or `flowrl eval`")
        candidates = [Path(d), *sorted(p for p in Path(d).iterdir() if p.is_dir())] if Path(d).is_dir() else []
        for c in candidates:
            metrics = c / "metrics.jsonl"
            if metrics.is_file():
                runs.append(TrainingRun(c.name, c, read_jsonl(metrics)))
            report = c / "eval_report.json"
            if report.is_file():
                try:
                    evals.append((report, json.loads(report.read_text(encoding="utf-8"))))
                except json.JSONDecodeError as exc:
                    raise FlowRLError(f"{report} is not valid JSON ({exc}): re-run `flowrl eval`") from exc
    return runs, evals


_ROUND = re.compile(r"round-(\d+)")


@dataclass
class EvalFile:
    """One eval JSON, with what `verify` found ([] when it recomputes to its own figures)."""

    path: Path
    data: dict[str, Any]
    problems: list[str]
    round: int | None = None  # r for a file at `round-<r>/eval.json`

    @property
    def base(self) -> str:
        comparisons = self.data["comparisons"]
        return comparisons[0]["a"] if comparisons else "base"


@dataclass
class EvalGroup:
    """Eval files shown together: the rounds of one `flowrl improve` folder (`rounds`), or a single file."""

    title: str
    files: list[EvalFile]
    rounds: bool


def find_eval_files(paths: list[Path]) -> list[EvalFile]:
    """Eval JSON files given as files, or named `eval.json` in or right below the given folders (`round-<r>/`)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file() and p.suffix == ".json" and p.name != "eval_report.json":
            found.append(p)
        elif p.is_dir():
            below = [c / "eval.json" for c in p.iterdir() if c.is_dir() and (c / "eval.json").is_file()]
            found += [p / "eval.json"] if (p / "eval.json").is_file() else []
            found += sorted(below, key=lambda f: (_round_of(f) is None, _round_of(f) or 0, str(f)))
    files, seen = [], set()
    for f in found:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            data = read_eval_json(f)
            files.append(EvalFile(f, data, verify(data), _round_of(f)))
    return files


def group_eval_files(files: list[EvalFile]) -> list[EvalGroup]:
    """Round files of one folder become one series (in round order); any other file stands alone."""
    groups: list[EvalGroup] = []
    series: dict[Path, EvalGroup] = {}
    for f in files:
        if f.round is None:
            groups.append(EvalGroup(str(f.path), [f], rounds=False))
            continue
        folder = f.path.parent.parent
        if folder not in series:
            series[folder] = EvalGroup(str(folder), [], rounds=True)
            groups.append(series[folder])
        series[folder].files.append(f)
    return groups


def round_series(files: list[EvalFile]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Arm family -> [(round, arm figures)]: `round-3` and `control-3` of round 3 become `round` and `control`."""
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for f in files:
        for arm, figures in f.data["arms"].items():
            family = arm.removesuffix(f"-{f.round}") if arm != f.base else arm
            out.setdefault(family, []).append((f.round or 0, figures))
    return out


def _round_of(path: Path) -> int | None:
    m = _ROUND.fullmatch(path.parent.name)
    return int(m.group(1)) if m and path.name == "eval.json" else None
