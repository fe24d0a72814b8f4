"""The `flowrl` command: thin over the library.

Each command lives in its own module here and exposes `register(app)`. Library code raises
FlowRLError subclasses; `main()` turns them into one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from flowrl.errors import FlowRLError
from flowrl.version import __version__

# Command modules, in the order their commands are listed in `flowrl --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "flowrl.cli.ingest",
    "flowrl.cli.traces",
    "flowrl.cli.dataset",
    "flowrl.cli.compact",
    "flowrl.cli.score",
    "flowrl.cli.train",
    "flowrl.cli.improve",
    "flowrl.cli.promote",
    "flowrl.cli.export",
    "flowrl.cli.serve",
    "flowrl.cli.report",
    "flowrl.cli.review",
    "flowrl.cli.demo",
)

app = typer.Typer(
    name="flowrl",
    help="Capture agent runs, score them, build TRL datasets, train, evaluate and export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"flowrl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages to stderr."),
) -> None:
    _log_to_stderr(verbose)


class _CliLog(logging.Formatter):
    """flowrl's own warnings as `flowrl: message` (each once); other libraries' as `LEVEL name: message`."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.name.split(".")[0] == "flowrl" and record.levelno >= logging.WARNING:
            return message if message.startswith("flowrl") else f"flowrl: {message}"
        return f"{record.levelname} {record.name}: {message}"


def _not_reported_later(record: logging.LogRecord) -> bool:
    """A store's skipped file is named once, at the end of the command (`common.report_problems`)."""
    return not getattr(record, "flowrl_read_problem", False)


def _log_to_stderr(verbose: bool) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "flowrl_cli", False):
            root.removeHandler(handler)  # `main` called again in one process (tests, `flowrl demo`)
    handler = logging.StreamHandler()
    handler.flowrl_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(_CliLog("%(message)s"))
    if not verbose:
        handler.addFilter(_not_reported_later)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main(argv: list[str] | None = None) -> int:
    try:
        rc = app(args=argv, standalone_mode=False)  # click returns typer.Exit's code here instead of raising
    except FlowRLError as exc:
        print(f"flowrl: error: {exc}", file=sys.stderr)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("flowrl: aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("flowrl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # click usage errors and the like
        if isinstance(exc, _usage_errors()):
            exc.show()  # type: ignore[attr-defined]  # click's UsageError or typer's vendored one
            return int(exc.exit_code)  # type: ignore[attr-defined]
        raise
    return rc if isinstance(rc, int) else 0


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Click's usage-error base class, wherever this typer takes click from: typer 0.29 vendors it as
    `typer._click` (its errors are not `click.ClickException`), older releases use the `click` package."""
    found: list[type[BaseException]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
