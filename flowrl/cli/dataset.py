"""`flowrl build-dataset`: stored traces to a TRL dataset (DatasetDict on disk, JSONL, card); `flowrl dataset show`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flowrl.cli.common import (
    StoreOption,
    console,
    err_console,
    open_store,
    output_folder,
    progress_bar,
    report_problems,
)
from flowrl.cli.dataset_options import BuildOptions
from flowrl.cli.options import config_options
from flowrl.methods import get_method

if TYPE_CHECKING:
    from flowrl.data import DatasetFilter
    from flowrl.store.files import TraceStore


@config_options(BuildOptions)
def build_dataset(
    store: Path | None = StoreOption,
    parquet: bool = typer.Option(False, "--parquet", help="Also write data/{split}.parquet."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset already in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    **fields: Any,
) -> None:
    """Build a dataset for TRL from the trace store: a DatasetDict on disk, JSONL, a card and a summary."""
    from flowrl.data import DatasetError  # lazy: keeps `flowrl --help` fast

    options = BuildOptions(**fields)
    builder = options.builder()
    filters = options.filters()
    pipeline = options.pipeline(builder, filters)
    st = open_store(store)
    out = output_folder(options.out, "--out")
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
    labels = {"read": "reading traces", "write": "writing rows"}
    with progress_bar(err_console, "{task.description}") as progress:
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
