"""Before/after evaluation of the example agent: the agent loop, tools and all, on held-out tasks.

`flowrl eval` scores one reply per prompt. An agent is used differently: it calls tools and answers
over several turns. So the demo runs the whole agent with the base model and with each trained
adapter, greedily (temperature 0, so the comparison is not luck), on the tasks the dataset split held
out, scores the traces with the reward engine, and writes the same `eval_report.json` as `flowrl eval`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from flowrl.demo.tasks import BY_QUERY, Task, annotate
from flowrl.store import TraceStore, atomic_write_bytes


def held_out_tasks(dataset_dir: Path) -> list[Task]:
    """The example agent's tasks whose user turn is in the dataset's validation split."""
    path = dataset_dir / "data" / "validation.jsonl"
    tasks: dict[str, Task] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            users = [m.get("content") for m in row.get("prompt") or [] if isinstance(m, dict) and m.get("role") == "user"]
            task = BY_QUERY.get(users[-1]) if users else None
            if task is not None:
                tasks[task.task_id] = task
    return list(tasks.values())


async def _run_agent(model_dir: Path, adapter: Path | None, tasks: list[Task], store: TraceStore,
                     sandbox: Any, seed: int) -> None:
    from flowrl.capture import hook_into_agent
    from flowrl.demo.agent import ExampleAgent
    from flowrl.demo.backend import TransformersBackend

    backend = TransformersBackend(model_dir, adapter=adapter, max_new_tokens=64, temperature=0.0, seed=seed)
    agent = ExampleAgent(backend, name="example_agent_eval", sandbox=sandbox, seed=seed)
    hook = hook_into_agent(agent, store=store)
    try:
        for task in tasks:
            await agent.a_run(task.query, session_id=f"eval-{task.task_id}")
    finally:
        hook.flush()
        hook.unhook()
    annotate(store)


def _scores(store: TraceStore, engine: Any) -> tuple[dict[str, float | None], float | None, list[dict[str, Any]]]:
    traces = list(store.iter_traces())
    results = engine.compute_batch(traces)
    per: dict[str, list[float]] = {name: [] for name in engine.names}
    combined: list[float] = []
    samples = []
    for trace, res in zip(traces, results):
        for name, r in res.items():
            if r.value is not None:
                per[name].append(r.value)
        c = engine.compute_combined(res)
        if c is not None:
            combined.append(c)
        samples.append({"query": trace.user_query, "answer": trace.final_response[:300],
                        "tools": [t.tool_name for t in trace.tool_calls], "combined": c,
                        "rewards": {n: r.value for n, r in res.items()}})
    means = {n: (sum(v) / len(v) if v else None) for n, v in per.items()}
    return means, (sum(combined) / len(combined) if combined else None), samples


def _pair(base: list[dict[str, Any]], trained: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_query = {s["query"]: s for s in base}
    return [{"query": s["query"], "baseline": by_query.get(s["query"]), "model": s} for s in trained]


def evaluate_agent(model_dir: Path, adapters: dict[str, Path], tasks: list[Task], out: Path, *,
                   seed: int = 0) -> dict[str, dict[str, Any]]:
    """Run base and every adapter on `tasks`; write `out/<name>/eval_report.json` for each adapter."""
    from flowrl.rewards import RewardEngine
    from flowrl.rewards.sandbox import Sandbox

    stores = {"base": TraceStore(out / "base" / "traces")}
    stores.update({name: TraceStore(out / name / "traces") for name in adapters})
    with Sandbox(workers=1) as sandbox:
        for name, store in stores.items():
            if store.count() == 0:
                asyncio.run(_run_agent(model_dir, adapters.get(name), tasks, store, sandbox, seed))
    reports: dict[str, dict[str, Any]] = {}
    with RewardEngine() as engine:
        base_means, base_comb, base_samples = _scores(stores["base"], engine)
        for name, adapter in adapters.items():
            means, comb, samples = _scores(stores[name], engine)
            report = {
                "model": str(adapter), "baseline": str(model_dir), "n_prompts": len(tasks),
                "prompts_source": "held-out tasks of the example agent (agent loop, greedy)",
                "per_reward": {n: {"baseline": base_means.get(n), "model": means.get(n)} for n in engine.names},
                "combined": {"baseline": base_comb, "model": comb},
                "samples": _pair(base_samples, samples),
            }
            path = out / name / "eval_report.json"
            atomic_write_bytes(path, json.dumps(report, indent=2, default=str).encode("utf-8"))
            reports[name] = report
    return reports
