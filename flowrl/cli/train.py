"""`flowrl train` and `flowrl eval`: thin over flowrl.train (TrainingPipeline, evaluate)."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from flowrl.cli.common import (
    EXAMPLE_AGENT,
    agent_outcomes,
    console,
    err_console,
    example_agent,
    on_ctrl_c,
    output_folder,
)
from flowrl.cli.options import config_options
from flowrl.errors import ConfigError
from flowrl.train.config import TrainingConfig


def _quiet_known_warnings() -> None:
    from flowrl.quiet import ignore_known_deprecations  # lazy: keeps `flowrl --help` fast

    ignore_known_deprecations()


@contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """With `--no-progress`, silence the loading and tokenising bars too (transformers' "Loading weights",
    datasets' map/filter bars, huggingface_hub's), not only TRL's training bar; each comes back on exit, so a
    caller of `main()` keeps its own settings."""
    from flowrl.quiet import quiet_libraries  # lazy: keeps `flowrl --help` fast

    with quiet_libraries(bars=show):
        yield


def _first_process_speaks(command: Callable[..., None]) -> Callable[..., None]:
    """Run `command` under `_other_process_quiet` (a decorator keeps typer's view of its options)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        from flowrl.train.hardware import is_main_process  # lazy: keeps `flowrl --help` fast

        with _other_process_quiet(is_main_process()):
            command(*args, **kwargs)

    return wrapper


@contextmanager
def _other_process_quiet(main: bool) -> Iterator[None]:
    """Under `accelerate launch` only the first process (rank 0) speaks: in the others flowrl's and the
    libraries' warnings are dropped and an error ends the process with the exit code the first process gives,
    without printing it a second time (every process hits the same error on the same files). Errors of TRL or
    torch still reach the console: the launcher reports a process that failed. One process: nothing changes."""
    if main:
        yield
        return
    from flowrl.errors import FlowRLError  # lazy: keeps `flowrl --help` fast

    flowrl_log = logging.getLogger("flowrl")
    level = flowrl_log.level
    flowrl_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except FlowRLError as exc:
        raise typer.Exit(2) from exc  # the code `flowrl` gives an error; rank 0 has printed it
    except KeyboardInterrupt as exc:  # a second Ctrl-C: rank 0 says "interrupted"
        raise typer.Exit(130) from exc
    finally:
        flowrl_log.setLevel(level)


def _silent(*args: Any, **kwargs: Any) -> None:
    """`console.print` in the processes of `accelerate launch` that do not report (all but the first)."""


def _csv(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _trl_args(pairs: list[str] | None) -> dict[str, Any] | None:
    if not pairs:
        return None
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--trl {pair!r}: use KEY=VALUE, e.g. --trl loss_type=grpo")
        out[key.strip()] = yaml.safe_load(raw)  # numbers, booleans and lists as YAML reads them
    return out


@_first_process_speaks
@config_options(TrainingConfig)  # one option per flagged TrainingConfig field (flowrl.cli.options)
def train(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML, TOML or JSON file of TrainingConfig options; flags win over it."
    ),
    resume: bool | None = typer.Option(
        None, "--resume/--no-resume", help="Continue from the last checkpoint in --output-dir."
    ),
    resume_from: Path | None = typer.Option(None, "--resume-from", help="Continue from this checkpoint folder."),
    lora: bool | None = typer.Option(None, "--lora/--no-lora", help="Train a LoRA adapter (default) or every weight."),
    lora_r: int | None = typer.Option(None, "--lora-r", help="LoRA rank (default 16)."),
    lora_alpha: int | None = typer.Option(None, "--lora-alpha", help="LoRA alpha (default 32)."),
    trl: list[str] | None = typer.Option(None, "--trl", help="KEY=VALUE set on TRL's config class as is (repeatable)."),
    **fields: Any,
) -> None:
    """Train a LoRA adapter on a flowrl dataset with TRL (GRPO online or offline, KTO, SFT, DPO), or with GRPO
    through an agent's own loop (--agent)."""
    _quiet_known_warnings()
    from flowrl.train.config import load_config_file  # lazy: keeps `flowrl --help` fast
    from flowrl.train.hardware import detect_hardware, is_main_process  # lazy: keeps `flowrl --help` fast
    from flowrl.train.pipeline import TrainingPipeline  # lazy: keeps `flowrl --help` fast

    say = console.print if is_main_process() else _silent  # under `accelerate launch` the first process reports

    lora_over = {k: v for k, v in (("enabled", lora), ("r", lora_r), ("alpha", lora_alpha)) if v is not None}
    flags: dict[str, Any] = {
        **fields,
        "resume": resume_from if resume_from is not None else resume,
        "lora": lora_over or None,
        "trl_args": _trl_args(trl),
    }
    base = load_config_file(config) if config is not None else {}
    given = {**base, **{k: v for k, v in fields.items() if v is not None}}
    if not given.get("method") or not (given.get("dataset") or given.get("agent")):
        raise ConfigError(
            "give --method and --dataset (or --agent for GRPO through an agent; or a --config file that sets them)"
        )
    cfg = TrainingConfig.from_dict(base, **flags)
    if is_main_process():
        output_folder(cfg.resolved_output_dir, "--output-dir")
    hardware = detect_hardware()
    source = (
        cfg.dataset
        if cfg.agent is None
        else f"rollouts through agent {cfg.agent}" + (f" on {cfg.dataset}" if cfg.dataset else "")
    )
    say(
        f"training [bold]{cfg.method}[/bold] on {cfg.base_model} with {source} ({hardware.describe()})", highlight=False
    )
    with _progress_bars(cfg.progress_bar):
        adapter = None
        if cfg.agent is not None:  # the rollout's lines (turns, masked tool tokens, rewards) are the run's log
            logging.getLogger("flowrl.train.agent_rollout").setLevel(logging.INFO)
            from flowrl.train.agent_grpo import resolve_adapter  # lazy: keeps `flowrl --help` fast

            adapter = resolve_adapter(f"{EXAMPLE_AGENT}:example_adapter" if cfg.agent == "example" else cfg.agent)
        result = TrainingPipeline(cfg, hardware=hardware, agent=adapter).run()

    status = "interrupted: saved at" if result.interrupted else "done:"
    sps = result.seconds_per_step
    say(
        f"{status} step {result.global_step} in {result.train_seconds:.1f} s"
        + (f" ({sps:.2f} s/step)" if sps else "")
        + f", profile {result.settings['profile']}",
        highlight=False,
    )
    metrics = {k: v for k, v in result.last_metrics.items() if k not in ("step", "epoch", "time", "elapsed_s")}
    if metrics:
        say(
            "last step: "
            + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()),
            highlight=False,
        )
    out = result.output_dir
    say(f"adapter and tokenizer: {out}; metrics: {out / 'metrics.jsonl'}; card: {out / 'README.md'}", highlight=False)
    if result.merged_dir:
        say(f"merged model: {result.merged_dir}", highlight=False)
    if cfg.agent is not None:
        rollouts = result.info.get("rollouts") or {}
        say(
            f"rollouts: {rollouts.get('written', 0)} traces in {cfg.resolved_store} (source train), "
            f"{rollouts.get('tool_calls', 0)} tool calls executed",
            highlight=False,
        )
    if result.interrupted:  # a script tells a stopped run from a finished one by the exit code, as for Ctrl-C
        say("next: the same command with --resume continues it", highlight=False)
        raise typer.Exit(130)
    if cfg.agent == "example":
        say(f"next: flowrl eval --model {out} --agent example", highlight=False)
    elif cfg.agent is None:
        say(f"next: flowrl eval --model {out} --prompts {cfg.dataset}", highlight=False)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def eval_cmd(  # noqa: PLR0913  # a typer command: one parameter per option
    model: str = typer.Option(
        ..., "--model", help="Trained output folder (adapter), merged model folder, Hub id or smollm2-135m."
    ),
    prompts: Path | None = typer.Option(
        None,
        "--prompts",
        help="Single-turn mode: a flowrl dataset folder (its validation split) or a JSONL of {prompt} rows.",
    ),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="Agent-loop mode: `example` runs the example agent, tools and all, on held-out suite tasks.",
    ),
    eval_tasks: int = typer.Option(150, "--eval-tasks", help="Agent-loop mode: held-out tasks per arm."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Agent-loop mode: write eval.json (outcomes, rates with intervals, McNemar) here."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Agent-loop mode: runs at a time (default: the engine's slots, 8)."
    ),
    engine: str = typer.Option(
        "auto",
        "--engine",
        help="Agent-loop mode: the engine: llama-server, transformers, or auto (llama-server when built).",
    ),
    baseline: str | None = typer.Option(
        None,
        "--baseline",
        help="Model to compare with (default: the base the model was trained from; `none` for no baseline).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for eval_report.json and .png (default: the model folder, else ./eval)."
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Longest answer generated."),
    limit: int | None = typer.Option(None, "--limit", help="Evaluate at most this many prompts."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts generated together."),
    rewards: str | None = typer.Option(
        None, "--rewards", help="Comma-separated rewards to report (default: the engine's)."
    ),
    reward_config: Path | None = typer.Option(None, "--reward-config", help="The reward engine's TOML/YAML config."),
) -> None:
    """Compare a model with its base: the agent loop on held-out tasks (--agent example: success rates with
    intervals and a paired test), or single-turn answers to held-out prompts scored by the rewards (--prompts)."""
    _quiet_known_warnings()
    if json_out is not None:
        output_folder(Path(json_out).parent, "--json")
    if out is not None:
        output_folder(out, "--out")
    if agent is not None:
        with on_ctrl_c("nothing was written (eval.json is written once every arm has run); run it again"):
            _eval_agent(agent, model, baseline, eval_tasks, json_out, concurrency, engine)
        return
    if prompts is None:
        raise ConfigError(
            "pass --agent example (the agent loop on held-out tasks) or --prompts DIR (single-turn answers)"
        )
    from flowrl.evaluate.prompts import REPORT_JSON, REPORT_PNG, evaluate  # lazy: keeps `flowrl --help` fast

    if out is None:
        out = Path(model) if Path(model).expanduser().is_dir() else Path("eval")
    report = evaluate(
        model,
        prompts,
        baseline="" if (baseline or "").lower() == "none" else baseline,
        out_dir=out,
        max_new_tokens=max_new_tokens,
        limit=limit,
        batch_size=batch_size,
        reward_config=reward_config,
        rewards=_csv(rewards),
    )
    table = Table(
        title=f"{report.n_prompts} prompts from {report.prompts_source}"
        + (f" ({report.split} split)" if report.split else "")
    )
    table.add_column("reward")
    if report.baseline:
        table.add_column(f"baseline: {report.baseline}", justify="right")
    table.add_column(f"model: {report.model}", justify="right")
    if report.baseline:
        table.add_column("change", justify="right")
    rows = [*report.per_reward.items(), ("combined", report.combined)]
    for name, entry in rows:
        cells = [name]
        if report.baseline:
            cells.append(_fmt(entry.get("baseline")))
        cells.append(_fmt(entry.get("model")))
        if report.baseline:
            b, m = entry.get("baseline"), entry.get("model")
            cells.append("" if b is None or m is None else f"{m - b:+.3f}")
        table.add_row(*cells)
    console.print(table)
    console.print(f"report: {out / REPORT_JSON}; plot: {out / REPORT_PNG} ({report.seconds:.0f} s)", highlight=False)
    if report.split == "train":
        err_console.print("note: the dataset has no validation split; these are training prompts", highlight=False)


def _eval_agent(
    agent: str,
    model: str,
    baseline: str | None,
    eval_tasks: int,
    json_out: Path | None,
    concurrency: int | None,
    engine: str,
) -> None:
    import tempfile

    from flowrl.evaluate.results import format_table, summarize, write_eval_json  # lazy: keeps `flowrl --help` fast
    from flowrl.models import resolve_model  # lazy: keeps `flowrl --help` fast

    if agent != "example":
        raise ConfigError(
            f"--agent {agent}: only `example` is built in; evaluate your own agent with "
            "flowrl.evaluate.agent.run_arms (docs/training.md)"
        )
    resolved = resolve_model(model)
    base = resolve_model(baseline or resolved.path)
    if base.adapter:
        raise ConfigError(f"--baseline {baseline} is an adapter: pass the model it was trained from")
    example = example_agent()
    _, held_out = example.example_tasks(0, eval_tasks)
    arms: dict[str, tuple[str, Path | None]] = {"base": (base.path, None)}
    if resolved.adapter or resolved.path != base.path:
        arms["model"] = (resolved.path, Path(resolved.adapter) if resolved.adapter else None)
    with tempfile.TemporaryDirectory(prefix="flowrl-eval-") as scratch, example.ExampleAgents() as agents:
        # the runs are kept beside --json (one store per arm), else only while their rewards are computed
        traces = json_out.with_name(json_out.stem + "-traces") if json_out is not None else Path(scratch)
        outcomes = agent_outcomes(
            agents,
            example.example_grade,
            held_out,
            arms,
            engine=engine,
            store_root=traces,
            concurrency=concurrency,
        )
        data = summarize(outcomes, base="base")
        for line in format_table(data):
            console.print(line, highlight=False, markup=False)
        # lazy: keeps `flowrl --help` fast
        from flowrl.evaluate.secondary import format_rewards, reward_means, write_rewards_json

        secondary = reward_means({name: traces / name for name in arms}, [t.task_id for t in held_out])
        for line in format_rewards(secondary):
            console.print(line, highlight=False, markup=False)
    if json_out is not None:
        write_eval_json(json_out, data)
        write_rewards_json(json_out.with_name(json_out.stem + ".rewards.json"), secondary)
        console.print(
            f"eval: {json_out} (reward means: {json_out.stem}.rewards.json, runs: {traces})",
            highlight=False,
            markup=False,
        )


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("eval")(eval_cmd)
