"""The secondary figures of an agent eval: each reward's mean per arm, over the same tasks.

Success (`eval.json`) is the primary figure. The reward engine's other rewards (tool success, efficiency, format,
...) say how the runs went. Each reward is averaged per arm over the tasks where every arm's run got a value for
it: a reward that cannot judge one arm's run leaves that task out for every arm, so two arms are never averaged
over different tasks. A run that crashed a reward counts as no value (and is counted in `errors`).

    {"rewards": {"<reward>": {"n": 148, "means": {"<arm>": 0.42}, "errors": 0}}}

is written beside `eval.json` as `rewards.json` (the eval.json schema has no place for it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import score_store
from flowrl.store.files import TraceStore, atomic_write_bytes

TaskOf = Callable[[Any], str | None]  # trace -> task id


def eval_task_id(trace: Any) -> str | None:
    """The task of a run captured by `run_arms` (session id `eval-<task_id>`)."""
    session = trace.session_id or ""
    return session[len("eval-") :] if session.startswith("eval-") else None


def reward_means(
    stores: dict[str, Path], task_ids: list[str], *, task_of: TaskOf = eval_task_id, engine: Any = None
) -> dict[str, Any]:
    """Score every arm's store (what is not scored yet) and average each reward per arm over the shared tasks."""
    wanted = set(task_ids)
    per_arm: dict[str, dict[str, dict[str, float | None]]] = {}
    errors: dict[str, int] = {}
    own = engine is None
    engine = engine or RewardEngine().__enter__()
    try:
        for arm, root in stores.items():
            store = TraceStore(root)
            score_store(store, engine, max_error_rate=1.0)
            latest: dict[str, tuple[str, dict[str, float | None]]] = {}
            for trace in store.iter_traces():
                task = task_of(trace)
                if task not in wanted:
                    continue
                for name, detail in (trace.reward_details or {}).items():
                    if isinstance(detail, dict) and detail.get("error"):
                        errors[name] = errors.get(name, 0) + 1
                if task not in latest or trace.timestamp >= latest[task][0]:
                    latest[task] = (trace.timestamp, dict(trace.rewards or {}))
            per_arm[arm] = {task: rewards for task, (_, rewards) in latest.items()}
    finally:
        if own:
            engine.__exit__(None, None, None)
    names = sorted({name for runs in per_arm.values() for rewards in runs.values() for name in rewards})
    out: dict[str, Any] = {}
    for name in names:
        shared = [t for t in task_ids if all(per_arm[arm].get(t, {}).get(name) is not None for arm in per_arm)]
        out[name] = {
            "n": len(shared),
            "errors": errors.get(name, 0),
            "means": {
                arm: (
                    round(sum(per_arm[arm][t][name] for t in shared) / len(shared), 6)  # type: ignore[misc]
                    if shared
                    else None
                )
                for arm in per_arm
            },
        }
    return {"rewards": out}


def write_rewards_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(Path(path), json.dumps(data, indent=2).encode("utf-8"))


def format_rewards(data: dict[str, Any]) -> list[str]:
    """One line per reward: its mean per arm, and over how many tasks."""
    lines = []
    for name, entry in data["rewards"].items():
        if not entry["n"]:
            lines.append(f"{name}: judged no task in every arm (a reference answer or tool call it needs is missing)")
            continue
        means = ", ".join(f"{arm} {'n/a' if v is None else f'{v:.3f}'}" for arm, v in entry["means"].items())
        lines.append(f"{name}: {means} (over the same {entry['n']} tasks)")
    return lines
