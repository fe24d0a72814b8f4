"""`flowrl ingest PATH...` and `flowrl watch PATH...`: FlowAgent checkpoints, obs files and rl_traces, OTLP traces
and OpenAI-format logs into the store."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import typer

from flowrl.cli.common import StoreOption, console, err_console, open_store
from flowrl.errors import IngestError
from flowrl.ingest.engine import LIVE_IDLE_S
from flowrl.ingest.summary import IngestSummary

PathsArgument = typer.Argument(
    ...,
    help="Data dir, Agents/ dir, checkpoint dir, obs dir, rl_traces store, OTLP JSON/protobuf or OpenAI-format "
    "JSONL files, or folders of them.",
)
LiveIdleOption = typer.Option(
    LIVE_IDLE_S, "--live-idle", help="Seconds a live_*.jsonl must be untouched before its run counts as interrupted."
)


def print_summary(summary: IngestSummary, root: Path, *, verb: str = "ingested") -> None:
    s = summary
    console.print(
        f"{verb}: {s.files_read} files read, {s.read} traces read: [bold]{s.new} new[/bold], {s.upgraded} upgraded, "
        f"{s.duplicate} duplicate, "
        f"{s.skipped} skipped, {s.rejected_count} files rejected ({s.seconds:.1f} s)",
        highlight=False,
    )
    if s.new_by_source:
        console.print(
            "  new by source: " + ", ".join(f"{k} {v}" for k, v in sorted(s.new_by_source.items())), highlight=False
        )
    if s.masked:
        console.print(f"  secrets masked: {s.masked}", highlight=False)
    for note, n in s.notes.most_common():
        console.print(f"  note {n}: {note}", highlight=False, markup=False)
    for reason, n in s.skip_reasons.most_common():
        console.print(f"  skipped {n}: {reason}", highlight=False, markup=False)
    for r in s.rejected:
        err_console.print(f"[yellow]rejected[/yellow] {r.reason}", highlight=False)
    if s.rejected_count > len(s.rejected):
        err_console.print(
            f"[yellow]rejected[/yellow] ... and {s.rejected_count - len(s.rejected)} more", highlight=False
        )
    console.print(f"store: {root}", highlight=False)


def _nothing_read(paths: list[Path], summary: IngestSummary) -> None:
    where = ", ".join(map(str, paths))
    if summary.rejected_count:
        raise IngestError(f"nothing could be read from {where}: every file was rejected (see above)")
    raise IngestError(
        f"no FlowAgent checkpoints, obs files or traces found under {where}: point it at a toolboxv2 "
        f"data dir, an Agents/ dir, a checkpoint dir or the files"
    )


def ingest_cmd(
    paths: list[Path] = PathsArgument,
    store: Path | None = StoreOption,
    live_idle: float = LiveIdleOption,
) -> None:
    """Read FlowAgent checkpoints (V2 and V1), obs run/live files, rl_traces JSON, OpenTelemetry traces (OTLP JSON
    lines or protobuf: gen_ai, OpenInference) and OpenAI-format chat logs into the trace store."""
    from flowrl.ingest import ingest_paths  # lazy: keeps `flowrl --help` fast

    st = open_store(store, missing_ok=True)
    count = [0]
    with err_console.status("reading...") as status:

        def on_file(src: Any) -> None:
            count[0] += 1
            status.update(f"reading {src.path.name} ({count[0]} files)")

        summary = ingest_paths(paths, st, live_idle_s=live_idle, on_file=on_file)
    print_summary(summary, st.root)
    if not summary.ok:
        _nothing_read(paths, summary)


def watch_cmd(
    paths: list[Path] = PathsArgument,
    store: Path | None = StoreOption,
    once: bool = typer.Option(False, "--once", help="One pass over new and changed files, then exit (for cron)."),
    debounce: float = typer.Option(0.5, "--debounce", help="Seconds a file must be unchanged before it is read."),
    rescan: float = typer.Option(
        30.0, "--rescan", help="Seconds between full rescans (a safety net for missed events)."
    ),
    live_idle: float = LiveIdleOption,
    verbose_files: bool = typer.Option(True, "--log-files/--no-log-files", help="Print a line per file read."),
) -> None:
    """Ingest new and changed checkpoints and obs files as FlowAgent writes them; Ctrl-C stops cleanly."""
    import warnings

    from flowrl.ingest.watch import Watcher  # lazy: keeps `flowrl --help` fast

    # watchdog 7.1 warns each time it re-adds a watch for a directory created in a burst; harmless noise
    warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)
    st = open_store(store, missing_ok=True)
    on_message = (lambda msg: console.print(msg, highlight=False, markup=False)) if verbose_files else None
    watcher = Watcher(
        paths, st, debounce=debounce, rescan_interval=rescan, live_idle_s=live_idle, on_message=on_message
    )
    if once:
        summary = watcher.run_once()
        print_summary(summary, st.root, verb="watch --once")
        return
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    console.print(f"watching {', '.join(map(str, paths))} -> {st.root} (Ctrl-C stops)", highlight=False)
    try:
        summary = watcher.run(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print_summary(summary, st.root, verb="watch stopped")


def serve_otlp_cmd(
    store: Path | None = StoreOption,
    host: str = typer.Option("127.0.0.1", help="Address to listen on (another than localhost needs --allow-remote)."),
    port: int = typer.Option(4318, help="Port (OTLP/HTTP's default 4318; 0 picks a free one)."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Listen on a non-local --host."),
    pending: float = typer.Option(60.0, help="Seconds a run's spans wait for its root span before it is dropped."),
) -> None:
    """Receive OTLP/HTTP traces (POST /v1/traces, JSON or protobuf) and write the agent runs into the store.

    Point an instrumented application at it with OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318; Ctrl-C stops."""
    from flowrl.ingest.otlp_receiver import OTLPReceiver, make_server  # lazy: keeps `flowrl --help` fast
    from flowrl.localhost import LOCAL_HOSTS  # lazy: keeps `flowrl --help` fast

    st = open_store(store, missing_ok=True)
    receiver = OTLPReceiver(st, pending_s=pending)
    server = make_server(receiver, host, port, allow_remote=allow_remote)
    if host not in LOCAL_HOSTS:
        err_console.print(
            f"[yellow]warning[/yellow]: listening on {host}: anyone who can reach it can write traces into {st.root}",
            markup=True,
            highlight=False,
        )
    bound_host, bound_port = server.server_address[:2]
    address = f"http://{bound_host!s}:{bound_port}"
    console.print(
        f"receiving OTLP traces at {address}/v1/traces into {st.root} "
        f"(OTEL_EXPORTER_OTLP_ENDPOINT={address}); Ctrl-C stops",
        highlight=False,
    )
    sweeper = threading.Thread(target=_sweep, args=(receiver, server), daemon=True)
    sweeper.start()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        receiver.pending_s = 0.0
        receiver.sweep()  # what waits for a root span that never came is counted, not lost silently
    s = receiver.stats
    skipped = sum(s.skipped.values())
    console.print(
        f"received {s.requests} requests ({s.spans} spans): {s.written} traces written, "
        f"{s.duplicates} already stored, {skipped} runs skipped, {s.bad_requests} bad requests",
        highlight=False,
    )
    for reason, n in sorted(s.skipped.items()):
        err_console.print(f"skipped {n}: {reason}", highlight=False)


def _sweep(receiver: Any, server: Any) -> None:
    while True:
        time.sleep(1.0)
        try:
            receiver.sweep()
        except Exception as exc:  # the server goes on; the next sweep tries again
            logging.getLogger(__name__).warning("flowrl serve-otlp: sweeping waiting spans failed: %r", exc)


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest_cmd)
    app.command("watch")(watch_cmd)
    app.command("serve-otlp")(serve_otlp_cmd)
