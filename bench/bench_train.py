"""Benchmark: seconds per training step of `flowrl train` against the same TRL trainer called directly.

    python bench/bench_train.py                                # tiny random model, SFT and GRPO, 3 rounds
    python bench/bench_train.py --model smollm2-135m --methods sft --steps 6 --rounds 2

Both sides get the same TRL trainer: the same TRL config values, LoRA config, data and reward functions,
built by flowrl's adapter (`build_trl_trainer`), in one process. The raw side calls TRL's `.train()` itself
with only a step timer attached; the flowrl side runs `TrainingPipeline` (output-folder checks, metrics log,
Ctrl-C handler, step timer, then adapter save, card and run record). The figure compared is the median wall time
of an optimizer step (first step of each run left out: warm-up) over all runs of a side, the median of the
per-round ratios ("paired"), and the same for this process's CPU time per step, which other load on a shared
machine disturbs less (with `--threads 1`); runs alternate flowrl / raw for `--rounds` rounds so drift in
machine load hits both. Target: flowrl's per-step overhead within 5% of raw TRL.
The whole-run wall time (model load, tokenization, final saves) is reported too, but not held to the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model and dataset helpers

TARGET_OVERHEAD = 0.05


def length_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [min(1.0, len(t) / 40) for t in texts]


def make_config(method: str, model: str, data: Path, out: Path, steps: int) -> Any:
    from flowrl.train import TrainingConfig

    return TrainingConfig(
        method=method,
        dataset=data,
        base_model=model,
        output_dir=out,
        max_steps=steps,
        save_steps=10_000,
        max_completion_length=16,
        max_length=128,
        progress_bar=False,
        overwrite=True,
    )


def run_flowrl(cfg: Any, hw: Any) -> tuple[list[float], list[float], float]:
    from flowrl.train import TrainingPipeline
    from flowrl.train.callbacks import StepTimer

    started = time.perf_counter()
    funcs = [length_reward] if cfg.method == "grpo" else None
    timer = StepTimer()  # a second timer, for CPU time: the pipeline's own reports wall time only
    TrainingPipeline(cfg, hardware=hw, reward_funcs=funcs, callbacks=[timer]).run()
    return timer.durations, timer.cpu_durations, time.perf_counter() - started


def run_raw(cfg: Any, hw: Any) -> tuple[list[float], list[float], float]:
    """The same TRL trainer (built by flowrl's adapter from the same config), trained by calling TRL directly:
    no metrics log, no Ctrl-C handler, no output-folder checks, no card; only a step timer."""
    from flowrl.models import resolve_model
    from flowrl.train.callbacks import StepTimer
    from flowrl.train.data_io import load_dataset_dir
    from flowrl.train.hardware import resolve_settings
    from flowrl.train.trainers import build_trl_trainer

    started = time.perf_counter()
    data = load_dataset_dir(cfg.dataset)
    timer = StepTimer()
    trainer, _ = build_trl_trainer(
        cfg,
        resolve_settings(cfg, hw),
        resolve_model(cfg.base_model).path,
        data,
        Path(cfg.output_dir),
        [timer],
        reward_funcs=[length_reward] if cfg.method == "grpo" else None,
    )
    trainer.train()
    trainer.save_model(str(cfg.output_dir))
    return timer.durations, timer.cpu_durations, time.perf_counter() - started


def bench(method: str, model: str, steps: int, rounds: int, root: Path) -> dict[str, Any]:
    from helpers_tiny_train import write_tiny_dataset

    from flowrl.train.hardware import detect_hardware

    hw = detect_hardware()
    data = write_tiny_dataset(root / f"data-{method}", method, n=max(8, steps * 8))
    per_step: dict[str, list[float]] = {"flowrl": [], "raw": []}
    cpu_step: dict[str, list[float]] = {"flowrl": [], "raw": []}
    wall: dict[str, list[float]] = {"flowrl": [], "raw": []}
    ratios: list[float] = []
    for r in range(rounds):
        order = ("flowrl", "raw") if r % 2 == 0 else ("raw", "flowrl")
        round_median = {}
        for side in order:
            cfg = make_config(method, model, data, root / f"out-{method}-{side}", steps)
            durations, cpu, seconds = (run_flowrl if side == "flowrl" else run_raw)(cfg, hw)
            per_step[side].extend(durations[1:])
            cpu_step[side].extend(cpu[1:])
            wall[side].append(seconds)
            round_median[side] = statistics.median(durations[1:])
            print(
                f"  {method} round {r + 1} {side}: median {round_median[side]:.4f} s/step "
                f"({statistics.median(cpu[1:]):.4f} CPU s), run {seconds:.1f} s",
                file=sys.stderr,
            )
        ratios.append(round_median["flowrl"] / round_median["raw"])
    med = {k: statistics.median(v) for k, v in per_step.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu_step.items()}
    return {
        "method": method,
        "model": model,
        "steps_per_run": steps,
        "rounds": rounds,
        "hardware": hw.describe(),
        "flowrl_s_per_step": round(med["flowrl"], 4),
        "raw_trl_s_per_step": round(med["raw"], 4),
        "overhead": round(med["flowrl"] / med["raw"] - 1, 4),
        "overhead_paired": round(statistics.median(ratios) - 1, 4),
        "flowrl_cpu_s_per_step": round(cpu_med["flowrl"], 4),
        "raw_trl_cpu_s_per_step": round(cpu_med["raw"], 4),
        "overhead_cpu": round(cpu_med["flowrl"] / cpu_med["raw"] - 1, 4),
        "flowrl_run_s": round(statistics.median(wall["flowrl"]), 2),
        "raw_trl_run_s": round(statistics.median(wall["raw"]), 2),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| method | model | flowrl s/step | raw TRL s/step | overhead (wall) | paired | flowrl CPU s/step | "
        "raw CPU s/step | overhead (CPU) | flowrl run s | raw run s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['method']} | {r['model']} | {r['flowrl_s_per_step']:.4f} | {r['raw_trl_s_per_step']:.4f} | "
            f"{r['overhead']:+.1%} | {r['overhead_paired']:+.1%} | {r['flowrl_cpu_s_per_step']:.4f} | "
            f"{r['raw_trl_cpu_s_per_step']:.4f} | {r['overhead_cpu']:+.1%} | {r['flowrl_run_s']:.1f} | "
            f"{r['raw_trl_run_s']:.1f} |"
        )
    lines.append(
        f"\ntarget: flowrl's overhead within {TARGET_OVERHEAD:.0%} of raw TRL. On a shared machine wall time "
        "swings with other load; CPU time (this process only; use --threads 1) is the steadier figure."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="tiny", help="tiny (random 2-layer model, built here), smollm2-135m, or a path"
    )
    parser.add_argument("--methods", nargs="+", default=["sft", "grpo"], choices=["sft", "dpo", "kto", "grpo"])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="flowrl/raw pairs, alternating order")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="flowrl-bench-train-") as tmp:
        root = Path(tmp)
        model = args.model
        if model == "tiny":
            from helpers_tiny_train import build_tiny_model

            model = str(build_tiny_model(root / "tiny"))
        results = []
        for method in args.methods:
            row = bench(method, model, args.steps, args.rounds, root)
            row["model"] = args.model
            results.append(row)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
