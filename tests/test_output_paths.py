"""Issue 39: a command whose output folder cannot be made ended in about 41 lines of NotADirectoryError (export
only after 7 s of merging); now each checks it first and stops in one line naming the flag and the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl.cli import main


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["build-dataset", "--method", "kto", "--out", "{bad}/kto", "--store", "{store}"], "--out"),
        (["report", "--out", "{bad}/r", "--store", "{store}"], "--out"),
        (["train", "--method", "sft", "--dataset", "{store}", "--output-dir", "{bad}/t"], "--output-dir"),
        (["export", "--model", "{store}", "--out", "{bad}/e"], "--out"),
        (["improve", "--out", "{bad}/i"], "--out"),
        (["build-dataset", "--method", "kto", "--out", "/proc/nope", "--store", "{store}"], "--out"),
    ],
)
def test_an_output_folder_that_cannot_be_made_stops_in_one_line(
    tmp_path: Path, argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "garbage.json"
    bad.write_text("{}")
    (tmp_path / "store").mkdir()
    args = [a.replace("{bad}", str(bad)).replace("{store}", str(tmp_path / "store")) for a in argv]
    assert main(args) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and flag in err[0] and "Traceback" not in err[0], err
