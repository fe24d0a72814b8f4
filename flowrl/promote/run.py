"""One promotion: run the model promoted now and the candidate on the same held-out tasks, decide, record.

`promote(candidate, evaluate=, tasks=, history=, out=, current=, alpha=)`:

1. the candidate's training set (its `flowrl_train.json` names it) must hold none of the held-out tasks
   (`leaked_tasks`), else it is refused before anything runs;
2. `current` defaults to what `history` says is promoted now (`None`: the base model);
3. `evaluate({arm: adapter})` runs the arms on the tasks and returns task_id -> arm -> outcome: the current model
   first, and a held-out set too small to detect a 10-point rise from its rate stops there (`power_problem`);
4. `out/eval.json` (per-task outcomes, the paired test) is written and `decide` judges it;
5. the decision is appended to `history`, with the eval's path and sha256 and the held-out set's fingerprint; when
   that set has already served decisions, the result says how many (each test spends some of its power).

The evaluator is the caller's: the CLI's runs the agent on each model through the policy server, as `flowrl eval
--agent` does; tests give one whose outcomes they decide.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError
from flowrl.evaluate.results import summarize, write_eval_json
from flowrl.promote.decide import Decision, decide, leaked_tasks, power_problem
from flowrl.promote.history import Entry, History, fingerprint, sha256_of

__all__ = ["BASE", "CANDIDATE", "CURRENT", "PromotionError", "Result", "promote", "training_set"]

BASE = "base"  # what `current` is when nothing was promoted
CURRENT, CANDIDATE = "current", "candidate"  # the two arms of the eval
Evaluate = Callable[[dict[str, Path | None]], dict[str, dict[str, bool]]]


class PromotionError(FlowRLError):
    """A promotion refused before its test: a leak, too few tasks, a candidate without its record."""


@dataclass(frozen=True)
class Result:
    decision: Decision
    entry: Entry
    eval_path: Path
    uses_before: int  # decisions the held-out set had served before this one

    def lines(self) -> list[str]:
        out = [self.decision.reason]
        if self.uses_before:
            out.append(
                f"this held-out set has served {self.uses_before} earlier decision(s): each test spends some of its "
                "power; prefer a fresh set for the next one"
            )
        return out


def training_set(adapter: Path) -> Path | None:
    """The dataset the adapter was trained on, as its `flowrl_train.json` records it; None when it has no record."""
    record = Path(adapter) / "flowrl_train.json"
    if not record.is_file():
        return None
    config = json.loads(record.read_text(encoding="utf-8")).get("config", {})
    dataset = config.get("dataset")
    return Path(dataset) if dataset else None


def promote(
    candidate: Path,
    *,
    evaluate: Evaluate,
    tasks: list[Any],
    history: History,
    out: Path,
    current: Path | None | str = BASE,
    alpha: float = 0.05,
) -> Result:
    """See the module doc. `current`: a model folder, None for the base model, or `BASE` to take what `history`
    says is promoted now."""
    candidate = Path(candidate)
    if not (candidate / "adapter_config.json").is_file():
        raise PromotionError(f"{candidate}: no adapter_config.json there; pass the adapter folder a round trained")
    dataset = training_set(candidate)
    if dataset is None:
        raise PromotionError(
            f"{candidate} has no flowrl_train.json naming its training set, so it cannot be checked against the "
            "held-out tasks: promote an adapter flowrl trained"
        )
    leaked = leaked_tasks(tasks, dataset)
    if leaked:
        raise PromotionError(
            f"{candidate} trained on {len(leaked)} of the held-out tasks (e.g. {leaked[0]}, in {dataset}): it would be "
            "graded on what it memorised; use tasks it never saw"
        )
    if current == BASE:
        promoted = history.current()
        current = Path(promoted) if promoted else None
    held_out = fingerprint(t.task_id for t in tasks)
    uses_before = history.uses(held_out)
    outcomes = evaluate({CURRENT: None if current is None else Path(current)})
    right = sum(o[CURRENT] for o in outcomes.values())
    problem = power_problem(right / max(1, len(outcomes)), len(outcomes), alpha=alpha)
    if problem:
        raise PromotionError(problem)
    for task_id, arm in evaluate({CANDIDATE: candidate}).items():
        outcomes[task_id][CANDIDATE] = arm[CANDIDATE]
    data = summarize(outcomes, base=CURRENT)
    eval_path = Path(out) / "eval.json"
    eval_path.parent.mkdir(parents=True, exist_ok=True)
    write_eval_json(eval_path, data)
    decision = decide(data, candidate=CANDIDATE, current=CURRENT, alpha=alpha)
    entry = history.append(
        Entry(
            "promote" if decision.promote else "refuse",
            candidate=str(candidate.resolve()),  # absolute: a server following the record runs elsewhere
            replaced=None if current is None else str(Path(current).resolve()),
            eval_path=str(eval_path),
            eval_sha256=sha256_of(eval_path),
            held_out=held_out,
            figures=decision.to_dict(),
            reason=decision.reason,
        )
    )
    return Result(decision, entry, eval_path, uses_before)
