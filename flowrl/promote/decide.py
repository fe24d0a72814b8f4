"""Whether a candidate is proven better than the model it would replace, from an eval JSON (`flowrl.evaluate.results`).

`decide(data, candidate=, current=, alpha=)` reads the paired comparison of the two arms on the same held-out
tasks. The candidate is promoted only when McNemar's exact p is below `alpha` **and** the lower bound of the
paired difference's 95% bootstrap interval is above 0; otherwise the decision's `reason` says in one line why not,
with n, p and the interval. A chain of promotions is judged against what is promoted now, not the base, so small
insignificant steps cannot add up to a drift downwards.

`power_problem(base_rate, n, alpha=)`: a held-out set too small to detect a 10-point rise from the current
model's rate (`flowrl.evaluate.stats.mcnemar_sample_size`, power 0.8) is refused, naming the n needed.

`leaked_tasks(tasks, dataset)`: held-out tasks the candidate trained on, by task id or by normalised query
(`flowrl.trace.facts.query_key`) of any user turn of the training set's rows; a candidate with any is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.evaluate.results import summarize
from flowrl.evaluate.stats import mcnemar_sample_size
from flowrl.trace.facts import query_key

__all__ = ["EFFECT", "Decision", "decide", "leaked_tasks", "power_problem"]

EFFECT = 0.10  # the rise a held-out set must be able to detect (power 0.8)


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    candidate: str
    current: str
    n: int
    rate_current: float
    rate_candidate: float
    p: float
    diff: float
    diff_ci95: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(data: dict[str, Any], *, candidate: str, current: str, alpha: float = 0.05) -> Decision:
    """The decision for arm `candidate` against arm `current` of the eval JSON `data` (see the module doc)."""
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha {alpha}: use a level between 0 and 1 (0.05 is usual)")
    arms = data.get("arms", {})
    for arm in (candidate, current):
        if arm not in arms:
            raise ConfigError(
                f"the eval has no arm {arm!r} (its arms: {', '.join(arms)}): run both models on the tasks"
            )
    paired = summarize(
        {t["task_id"]: {current: t["outcomes"][current], candidate: t["outcomes"][candidate]} for t in data["tasks"]},
        base=current,
    )
    (c,) = paired["comparisons"]
    n = paired["arms"][current]["n"]
    lo, hi = c["diff_ci95"]
    figures = (
        f"n = {n}, {paired['arms'][current]['rate']:.1%} -> {paired['arms'][candidate]['rate']:.1%}, McNemar p = "
        f"{c['mcnemar_p']:.3g}, difference {100 * c['diff']:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    )
    if c["mcnemar_p"] >= alpha:
        verdict, promote = f"not promoted: not significant at alpha {alpha} ({figures})", False
    elif lo <= 0:
        verdict, promote = f"not promoted: the interval of the difference reaches 0 or below ({figures})", False
    else:
        verdict, promote = f"promoted: better than {current} ({figures})", True
    return Decision(
        promote,
        verdict,
        candidate,
        current,
        n,
        paired["arms"][current]["rate"],
        paired["arms"][candidate]["rate"],
        c["mcnemar_p"],
        c["diff"],
        (lo, hi),
    )


def power_problem(base_rate: float, n: int, *, alpha: float = 0.05, effect: float = EFFECT) -> str | None:
    """Why `n` held-out tasks are too few to detect a rise of `effect` from `base_rate` (one line naming the n
    needed), or None when they are enough."""
    needed = mcnemar_sample_size(base_rate, effect, alpha)
    if n >= needed:
        return None
    return (
        f"{n} held-out tasks cannot detect a {100 * effect:.0f}-point rise from {base_rate:.1%} at alpha {alpha} "
        f"(power 0.8 needs {needed}): give at least {needed} tasks"
    )


def leaked_tasks(tasks: Iterable[Any], dataset: Path) -> list[str]:
    """Ids of the `tasks` (with `task_id` and `query`) that the training set in `dataset` (a flowrl dataset folder
    or a JSONL file) holds, by task id or by the normalised query of any user turn a row shows the model."""
    ids: set[str] = set()
    queries: set[str] = set()
    for row in _rows(Path(dataset)):
        for key in ("task_id", "group_key", "task_key"):
            if isinstance(row.get(key), str):
                ids.add(row[key])
        queries.update(query_key(turn) for turn in _user_turns(row))
    return [t.task_id for t in tasks if t.task_id in ids or query_key(t.query) in queries]


def _rows(dataset: Path) -> Iterable[dict[str, Any]]:
    files = [dataset] if dataset.is_file() else sorted(dataset.glob("data/*.jsonl")) or sorted(dataset.glob("*.jsonl"))
    if not files:
        raise ConfigError(f"{dataset}: no training rows (data/*.jsonl) to check the held-out tasks against")
    for path in files:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _user_turns(row: dict[str, Any]) -> list[str]:
    """Every user turn a row shows the model (its prompt's few-shot examples included: the model saw them)."""
    found = []
    for key in ("messages", "prompt"):
        turns = row.get(key)
        if isinstance(turns, list):
            found += [
                t["content"]
                for t in turns
                if isinstance(t, dict) and t.get("role") == "user" and isinstance(t.get("content"), str)
            ]
        elif isinstance(turns, str) and key == "prompt":
            found.append(turns)
    return found
