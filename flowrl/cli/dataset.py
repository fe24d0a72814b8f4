"""`flowrl build-dataset`: stored traces to a TRL dataset (DatasetDict on disk, JSONL, card); `flowrl dataset show`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from flowrl.cli.common import StoreOption, console, err_console, open_store, report_problems
from flowrl.cli.traces import _date
from flowrl.errors import ConfigError
from flowrl.methods import get_method

if TYPE_CHECKING:
    from flowrl.data import DatasetFilter
    from flowrl.data.grouping import GroupBy
    from flowrl.store.files import TraceStore

METHOD_HELP = "kto, grpo (online prompts), grpo-offline (logged groups), sft or dpo."


def build_dataset(  # noqa: PLR0913  # a typer command: one parameter per option
    method: str = typer.Option(..., "--method", "-m", help=METHOD_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (created; must be empty unless --overwrite)."),
    store: Path | None = StoreOption,
    since: str | None = typer.Option(None, help="First day, YYYY-MM-DD."),
    until: str | None = typer.Option(None, help="Last day, YYYY-MM-DD."),
    agent: str | None = typer.Option(None, help="Only this agent."),
    source: str | None = typer.Option(None, help="Only this source: live, checkpoint, obs, live-file or import."),
    min_reward: float | None = typer.Option(None, help="Only traces with reward_score >= this."),
    max_reward: float | None = typer.Option(None, help="Only traces with reward_score <= this."),
    label_source: str | None = typer.Option(None, help="Only traces labelled this way: manual or engine."),
    dedupe: bool = typer.Option(
        True, "--dedupe/--no-dedupe", help="Drop traces whose conversation repeats an earlier one."
    ),
    group_by: str = typer.Option("query", help="What makes two traces the same task: query, group_key or embedding."),
    similarity: float = typer.Option(0.9, help="Cosine similarity for --group-by embedding."),
    embedding_model: str | None = typer.Option(
        None, help="Local sentence-transformers folder for --group-by embedding."
    ),
    val_fraction: float = typer.Option(0.1, help="Share of tasks (groups) held out for validation; 0 for none."),
    seed: int = typer.Option(0, help="Seed of the split and of KTO's shuffle."),
    max_chars: int = typer.Option(
        32000, help="Length budget of a row in characters (0: none); truncations are counted."
    ),
    base_model: str | None = typer.Option(
        None,
        "--base-model",
        "-b",
        help="Measure rows in this model's tokens and drop (and list) those over --max-length.",
    ),
    max_length: int = typer.Option(
        1024,
        "--max-length",
        help="Token budget per sequence with --base-model (default: the CPU training profile's 1024).",
    ),
    arguments: str = typer.Option("dict", help="Tool-call arguments as dict (HF templates) or string (OpenAI)."),
    parquet: bool = typer.Option(False, "--parquet", help="Also write data/{split}.parquet."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset already in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    workers: int = typer.Option(
        1, help="KTO from a segment store: make the rows in this many more processes (others say so and use one)."
    ),
    kto_rows: str | None = typer.Option(None, help="KTO: one row per assistant 'step' (default) or per 'final' turn."),
    threshold: float | None = typer.Option(None, help="KTO: label = reward_score >= this (manual labels still win)."),
    min_group_size: int | None = typer.Option(None, help="grpo-offline: smallest group kept (default 2)."),
    max_group_size: int | None = typer.Option(None, help="grpo-offline: largest group (default 16; 0: no cap)."),
    select: str | None = typer.Option(
        None, help="SFT: top (top share by reward, default), label (label true) or best (per task)."
    ),
    top_share: float | None = typer.Option(None, help="SFT --select top: share of traces kept (default 0.25)."),
    min_margin: float | None = typer.Option(
        None, help="DPO: smallest reward margin between chosen and rejected (default 0.1)."
    ),
) -> None:
    """Build a dataset for TRL from the trace store: a DatasetDict on disk, JSONL, a card and a summary."""
    from flowrl.data import DatasetError, DatasetFilter, DatasetPipeline  # lazy: keeps `flowrl --help` fast
    from flowrl.methods import make_builder  # lazy: keeps `flowrl --help` fast

    options = {
        "rows": kto_rows,
        "threshold": threshold,
        "min_group_size": min_group_size,
        "max_group_size": max_group_size,
        "select": select,
        "top_share": top_share,
        "min_margin": min_margin,
    }
    flags = {
        "rows": "--kto-rows",
        "threshold": "--threshold",
        "min_group_size": "--min-group-size",
        "max_group_size": "--max-group-size",
        "select": "--select",
        "top_share": "--top-share",
        "min_margin": "--min-margin",
    }
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    if given.get("max_group_size") == 0:
        given["max_group_size"] = None
    builder = make_builder(method, max_chars=max_chars or None, arguments_as=arguments)
    fields = {f.name for f in dataclasses.fields(builder)}
    wrong = [flags[k] for k in given if k not in fields]
    if wrong:
        raise ConfigError(f"{', '.join(wrong)} does not apply to --method {method}")
    if given:
        builder = dataclasses.replace(builder, **given)
    filters = DatasetFilter(
        since=_date(since, "since"),
        until=_date(until, "until"),
        agent=agent,
        source=source,
        min_reward=min_reward,
        max_reward=max_reward,
        label_source=label_source,
        dedupe=dedupe,
    )
    budget = None
    if base_model is not None:
        from flowrl.train.inspect import token_budget  # lazy: keeps `flowrl --help` fast

        budget = token_budget(builder.method, base_model, max_length)
    pipeline = DatasetPipeline(
        builder,
        filters=filters,
        group_by=cast("GroupBy", group_by),  # checked by the pipeline, which names the allowed values
        similarity=similarity,
        embedding_model=embedding_model,
        val_fraction=val_fraction,
        seed=seed,
        budget=budget,
        workers=workers,
    )
    st = open_store(store)
    try:
        if quiet:
            result = pipeline.build(st, out, parquet=parquet, overwrite=overwrite)
        else:
            result = _with_progress(pipeline, st, out, parquet, overwrite)
    except DatasetError as exc:
        if get_method(builder.method_name).needs_rewards and _unscored(st, filters):  # online GRPO needs none
            command = "flowrl score" + (f" --store {store}" if store is not None else "")
            raise DatasetError(f"{exc}; the traces have no rewards or labels: run `{command}` first") from exc
        raise
    for line in result.summary_lines():
        console.print(line, highlight=False, markup=False)
    console.print(f"built in {result.elapsed_s:.1f}s; card: {result.out / 'README.md'}", highlight=False, markup=False)
    report_problems(result.problems)


def _unscored(st: TraceStore, filters: DatasetFilter) -> bool:
    """Are there traces under the filters, none of them with a reward score or a label?"""
    found = False
    for t in st.iter_traces(filters.trace_filter()):
        if t.reward_score is not None or t.label is not None:
            return False
        found = True
    return found


def _with_progress(pipeline, st, out, parquet, overwrite):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    labels = {"read": "reading traces", "write": "writing rows"}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        tasks: dict[str, int] = {}

        def on_progress(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(labels.get(phase, phase), total=total)
            progress.update(tasks[phase], completed=done, total=total)

        return pipeline.build(st, out, parquet=parquet, overwrite=overwrite, on_progress=on_progress)


def register(app: typer.Typer) -> None:
    app.command("build-dataset")(build_dataset)
    register_dataset_group(app)


def show(
    path: Path = typer.Argument(..., help="A dataset folder written by `flowrl build-dataset`."),
    base_model: str | None = typer.Option(
        None, "--base-model", "-b", help="Model whose tokenizer encodes the row (default: the embedded SmolLM2)."
    ),
    row: int = typer.Option(0, "--row", "-r", help="Row number in the split."),
    split: str = typer.Option("train", "--split", "-s", help="train or validation."),
    method: str | None = typer.Option(None, "--method", "-m", help="Only for datasets without flowrl_dataset.json."),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"input_ids", "loss_mask", "text"} (or {"sequences": [...]}) as JSON.'
    ),
) -> None:
    """Show a row as the trainer sees it: its tokens, with the ones that carry loss highlighted."""
    import json

    from rich.text import Text

    from flowrl.train.inspect import show_row  # lazy: keeps `flowrl --help` fast

    shown = show_row(path, base_model=base_model, row=row, split=split, method=method)
    if as_json:
        typer.echo(json.dumps(shown.to_json(), ensure_ascii=False))
        return
    for note in shown.notes:
        err_console.print(f"note: {note}", highlight=False, markup=False)
    for n, seq in enumerate(shown.sequences):
        trained = sum(seq["loss_mask"])
        console.print(
            f"{shown.method} {shown.split} row {shown.index} of {shown.rows}, sequence {n + 1} of "
            f"{len(shown.sequences)}: {len(seq['input_ids'])} tokens, {trained} with loss "
            f"({seq['source']})",
            style="bold",
            highlight=False,
            markup=False,
        )
        text = Text()
        for token, mask in zip(seq["tokens"], seq["loss_mask"]):
            text.append(token, style="bold green" if mask else "dim")
        console.print(text, highlight=False)
        console.print("")
    console.print(
        "green: loss (tokens the model generated in that run); dim: context, no loss",
        style="dim",
        highlight=False,
        markup=False,
    )


def register_dataset_group(app: typer.Typer) -> None:
    group = typer.Typer(help="Look at built datasets.", no_args_is_help=True)
    group.command("show")(show)
    app.add_typer(group, name="dataset")
