"""Does GRPO add to SFT? `flowrl improve --method grpo` from the SFT benchmark's last adapter (issue 37).

    python bench/bench_grpo.py --sft DIR/seed-0 [--out DIR] [--rounds 2] [--train-tasks 100] [--eval-tasks 250]
                               [--max-steps N]

`--sft` is one seed's folder of `bench/bench_improve.py` (its `improve.json` gives the seed, the split and the
held-out families; its last `round-<r>/adapter` is where GRPO starts). GRPO runs on the same train tasks, with
`flowrl improve`'s own GRPO defaults (groups of 8, about 4 groups a step, 2 steps per batch of rollouts, lr 1e-4, beta
0), and its eval's base arm is the SFT adapter: every comparison is GRPO against the SFT model it started from.

The held-out set is the suite's held-out part (`--eval-tasks`, 250 by default, so that it holds at least 60 of the
tasks SFT leaves at 0: two-tool `multi-*` tasks and `summul`, "(a + b) * c"), plus the held-out families' tasks.
Printed and kept in `DIR/bench.json`: each round's arms and McNemar test, then the target subset (the `multi-*`
and `summul` families) apart: n, SFT's and GRPO's successes, the paired counts and McNemar's exact p. Target: GRPO
above SFT there with p < 0.01, within 60 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_FAMILIES = ("multi-mul", "multi-add", "multi-muladd", "multi-subfrom", "summul")
TARGET_P, TARGET_N, TARGET_S = 0.01, 60, 60 * 60


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", type=Path, required=True, help="one seed's folder of bench_improve.py")
    parser.add_argument("--out", type=Path, default=Path("bench-grpo"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-tasks", type=int, default=100)
    parser.add_argument("--eval-tasks", type=int, default=250)
    parser.add_argument("--engine", default="auto")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="optimizer steps a round (default: the command's, one pass over the kept groups, 2 steps a batch)",
    )
    args = parser.parse_args()

    from bench_improve import StageClock  # this folder is on sys.path when the script runs

    from flowrl.demo.example_agents import ExampleAgents, example_grade, example_tasks
    from flowrl.evaluate.results import format_table, summarize
    from flowrl.evaluate.stats import mcnemar_exact
    from flowrl.improve.loop import ImproveConfig, improve
    from flowrl.models import ensure_default_model

    sft = json.loads((args.sft / "improve.json").read_text())["config"]
    last = max(int(p.name.split("-")[1]) for p in args.sft.glob("round-*") if (p / "adapter").is_dir())
    start = args.sft / f"round-{last}" / "adapter"
    cfg = ImproveConfig(
        out=args.out,
        rounds=args.rounds,
        method="grpo",
        base_model=str(ensure_default_model()),
        adapter=str(start),
        seed=sft["seed"],
        engine=args.engine,
        hold_out_families=sft.get("hold_out_families"),
        unseen_tasks=sft.get("unseen_tasks", 60),
        max_steps=args.max_steps,
    )
    train, held_out = example_tasks(
        args.train_tasks, args.eval_tasks, seed=cfg.seed, hold_out=cfg.unseen_families, unseen=cfg.unseen_tasks
    )
    targets = sum(t.family in TARGET_FAMILIES for t in held_out)
    print(
        f"{os.cpu_count()} cores, load average {[round(x, 2) for x in os.getloadavg()]}; GRPO from {start}; "
        f"{len(train)} train tasks, {len(held_out)} held-out ({targets} of the target families)",
        flush=True,
    )
    on_stage = StageClock()
    with ExampleAgents() as agents:
        results = improve(agents, train, held_out, example_grade, cfg, on_stage=on_stage)
    wall = on_stage.elapsed

    rounds: list[dict[str, Any]] = []
    for result in results:
        data = json.loads(result.eval_path.read_text())
        arm = f"round-{result.round}"
        in_target = [t for t in data["tasks"] if t.get("family") in TARGET_FAMILIES]
        target = summarize({t["task_id"]: t["outcomes"] for t in in_target}, base="base") if in_target else None
        print(f"\nround {result.round} (base = the SFT adapter):")
        for line in format_table(data):
            print("  " + line)
        if target:
            c = next(c for c in target["comparisons"] if c["b"] == arm)
            print(
                f"  target families (two-tool, summul), n = {c['both'] + c['only_a'] + c['only_b'] + c['neither']}: "
                f"SFT {target['arms']['base']['successes']}, GRPO {target['arms'][arm]['successes']}; "
                f"McNemar exact p = {mcnemar_exact(c['only_a'], c['only_b']):.3g}"
            )
        rounds.append(
            {
                "round": result.round,
                "select": json.loads((result.eval_path.parent / "select.json").read_text()),
                "train": json.loads((result.eval_path.parent / "train.json").read_text()),
                "arms": data["arms"],
                "comparisons": data["comparisons"],
                "subsets": data.get("subsets"),
                "target": target and {"arms": target["arms"], "comparisons": target["comparisons"]},
            }
        )
    final = rounds[-1]
    comparison = (final["target"] or {}).get("comparisons", [{}])[0]
    n = sum(comparison.get(k, 0) for k in ("both", "only_a", "only_b", "neither"))
    checks = {
        "GRPO above SFT on the target families": comparison.get("diff", 0) > 0,
        "McNemar p < 0.01": comparison.get("mcnemar_p", 1.0) < TARGET_P,
        "n >= 60": n >= TARGET_N,
        "within 60 min": wall <= TARGET_S,
    }
    verdict = "met" if all(checks.values()) else "not met (" + ", ".join(k for k, ok in checks.items() if not ok) + ")"
    print(f"\n{wall / 60:.1f} min in all; target: {verdict}")
    out = {
        "args": vars(args),
        "start_adapter": str(start),
        "seed": cfg.seed,
        "wall_s": round(wall, 1),
        "stages": on_stage.stages,
        "rounds": rounds,
        "target": {"families": TARGET_FAMILIES, "checks": checks, "met": all(checks.values())},
    }
    (args.out / "bench.json").write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
