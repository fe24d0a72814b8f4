"""Does `flowrl improve` make the example agent better? Held-out success before and after, with statistics.

    python bench/bench_improve.py [--out DIR] [--rounds 2] [--train-tasks 100] [--samples 4] [--eval-tasks 150]
                                  [--control unfiltered] [--engine auto] [--method sft] [--epochs 2]

SmolLM2-135M-Instruct on this machine's CPU, the example agent (tools executed in the sandbox), the generated
task suite (train and held-out parts never overlap). It runs `flowrl.improve.improve` exactly as `flowrl improve`
does and times every stage. Each round's `DIR/round-<r>/eval.json` holds the per-task outcomes of the base, the
round's adapter and (with `--control unfiltered`) the control adapter, trained on as many runs drawn without
looking at their grade.

Printed: the machine (cores, load average at the start and the end), each stage's seconds, then per round the
arms' n, successes, rate with its Wilson 95% interval, and against the base the paired counts, McNemar's exact p
and the difference with its bootstrap 95% interval. Then whether the target was met: held-out success of at
least 40%, McNemar p < 0.01, at least 150 held-out tasks, within 30 minutes. `DIR/bench.json` keeps it all.
The run resumes from DIR if it was stopped (stage times then cover only what ran this time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_RATE, TARGET_P, TARGET_N, TARGET_S = 0.40, 0.01, 150, 30 * 60


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class StageClock:
    """`clock(stage, summary)`: prints the stage with its seconds and keeps it (with the load average) in `stages`;
    `elapsed` is the seconds since the clock was made. The improve loop's `on_stage`; bench_grpo_vs_sft uses it too."""

    def __init__(self) -> None:
        self.stages: list[dict[str, Any]] = []
        self.start = self.last = time.perf_counter()

    def __call__(self, stage: str, summary: str) -> None:
        now = time.perf_counter()
        self.stages.append(
            {
                "stage": stage,
                "seconds": round(now - self.last, 1),
                "summary": summary,
                "load": round(os.getloadavg()[0], 2),
            }
        )
        print(f"[{now - self.start:7.1f} s] {stage:<8} +{now - self.last:6.1f} s  {summary}", flush=True)
        self.last = now

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-improve"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-tasks", type=int, default=100)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=150)
    parser.add_argument("--control", default="unfiltered", help="unfiltered, or none")
    parser.add_argument("--method", default="sft")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--concurrency", type=int, default=8, help="agent runs at a time, and the engine's slots")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from flowrl.demo.example_agents import ExampleAgents, example_grade, example_tasks
    from flowrl.evaluate.results import format_table
    from flowrl.improve.loop import ImproveConfig, improve
    from flowrl.models import ensure_default_model

    model_dir = ensure_default_model()
    train, held_out = example_tasks(args.train_tasks, args.eval_tasks, seed=args.seed)
    machine = {
        "cores": os.cpu_count(),
        "cpu": _cpu(),
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"{machine['cores']} cores ({machine['cpu']}), load average {machine['load_start']}", flush=True)
    on_stage = StageClock()

    with ExampleAgents() as agents:
        cfg = ImproveConfig(
            out=args.out,
            rounds=args.rounds,
            samples=args.samples,
            method=args.method,
            base_model=str(model_dir),
            control=None if args.control == "none" else args.control,
            temperature=args.temperature,
            concurrency=args.concurrency,
            epochs=args.epochs,
            seed=args.seed,
            engine=args.engine,
            slots=args.concurrency,
        )
        results = improve(agents, train, held_out, example_grade, cfg, on_stage=on_stage)
    wall = on_stage.elapsed
    machine["load_end"] = [round(x, 2) for x in os.getloadavg()]

    rounds = []
    for result in results:
        data = json.loads(result.eval_path.read_text())
        print(
            f"\nround {result.round}: {result.collected} runs collected, {result.right} right, "
            f"{result.selected} selected ({result.eval_path})"
        )
        for line in format_table(data):
            print("  " + line)
        rounds.append(
            {
                "round": result.round,
                "collected": result.collected,
                "right": result.right,
                "selected": result.selected,
                "eval": str(result.eval_path),
                "arms": data["arms"],
                "comparisons": data["comparisons"],
            }
        )
    final = rounds[-1]
    arm = final["arms"][f"round-{final['round']}"]
    comparison = next(c for c in final["comparisons"] if c["b"] == f"round-{final['round']}")
    checks = {
        "rate >= 40%": arm["rate"] >= TARGET_RATE,
        "McNemar p < 0.01": comparison["mcnemar_p"] < TARGET_P,
        "n >= 150": arm["n"] >= TARGET_N,
        "within 30 min": wall <= TARGET_S,
    }
    verdict = "met" if all(checks.values()) else "not met (" + ", ".join(k for k, ok in checks.items() if not ok) + ")"
    print(f"\n{wall / 60:.1f} min in all; load average {machine['load_start']} -> {machine['load_end']}")
    print(f"target (>= 40% held-out success, p < 0.01, n >= 150, <= 30 min): {verdict}")
    out = {
        "args": vars(args),
        "machine": machine,
        "wall_s": round(wall, 1),
        "stages": on_stage.stages,
        "rounds": rounds,
        "target": {"checks": checks, "met": all(checks.values())},
    }
    (args.out / "bench.json").write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
