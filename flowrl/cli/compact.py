"""`flowrl compact`: a store's per-trace JSON files into Parquet segments (`flowrl.store.segments.compact`)."""

from __future__ import annotations

from pathlib import Path

import typer

from flowrl.cli.common import StoreOption, console, report_problems


def compact_cmd(
    store: Path | None = StoreOption,
    out: str | None = typer.Option(
        None, "--out", help="Write the segments under this folder or URL (s3://bucket/prefix) instead of in place."
    ),
    keep_json: bool = typer.Option(False, "--keep-json", help="In place: keep the JSON files after verifying."),
    writer_id: str | None = typer.Option(None, "--writer-id", help="Writer id in the segment names."),
) -> None:
    """Convert per-trace JSON files into columnar segments, in place (verified before any JSON file is removed)
    or into another root. Safe to interrupt and to run again: every reader reads both layouts."""
    from flowrl.store.files import default_root  # lazy: keeps `flowrl --help` fast
    from flowrl.store.opener import store_spec  # lazy: keeps `flowrl --help` fast
    from flowrl.store.segments.compact import compact  # lazy: keeps `flowrl --help` fast

    root = store_spec(store) if store is not None else str(default_root())
    summary = compact(root, out=out, keep_json=keep_json, writer_id=writer_id)
    report_problems(summary.problems)
    line = f"compacted {summary.copied} traces into segments under {summary.target}"
    if out is None:
        line += f"; removed {summary.removed} JSON files" if not keep_json else "; JSON files kept"
    if summary.kept_changed:
        line += f"; kept {len(summary.kept_changed)} changed meanwhile (the newer copy): run compact again"
    console.print(line, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("compact")(compact_cmd)
