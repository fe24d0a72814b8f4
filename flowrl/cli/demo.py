"""`flowrl demo`: the whole loop on a local model (see flowrl.demo.run)."""

from __future__ import annotations

from pathlib import Path

import typer

from flowrl.cli.common import on_ctrl_c, output_folder, progress_bar


def demo(  # noqa: PLR0913  # a typer command: one parameter per option
    out: Path = typer.Option(Path("demo-out"), "--out", help="Folder for everything the demo makes."),
    repeats: int = typer.Option(2, min=1, help="Runs of each task by the example agent."),
    kto_steps: int = typer.Option(4, min=1, help="KTO training steps."),
    grpo_steps: int = typer.Option(2, min=1, help="GRPO training steps."),
    improve_rounds: int = typer.Option(1, min=1, help="Rounds of `flowrl improve` (collect, select, train, eval)."),
    improve_train_tasks: int = typer.Option(
        40, min=1, help="Train tasks per improve round (each run --improve-samples times)."
    ),
    improve_samples: int = typer.Option(4, min=1, help="Runs per train task per improve round."),
    improve_eval_tasks: int = typer.Option(60, min=1, help="Held-out tasks each improve arm is graded on."),
    quant: str = typer.Option("q8_0", help="GGUF quantisation: f16, bf16, q8_0 or q4_0."),
    flowagent_data: Path | None = typer.Option(
        None, help="A toolboxv2 data dir to ingest (default: the FlowAgent 0.1.28 files shipped with flowrl)."
    ),
    fresh: bool = typer.Option(False, "--fresh", help="Start over instead of reusing what an earlier run made."),
    sample_data: bool = typer.Option(
        False,
        "--sample-data",
        help="Print the folder of the sample FlowAgent files shipped with flowrl (for flowrl ingest), and exit.",
    ),
) -> None:
    """Run the whole loop: capture, ingest, score, build, train, improve (rounds with held-out evals), export, \
report."""
    import sys
    import time

    from rich.console import Console
    from rich.progress import TaskID

    from flowrl.demo.run import Demo, DemoConfig, StageResult, flowagent_fixtures  # lazy: keeps `flowrl --help` fast

    if sample_data:  # a plain line on stdout, for `$(flowrl demo --sample-data)`
        print(flowagent_fixtures())
        return
    output_folder(out, "--out")
    cfg = DemoConfig(
        out=out,
        repeats=repeats,
        kto_steps=kto_steps,
        grpo_steps=grpo_steps,
        quant=quant,
        fresh=fresh,
        flowagent_data=flowagent_data,
        improve_rounds=improve_rounds,
        improve_train_tasks=improve_train_tasks,
        improve_samples=improve_samples,
        improve_eval_tasks=improve_eval_tasks,
    )
    started = time.perf_counter()
    screen = Console(file=sys.stdout, soft_wrap=True)  # bound now: stages send library chatter to demo-out/logs/
    kept = f"finished stages are kept in {out}; run `flowrl demo --out {out}` again to go on (--fresh starts over)"
    with on_ctrl_c(kept), progress_bar(screen) as progress:
        tasks: dict[str, TaskID] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done, total=total)
            if done >= total and " " in stage:  # a step inside a stage ("improve collect r1") ends here
                progress.remove_task(tasks.pop(stage))

        def on_stage(res: StageResult) -> None:
            if res.name in tasks:
                progress.remove_task(tasks.pop(res.name))
            tag = " [dim](reused)[/dim]" if res.reused else ""
            progress.console.print(
                f"[green]✓[/green] [bold]{res.name:<8}[/bold] {res.seconds:6.1f}s  {res.summary}{tag}"
            )

        def stage_started(name: str) -> None:
            tasks[name] = progress.add_task(name, total=None)

        result = Demo(cfg, on_stage=on_stage, on_progress=on_progress, on_start=stage_started).run()
    screen.print(f"library logs: {out / 'logs'}")
    screen.print(f"demo finished in {time.perf_counter() - started:.0f}s; open {result.report}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
