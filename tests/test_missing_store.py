"""Issue 39: a store path that does not exist was read as an empty store ("0 traces", rc 0; an empty review queue;
a report of 0 traces). Readers now stop with one line naming it; the commands that create stores still do."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["traces", "ls"],
        ["traces", "label", "abc", "good"],
        ["score"],
        ["build-dataset", "--method", "sft", "--out", "{tmp}/ds"],
        ["report", "--out", "{tmp}/r"],
        ["review"],  # before it binds a port or serves an empty queue
    ],
)
def test_a_reader_of_a_missing_store_stops_with_one_line(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexistent" / "store"
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--store", str(missing)])
    err = capsys.readouterr().err
    assert code != 0 and f"no trace store at {missing}" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
    assert not missing.exists()  # nothing created on the way


def test_ingest_creates_the_store_it_is_given(tmp_path: Path) -> None:
    source = tmp_path / "empty-source"
    source.mkdir()
    main(["ingest", str(source), "--store", str(tmp_path / "new" / "store")])  # nothing to read: its own error
    from flowrl.cli.common import open_store

    assert open_store(tmp_path / "new" / "store", missing_ok=True) is not None


def test_a_report_run_folder_that_holds_nothing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "emptydir").mkdir()
    assert main(["report", "--out", str(tmp_path / "r"), "--run", str(tmp_path / "emptydir")]) != 0
    assert "--run" in capsys.readouterr().err and not (tmp_path / "r" / "index.html").exists()
