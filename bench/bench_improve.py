"""Does `flowrl improve` make the example agent better? Held-out success before and after, with statistics.

    python bench/bench_improve.py [--out DIR] [--rounds 2] [--train-tasks 100] [--eval-tasks 150] [--seeds 0,1,2]
                                  [--control unfiltered] [--hold-out-families mulsub,atomic-number]

`flowrl improve`'s own defaults (samples, method, epochs, temperature, engine, concurrency, unseen tasks) unless
given: they are read from `ImproveConfig`. Two rounds and 100 train tasks (the command's defaults: 1 and 200) so
that three seeds fit in a session on 2 cores.

SmolLM2-135M-Instruct on this machine's CPU, the example agent (tools executed in the sandbox), the generated
task suite (train and held-out parts never overlap). It runs `flowrl.improve.improve` exactly as `flowrl improve`
does and times every stage. Each round's `DIR/round-<r>/eval.json` holds the per-task outcomes of the base, the
round's adapter and (with `--control unfiltered`) the control adapter, trained on as many runs drawn without
looking at their grade.

Printed: the machine (cores, load average at the start and the end), each stage's seconds, then per round the
arms' n, successes, rate with its Wilson 95% interval, and against the base the paired counts, McNemar's exact p
and the difference with its bootstrap 95% interval. Then whether the target was met: held-out success of at
least 40%, McNemar p < 0.01, at least 150 held-out tasks, within 30 minutes. `DIR/bench.json` keeps it all.
The run resumes from DIR if it was stopped (stage times then cover only what ran this time). With several
`--seeds`, each seed runs in `DIR/seed-<s>/` (its own split, sampling and training), and the end prints each
seed's final round against the base and its control, over all held-out tasks and over the unseen families
apart, with min / median / max of the round's rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import fields
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
    from flowrl.improve.config import ImproveConfig

    default = {f.name: f.default for f in fields(ImproveConfig)}  # the command's defaults, one source
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-improve"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-tasks", type=int, default=100)
    parser.add_argument("--samples", type=int, default=default["samples"])
    parser.add_argument("--eval-tasks", type=int, default=150)
    parser.add_argument("--control", default="unfiltered", help="unfiltered, or none")
    parser.add_argument("--method", default=default["method"])
    parser.add_argument("--epochs", type=float, default=default["epochs"])
    parser.add_argument("--temperature", type=float, default=default["temperature"])
    parser.add_argument("--engine", default=default["engine"])
    parser.add_argument("--concurrency", type=int, default=default["concurrency"], help="runs at a time, and slots")
    parser.add_argument("--seeds", default="0", help="comma-separated: each seed's split, sampling and training")
    parser.add_argument("--hold-out-families", default=None, help="families kept out of training, reported apart")
    parser.add_argument("--unseen-tasks", type=int, default=default["unseen_tasks"])
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    machine = {
        "cores": os.cpu_count(),
        "cpu": _cpu(),
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"{machine['cores']} cores ({machine['cpu']}), load average {machine['load_start']}", flush=True)
    runs = {seed: run_seed(args, seed, args.out / f"seed-{seed}" if len(seeds) > 1 else args.out) for seed in seeds}
    machine["load_end"] = [round(x, 2) for x in os.getloadavg()]
    spread = _spread(runs)
    for line in spread["lines"]:
        print(line)
    out = {"args": vars(args), "machine": machine, "seeds": runs, "spread": spread}
    (args.out / "bench.json").write_text(json.dumps(out, indent=2, default=str))
    return 0


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> dict[str, Any]:
    """One seed of the benchmark in `out`: its rounds' figures, stage times and the target check."""
    from flowrl.demo.example_agents import ExampleAgents, example_grade, example_tasks
    from flowrl.evaluate.results import format_table
    from flowrl.improve.loop import ImproveConfig, improve
    from flowrl.models import ensure_default_model

    model_dir = ensure_default_model()
    cfg = ImproveConfig(
        out=out,
        rounds=args.rounds,
        samples=args.samples,
        method=args.method,
        base_model=str(model_dir),
        control=None if args.control == "none" else args.control,
        temperature=args.temperature,
        concurrency=args.concurrency,
        epochs=args.epochs,
        seed=seed,
        engine=args.engine,
        slots=args.concurrency,
        hold_out_families=args.hold_out_families,
        unseen_tasks=args.unseen_tasks,
    )
    train, held_out = example_tasks(
        args.train_tasks, args.eval_tasks, seed=seed, hold_out=cfg.unseen_families, unseen=cfg.unseen_tasks
    )
    print(f"seed {seed}: {len(train)} train tasks, {len(held_out)} held-out ({out})", flush=True)
    on_stage = StageClock()
    with ExampleAgents() as agents:
        results = improve(agents, train, held_out, example_grade, cfg, on_stage=on_stage)
    wall = on_stage.elapsed

    rounds = []
    for result in results:
        data = json.loads(result.eval_path.read_text())
        print(
            f"\nseed {seed}, round {result.round}: {result.collected} runs collected, {result.right} right, "
            f"{result.selected} selected ({result.eval_path})"
        )
        for line in format_table(data):
            print("  " + line)
        trained = json.loads((result.eval_path.parent / "train.json").read_text())
        rounds.append(
            {
                "round": result.round,
                "collected": result.collected,
                "right": result.right,
                "selected": result.selected,
                "eval": str(result.eval_path),
                "train": trained,
                "arms": data["arms"],
                "comparisons": data["comparisons"],
                "subsets": data.get("subsets"),
            }
        )
    final = rounds[-1]
    arm = final["arms"][f"round-{final['round']}"]
    comparison = next(c for c in final["comparisons"] if c["a"] == "base" and c["b"] == f"round-{final['round']}")
    checks = {
        "rate >= 40%": arm["rate"] >= TARGET_RATE,
        "McNemar p < 0.01": comparison["mcnemar_p"] < TARGET_P,
        "n >= 150": arm["n"] >= TARGET_N,
        "within 30 min": wall <= TARGET_S,
    }
    verdict = "met" if all(checks.values()) else "not met (" + ", ".join(k for k, ok in checks.items() if not ok) + ")"
    print(f"\nseed {seed}: {wall / 60:.1f} min in all")
    print(f"target (>= 40% held-out success, p < 0.01, n >= 150, <= 30 min): {verdict}")
    return {
        "wall_s": round(wall, 1),
        "stages": on_stage.stages,
        "rounds": rounds,
        "target": {"checks": checks, "met": all(checks.values())},
    }


def _spread(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each seed's final round against the base and its control, over all held-out tasks and over the unseen
    families, and min / median / max of the rates across seeds."""
    rows, lines = [], []
    for seed, run in runs.items():
        final = run["rounds"][-1]
        r = final["round"]
        for subset, figures in [("all", final), *((k, v) for k, v in (final.get("subsets") or {}).items())]:
            row: dict[str, Any] = {"seed": seed, "subset": subset, "n": figures["arms"]["base"]["n"]}
            for name in ("base", f"round-{r}", f"control-{r}"):
                if name in figures["arms"]:
                    row[name.split("-")[0]] = figures["arms"][name]["rate"]
            for c in figures["comparisons"]:
                row[f"p {c['b'].split('-')[0]} vs {c['a'].split('-')[0]}"] = c["mcnemar_p"]
            rows.append(row)
            lines.append(
                f"seed {seed} {subset:<6} n={row['n']}: "
                + ", ".join(
                    f"{k} {v:.1%}" if not k.startswith("p ") else f"{k} {v:.2g}"
                    for k, v in row.items()
                    if k not in ("seed", "subset", "n")
                )
            )
    for subset in sorted({row["subset"] for row in rows}):
        rates = sorted(row["round"] for row in rows if row["subset"] == subset and "round" in row)
        if rates:
            lines.append(
                f"{subset}: round rate over {len(rates)} seeds min {rates[0]:.1%}, "
                f"median {statistics.median(rates):.1%}, max {rates[-1]:.1%}"
            )
    return {"rows": rows, "lines": lines}


if __name__ == "__main__":
    sys.exit(main())
