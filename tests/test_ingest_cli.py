"""`flowrl ingest` and `flowrl watch --once`: summaries, exit codes and one-line errors."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.ingest.watch import STATE_NAME
from flowrl.store.files import TraceStore

CP_DIR = "tb_data_dir/.data/main-vm/Agents/checkpoint/sample_agent"


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_ingest_then_reingest(flowagent_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["ingest", str(flowagent_fixtures / "tb_data_dir"), "--store", str(tmp_path / "st")]
    assert main(args) == 0
    out = _one_line(capsys.readouterr().out)
    assert "9 traces read: 3 new, 0 upgraded, 6 duplicate, 0 skipped, 0 files rejected" in out
    assert main(args) == 0
    assert "0 new, 0 upgraded, 9 duplicate" in _one_line(capsys.readouterr().out)
    assert TraceStore(tmp_path / "st").count() == 3


def test_missing_path_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(tmp_path / "nope"), "--store", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"flowrl: error: {tmp_path / 'nope'}: no such file or directory"


def test_rejected_files_are_listed_and_the_rest_ingested(
    flowagent_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in" / "Agents" / "checkpoint" / "sample_agent"
    shutil.copytree(flowagent_fixtures / CP_DIR, src)
    (src / "agent_checkpoint_20261122_170000.pkl").write_bytes(pickle.dumps(_Evil()))
    assert main(["ingest", str(tmp_path / "in"), "--store", str(tmp_path / "st")]) == 0
    captured = capsys.readouterr()
    assert "3 new" in _one_line(captured.out) and "1 files rejected" in _one_line(captured.out)
    assert "refused to load class" in _one_line(captured.err) and "agent_checkpoint_20261122_170000.pkl" in captured.err


def test_only_bad_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "agent_checkpoint_20261122_170000.pkl").write_bytes(pickle.dumps(_Evil()))
    assert main(["ingest", str(src), "--store", str(tmp_path / "st")]) == 2
    assert "every file was rejected" in _one_line(capsys.readouterr().err)


def test_nothing_found_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["ingest", str(tmp_path / "empty"), "--store", str(tmp_path / "st")]) == 2
    assert "no FlowAgent checkpoints, obs files or traces found" in _one_line(capsys.readouterr().err)


def test_watch_once_for_cron(flowagent_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["watch", str(flowagent_fixtures / "tb_data_dir"), "--store", str(tmp_path / "st"), "--once"]
    assert main(args) == 0
    assert "3 new" in _one_line(capsys.readouterr().out)
    assert (tmp_path / "st" / STATE_NAME).is_file()
    assert main(args) == 0
    out = _one_line(capsys.readouterr().out)
    assert "0 files read" in out and "0 new" in out  # nothing changed: nothing is read again


def test_a_rejected_file_is_said_once(tmp_path: Path) -> None:
    """`flowrl ingest garbage.json` printed its reject line twice (a log warning and the summary's list)."""
    import subprocess
    import sys

    (tmp_path / "garbage.json").write_text("garbage{")
    done = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "ingest", "garbage.json", "--store", "st"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("garbage.json: not valid JSON") == 1, done.stderr
    assert len((done.stdout + done.stderr).strip().splitlines()) <= 4, done.stdout + done.stderr
