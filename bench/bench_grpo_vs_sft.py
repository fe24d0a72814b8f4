"""Online GRPO through the agent against rejection-sampling SFT, at the same generation budget (issue 14).

    python bench/bench_grpo_vs_sft.py [--out DIR] [--train-tasks 50] [--samples 4] [--eval-tasks 150]
                                      [--epochs 3] [--temperature 0.7] [--engine auto]

Both arms start from SmolLM2-135M-Instruct and see the same training tasks, each run `--samples` times through
the example agent (tools executed), so both generate `train-tasks x samples` agent episodes:

- **sft**: one `flowrl improve` round: the episodes sampled with llama.cpp at `--temperature`, the runs graded
  right kept, SFT on them (`DIR/sft/`, its `round-1/eval.json` holds base and round-1);
- **grpo**: `flowrl train --method grpo --agent example`: one task per step, its `--samples` episodes sampled
  from the live policy in transformers at the same temperature form the group, rewards from the engine on the
  executed traces (`DIR/grpo/`, the rollouts in `DIR/grpo/rollouts`).

Both adapters are then evaluated greedily on the same held-out tasks (llama.cpp). Printed and kept in
`DIR/eval.json` (arms against the base) and `DIR/grpo-vs-sft.json` (grpo against sft): n, successes, the rate
with its Wilson 95% interval, the paired counts, McNemar's exact p and the difference with its bootstrap
interval; `DIR/bench.json` adds each stage's seconds and the load average. Stopped runs resume from DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-grpo-vs-sft"))
    parser.add_argument("--train-tasks", type=int, default=50)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=150)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from bench_improve import StageClock  # this folder is on sys.path when the script runs

    from flowrl.demo.example_agents import ExampleAgents, example_adapter, example_grade, example_tasks
    from flowrl.evaluate.results import format_table, summarize, write_eval_json
    from flowrl.improve.loop import Improve, ImproveConfig
    from flowrl.models import ensure_default_model
    from flowrl.train import TrainingConfig, TrainingPipeline

    model_dir = ensure_default_model()
    train, held_out = example_tasks(args.train_tasks, args.eval_tasks, seed=args.seed)
    episodes = args.train_tasks * args.samples
    on_stage = StageClock()

    print(
        f"{os.cpu_count()} cores, load average {[round(x, 2) for x in os.getloadavg()]}; "
        f"{episodes} agent episodes per arm ({args.train_tasks} tasks x {args.samples})",
        flush=True,
    )
    with ExampleAgents() as agents:
        cfg = ImproveConfig(
            out=args.out / "sft",
            rounds=1,
            samples=args.samples,
            base_model=str(model_dir),
            control=None,
            temperature=args.temperature,
            concurrency=8,
            epochs=args.epochs,
            seed=args.seed,
            engine=args.engine,
        )
        loop = Improve(agents, train, held_out, example_grade, cfg, on_stage=on_stage)
        (sft,) = loop.run()

        grpo_dir = args.out / "grpo"
        if not (grpo_dir / "adapter_config.json").exists():
            adapter = example_adapter(train_tasks=args.train_tasks, seed=args.seed)
            config = TrainingConfig(
                method="grpo",
                agent="example",
                output_dir=grpo_dir,
                max_steps=args.train_tasks,
                num_generations=args.samples,
                per_device_train_batch_size=args.samples,
                gradient_accumulation_steps=1,
                temperature=args.temperature,
                seed=args.seed,
                progress_bar=False,
                overwrite=True,
                save_steps=10,
            )
            result = TrainingPipeline(config, agent=adapter).run()
            rollouts = result.info.get("rollouts") or {}
            on_stage(
                "grpo",
                f"{result.global_step} steps, {rollouts.get('episodes')} episodes, "
                f"{rollouts.get('tool_calls')} tool calls, masked {rollouts.get('masked')}",
            )
        else:
            on_stage("grpo", "already trained (reused)")
        grpo = loop._eval_arm("grpo", grpo_dir)
        on_stage("eval", f"grpo: {sum(grpo.values())} of {len(grpo)} held-out tasks right")

    per_task = {t["task_id"]: t["outcomes"] for t in json.loads(sft.eval_path.read_text())["tasks"]}
    outcomes = {
        tid: {"base": arms["base"], "sft": arms["round-1"], "grpo": grpo[tid]} for tid, arms in per_task.items()
    }
    data = summarize(outcomes, base="base")
    head_to_head = summarize({tid: {"sft": o["sft"], "grpo": o["grpo"]} for tid, o in outcomes.items()}, base="sft")
    write_eval_json(args.out / "eval.json", data)
    write_eval_json(args.out / "grpo-vs-sft.json", head_to_head)
    print()
    for line in [*format_table(data), "", *format_table(head_to_head)]:
        print(line)
    wall = on_stage.elapsed
    (args.out / "bench.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "episodes_per_arm": episodes,
                "wall_s": round(wall, 1),
                "stages": on_stage.stages,
                "arms": data["arms"],
                "comparisons": data["comparisons"] + head_to_head["comparisons"],
            },
            indent=2,
            default=str,
        )
    )
    print(f"\n{wall / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
