"""Usage errors are the usage message and exit 2, never a traceback, with the typer a fresh install gets.

typer 0.29 vendors click as `typer._click`, whose exceptions are not `click.ClickException`: `flowrl nosuchcmd`,
an unknown option and a bare command group ended in a Python traceback before. Checked by hand against typer
0.16.1, 0.19.2, 0.21.0, 0.24.0, 0.25.0, 0.26.0, 0.27.0 and 0.29.2 with click 8.5.1 (pyproject: typer>=0.16; 0.15.4
fails on click 8.5's `make_metavar`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flowrl.cli import main

CASES = [
    (["nosuchcmd"], "No such command 'nosuchcmd'"),
    (["ingest", "--nosuchopt"], "--nosuchopt"),  # "No such option: --x" (vendored click) or "... '--x'." (click 8.5)
    (["traces"], "List, show, label and annotate stored traces"),
    (["train", "--max-steps", "many"], "Invalid value for '--max-steps'"),
    # `flowrl eval` is greedy: its `--temperature` was accepted and never used (issue 35), now it is refused
    (["eval", "--model", "m", "--agent", "example", "--temperature", "0.5"], "--temperature"),
]


@pytest.mark.parametrize(("argv", "says"), CASES)
def test_usage_errors_print_usage_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert says in text and "Traceback" not in text and ("Usage:" in text or "Error" in text)


def test_the_installed_entry_point_shows_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from flowrl.cli import main; sys.exit(main())", "nosuchcmd"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "No such command" in done.stderr and "Traceback" not in done.stderr
