"""Does a deployment's own store make its agent better? A replayed deployment, then `improve --from-store`.

    python bench/bench_production.py [--out DIR] [--scenarios base,weak] [--runs 1500] [--outcomes 0.3]
                                     [--flips 0,0.05,0.1] [--arms labelled,proposals,control] [--eval-tasks 150]

1. **ceiling**: `flowrl improve` with references, one round, bench_improve's defaults (100 train tasks x 4 samples
   at T=0.8, SFT on the runs graded right): the base model's held-out outcomes, and its round-1 adapter, the
   "weak but working" production model of the second scenario. Its gain is the ceiling: what known answers buy.
2. **stream**, per scenario (`base`: the base model in production; `weak`: the ceiling's round-1 adapter): the
   example agent serves `--runs` user tasks drawn at random (with repeats) from the suite's train part, at
   `--temperature`, through `hook_into_agent` into the scenario's store, 8 at a time, as a host would. Each run
   is graded here with the task's answer, and the grade is kept out of the store (`stream.json`): no reference
   answer is stored on any run.
3. **feedback**, per noise level: a copy of the store (trace files hard-linked) where the host recorded an
   outcome (`TraceStore.record_outcome`) for `--outcomes` of the runs (the same runs at every level), its
   `success` flipped on a share `--flips` of them (nested: the 5% flipped are among the 10%).
4. **arms**, each `flowrl.improve.improve` with `from_store=` the copy, the scenario's production model as the
   baseline (`adapter=`), and the 150 held-out tasks, which never occur in the stream:
   - `labelled`: `unlabelled="skip"`, trained on the runs the host said were right;
   - `proposals`: `unlabelled="learned"`: plus the learned reward's confident proposals (`--confidence`);
   - `control`: as many runs drawn at random from all of the store's (the loop's unfiltered control);
   - `rewards` (on request): `unlabelled="rewards"`, the command's default, the reward engine's verdicts.
   - `kto` (on request): `--method kto` on every labelled run, right and wrong, class weights from the data.
   Every arm checks the host's outcomes against the runs (`--check-outcomes`, default `engine`), and trains on from
   the scenario's production adapter (`--adapter`).
   Each cell's `DIR/<scenario>/flip-<pct>/eval.json` pairs every arm with the production model on the same tasks
   (Wilson intervals, McNemar's exact test); `flowrl.evaluate.results.verify` recomputes it.

Target: with 5% of verdicts flipped, held-out success significantly above the production model (McNemar
p < 0.01) from the recorded store alone, in the `weak` scenario. The production model's held-out outcomes are
measured once (the ceiling's base arm and round-1 arm) and each arm's improve reuses them (its resume file).
Every stage resumes from DIR; `DIR/bench.json` keeps it all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_P, TARGET_FLIP, TARGET_SCENARIO = 0.01, 0.05, "weak"
ARMS = ("labelled", "proposals", "control", "rewards", "kto")


class Prefixed:
    """One policy server for every improve call of the bench: each call's policy names under its own prefix."""

    def __init__(self, server: Any, prefix: str) -> None:
        self.server, self.prefix = server, prefix

    def policy(self, name: str, adapter: Path | None = None, **sampling: Any) -> Any:
        return self.server.policy(f"{self.prefix}/{name}", adapter, **sampling)


def _json(path: Path, data: Any) -> None:
    from flowrl.store.files import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(data, indent=2, default=str).encode())


def main() -> int:  # noqa: PLR0915 - one stage after another, each printed
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-production"))
    parser.add_argument("--scenarios", default="base,weak")
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--outcomes", type=float, default=0.3, help="share of runs the host records an outcome for")
    parser.add_argument("--flips", default="0,0.05,0.1", help="shares of recorded outcomes flipped")
    parser.add_argument("--arms", default="labelled,proposals,control")
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--check-outcomes", default="engine", choices=("engine", "off"))
    parser.add_argument("--method", default="sft")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--eval-tasks", type=int, default=150)
    parser.add_argument("--train-tasks", type=int, default=100, help="the ceiling's train tasks")
    parser.add_argument("--samples", type=int, default=4, help="the ceiling's runs per train task")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    flips = [float(f) for f in args.flips.split(",") if f]
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS] + [s for s in scenarios if s not in ("base", "weak")]
    if unknown:
        parser.error(f"unknown arm or scenario {unknown[0]!r}: arms {', '.join(ARMS)}; scenarios base, weak")

    from bench_improve import StageClock  # this folder is on sys.path when the script runs

    from flowrl.demo.example_agents import ExampleAgents, example_grade, example_tasks
    from flowrl.evaluate.results import read_eval_json
    from flowrl.improve.loop import ImproveConfig, improve
    from flowrl.models import ensure_default_model
    from flowrl.serve.policies import PolicyServer

    model = str(ensure_default_model())
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = example_tasks(args.train_tasks, args.eval_tasks, seed=args.seed)
    suite_train, _ = example_tasks(10_000, args.eval_tasks, seed=args.seed)  # the whole train part: users' tasks
    on_stage = StageClock()
    print(f"{os.cpu_count()} cores, load average {[round(x, 2) for x in os.getloadavg()]}", flush=True)
    report: dict[str, Any] = {"args": vars(args), "cells": {}}

    common = dict(base_model=model, epochs=args.epochs, seed=args.seed, concurrency=args.concurrency,
                  slots=args.concurrency)  # fmt: skip

    with ExampleAgents() as agents, PolicyServer(model, workdir=out, slots=args.concurrency) as server:
        on_stage("engine", f"{server.engine} at {server.url}")
        # 1. the ceiling: improve with references; its base and round-1 arms are the two production models
        ceiling = out / "ceiling"
        with_references = ImproveConfig(out=ceiling, method="sft", samples=args.samples, **common)
        (ceiling_result,) = improve(agents, train, held_out, example_grade, with_references,
                                    on_stage=on_stage, policies=Prefixed(server, "ceiling"))  # fmt: skip
        ceiling_eval = read_eval_json(ceiling_result.eval_path)
        report["ceiling"] = {"eval": str(ceiling_result.eval_path), "arms": ceiling_eval["arms"]}
        production = {
            "base": (None, _arm(ceiling_eval, "base")),
            "weak": (ceiling_result.adapter, _arm(ceiling_eval, "round-1")),
        }
        for scenario in scenarios:
            adapter, baseline = production[scenario]
            folder = out / scenario
            truth = _stream(folder, scenario, adapter, suite_train, args, agents, server, example_grade, on_stage)
            for flip in flips:
                cell = folder / f"flip-{round(flip * 100):02d}"
                store = _feedback(folder / "stream", cell / "store", truth, args.outcomes, flip, args.seed)
                cfg = dict(adapter=str(adapter) if adapter else None, method=args.method, confidence=args.confidence,
                           check_outcomes=args.check_outcomes, from_store=str(store), **common)  # fmt: skip
                result = _cell(cell, arms, baseline, held_out, cfg, agents, server, on_stage)
                report["cells"][f"{scenario}/{cell.name}"] = result
                _json(out / "bench.json", report)
    report["wall_s"] = round(on_stage.elapsed, 1)
    report["stages"] = on_stage.stages
    target = report["cells"].get(f"{TARGET_SCENARIO}/flip-{round(TARGET_FLIP * 100):02d}")
    if target is not None:
        met = {c["b"]: c["mcnemar_p"] < TARGET_P and c["diff"] > 0 for c in target["comparisons"]}
        report["target"] = met
        print(f"\ntarget (weak, 5% flipped, p < 0.01 above production): {met}")
    print(f"{on_stage.elapsed / 60:.1f} min in all")
    _json(out / "bench.json", report)
    return 0


def _cell(cell: Path, arms: list[str], baseline: dict[str, bool], held_out: list[Any], cfg: dict[str, Any],
          agents: Any, server: Any, on_stage: Any) -> dict[str, Any]:  # fmt: skip
    """Every arm of one scenario and noise level through `improve --from-store`, paired with the production
    model in `cell/eval.json`."""
    from flowrl.demo.example_agents import example_grade
    from flowrl.evaluate.results import format_table, read_eval_json, summarize, verify, write_eval_json
    from flowrl.improve.loop import ImproveConfig, improve

    per_arm: dict[str, dict[str, bool]] = {"production": baseline}
    selections: dict[str, Any] = {}
    control = "unfiltered" if "control" in arms else None  # the control trains beside the labelled arm
    runs = {"labelled": ("skip", control), "proposals": ("learned", None), "rewards": ("rewards", None),
            "kto": ("skip", None)}  # fmt: skip
    for arm, (unlabelled, with_control) in runs.items():
        if arm not in arms and not (arm == "labelled" and with_control):
            continue
        arm_out = cell / arm
        _json(arm_out / "base-outcomes.json", baseline)  # measured once, reused (the loop's resume file)
        # the kto arm: every labelled run, right and wrong, with the data's class weights (flowrl.data.kto)
        arm_cfg = {**cfg, "method": "kto"} if arm == "kto" else cfg
        config = ImproveConfig(out=arm_out, unlabelled=unlabelled, control=with_control, **arm_cfg)
        policies = Prefixed(server, f"{cell.parent.name}/{cell.name}/{arm}")
        (result,) = improve(agents, [], held_out, example_grade, config, on_stage=on_stage, policies=policies)
        data = read_eval_json(result.eval_path)
        selections[arm] = json.loads((arm_out / "round-1" / "select.json").read_text())["from_store"]
        if arm in arms:
            per_arm[arm] = _arm(data, "round-1")
        if with_control:
            per_arm["control"] = _arm(data, "control-1")
    outcomes = {t.task_id: {a: per_arm[a][t.task_id] for a in per_arm} for t in held_out}
    table = summarize(outcomes, base="production")
    write_eval_json(cell / "eval.json", table)
    problems = verify(read_eval_json(cell / "eval.json"))
    print(f"\n{cell}: verify {problems or 'ok'}; feedback {(cell / 'feedback.json').read_text()}")
    for line in format_table(table):
        print("  " + line)
    return {"eval": str(cell / "eval.json"), "arms": table["arms"], "comparisons": table["comparisons"],
            "selections": selections, "verify": problems,
            "feedback": json.loads((cell / "feedback.json").read_text())}  # fmt: skip


def _arm(data: dict[str, Any], arm: str) -> dict[str, bool]:
    """task_id -> outcome of one arm of an eval JSON."""
    return {t["task_id"]: t["outcomes"][arm] for t in data["tasks"]}


def _stream(folder: Path, scenario: str, adapter: Path | None, tasks: list[Any], args: Any, agents: Any, server: Any,
            grade: Any, on_stage: Any) -> dict[str, bool]:  # fmt: skip
    """The deployment: `args.runs` user tasks through the hooked agent into `folder/stream`; trace id -> right
    (graded here, kept out of the store)."""
    import asyncio

    from flowrl.evaluate.agent import run_tasks
    from flowrl.improve.agents import InProcess
    from flowrl.store.files import TraceStore

    marker = folder / "stream.json"
    if marker.exists():
        done = json.loads(marker.read_text())
        on_stage("stream", f"{scenario}: {len(done['right'])} runs already recorded (reused)")
        return {k: bool(v) for k, v in done["right"].items()}
    rng = random.Random(args.seed + 7)
    runs = [_UserRun(f"user-{i:05d}", rng.choice(tasks)) for i in range(args.runs)]
    policy = server.policy(f"production-{scenario}", adapter, temperature=args.temperature, seed=args.seed)
    shutil.rmtree(folder / "stream", ignore_errors=True)

    async def run(agent: Any, task: Any) -> str:
        return str(await agent.a_run(task.query, task.task_id))

    with InProcess(agents).open(policy, store=folder / "stream", metadata={}, hook_options={},
                                concurrency=args.concurrency) as opened:  # fmt: skip
        outcomes = asyncio.run(run_tasks(opened, runs, grade, run=run, concurrency=args.concurrency))
    by_session = {t.session_id: t.trace_id for t in TraceStore(folder / "stream").iter_traces()}
    right = {by_session[s]: ok for s, ok in outcomes.items() if s in by_session}
    n = len(right)
    _json(marker, {"runs": len(runs), "recorded": n, "hook": opened.stats, "right": right})
    on_stage("stream", f"{scenario}: {n} of {len(runs)} runs recorded, {sum(right.values())} right "
                       f"({sum(right.values()) / max(1, n):.1%}, graded out of the store)")  # fmt: skip
    return right


class _UserRun:
    """One user's request: a suite task, asked under its own session id (the grader reads `answer`)."""

    def __init__(self, session_id: str, task: Any) -> None:
        self.task_id, self.task = session_id, task
        self.query, self.answer = task.query, task.answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)


def _feedback(stream: Path, store: Path, truth: dict[str, bool], share: float, flip: float, seed: int) -> Path:
    """A copy of the stream's store where the host recorded an outcome for `share` of the runs, `flip` of those
    outcomes wrong; the same runs get an outcome at every noise level, and the flipped ones are nested."""
    from flowrl.improve.from_store import contradiction
    from flowrl.store.files import TraceStore

    marker = store.parent / "feedback.json"
    if marker.exists():
        return store
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(stream, store)
    ids = sorted(truth)
    rng = random.Random(seed + 11)
    told = rng.sample(ids, k=round(share * len(ids)))
    order = random.Random(seed + 13).sample(told, k=len(told))
    flipped = set(order[: round(flip * len(told))])
    target = TraceStore(store)
    for trace_id in told:
        target.record_outcome(trace_id, success=truth[trace_id] != (trace_id in flipped))
    said_right = [t for t in told if truth[t] != (t in flipped)]
    # how the engine's check (improve's --check-outcomes engine) reads the runs the host said were right
    asked = set(said_right)
    doubted = {t.trace_id for t in target.iter_traces() if t.trace_id in asked and contradiction(t)}
    _json(marker, {"told": len(told), "flipped": len(flipped), "said_right": len(said_right),
                   "truly_right_told": sum(truth[t] for t in told),
                   "false_right": sum((not truth[t]) and t in flipped for t in told),
                   "contradicted": {"truly_right": sum(truth[t] for t in doubted),
                                    "truly_wrong": sum(not truth[t] for t in doubted)}})  # fmt: skip
    return store


if __name__ == "__main__":
    sys.exit(main())
