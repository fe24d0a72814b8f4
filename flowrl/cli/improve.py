"""`flowrl improve` (the collect -> train -> eval rounds) and `flowrl eval-agent` (the agent loop on held-out
tasks, with statistics): thin over flowrl.improve and flowrl.evaluate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import typer

METHOD_HELP = (
    "sft: rejection sampling on the runs graded right (STaR / ReST-EM); kto: every run, labelled by its grade."
)


def _progress_ui():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    screen = Console(file=sys.stdout, soft_wrap=True)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=screen,
        transient=True,
    )
    bars: dict[str, int] = {}

    def on_progress(stage: str, done: int, total: int) -> None:
        if stage not in bars:
            bars[stage] = progress.add_task(stage, total=total)
        progress.update(bars[stage], completed=done, total=total)
        if done >= total:
            progress.remove_task(bars.pop(stage))

    def on_stage(stage: str, summary: str) -> None:
        progress.console.print(f"[green]✓[/green] [bold]{stage:<8}[/bold] {summary}", highlight=False)

    return progress, on_progress, on_stage


def improve_cmd(
    out: Path = typer.Option(Path("improve-out"), "--out", "-o", help="Folder for every round (resumable)."),
    rounds: int = typer.Option(1, "--rounds", "-r", min=1, help="Rounds of collect, score, select, train, eval."),
    train_tasks: int = typer.Option(200, "--train-tasks", min=1, help="Train tasks the agent runs each round."),
    eval_tasks: int = typer.Option(150, "--eval-tasks", min=1, help="Held-out tasks each arm is graded on."),
    samples: int = typer.Option(4, "--samples", "-k", min=1, help="Runs per train task per round."),
    method: str = typer.Option("sft", "--method", "-m", help=METHOD_HELP),
    base_model: str = typer.Option("smollm2-135m", "--base-model", "-b", help="Model behind the agent."),
    control: str | None = typer.Option(
        None, "--control", help="unfiltered: also train on as many runs drawn at random (right or wrong)."
    ),
    temperature: float = typer.Option(0.8, "--temperature", help="Sampling temperature while collecting."),
    eval_temperature: float = typer.Option(0.0, "--eval-temperature", help="Temperature in eval (0: greedy)."),
    epochs: float = typer.Option(2.0, "--epochs", help="Training epochs over the round's set."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Training steps per round (instead of epochs)."),
    learning_rate: float | None = typer.Option(
        None, "--learning-rate", help="LoRA learning rate (default: the method's)."
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        min=1,
        help="Agent runs at a time (default: 1 on llama.cpp, 8 on transformers, which batches them).",
    ),
    engine: str = typer.Option(
        "auto",
        "--engine",
        help="Generation: llama.cpp, transformers, or auto (llama.cpp when llama-cpp-python is installed).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the task split, sampling and training."),
) -> None:
    """Make the example agent better, round by round, and prove it on held-out tasks (eval.json per round)."""
    from flowrl.demo.example_agents import ExampleAgents, example_grade, example_tasks
    from flowrl.improve.loop import ImproveConfig, improve
    from flowrl.models import resolve_model

    model = resolve_model(base_model)
    train, held_out = example_tasks(train_tasks, eval_tasks, seed=seed)
    progress, on_progress, on_stage = _progress_ui()
    with progress, ExampleAgents(model.path, engine=engine) as agents:
        cfg = ImproveConfig(
            out=out,
            rounds=rounds,
            samples=samples,
            method=cast(Any, method),  # ImproveConfig checks it and names the allowed values
            base_model=base_model,
            control=cast(Any, control),
            temperature=temperature,
            eval_temperature=eval_temperature,
            concurrency=concurrency or agents.concurrency,
            epochs=epochs,
            max_steps=max_steps,
            learning_rate=learning_rate,
            seed=seed,
        )
        on_stage("engine", f"{agents.engine}, {cfg.concurrency} runs at a time")
        results = improve(agents, train, held_out, example_grade, cfg, on_stage=on_stage, on_progress=on_progress)
    last = results[-1]
    arm = last.arms.get(f"round-{last.round}", {})
    base = last.arms.get("base", {})
    typer.echo(
        f"round {last.round}: held-out success {base.get('rate', 0):.1%} (base) -> {arm.get('rate', 0):.1%}; "
        f"eval: {last.eval_path}"
    )


def register(app: typer.Typer) -> None:
    app.command("improve")(improve_cmd)
