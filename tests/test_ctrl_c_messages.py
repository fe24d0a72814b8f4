"""Issue 39: after Ctrl-C, `flowrl eval`, `flowrl improve` and `flowrl demo` exited 130 without a word; each now
says what was kept and how to go on (improve and demo resume from their folders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowrl.cli import main


def _interrupt(*_: Any, **__: Any) -> Any:
    raise KeyboardInterrupt


def test_improve_says_what_was_kept_and_how_to_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import flowrl.cli.improve as cli_improve
    import flowrl.improve.loop as loop

    monkeypatch.setattr(cli_improve, "_agent_and_tasks", lambda *a: (None, [], [], None))
    monkeypatch.setattr(loop, "improve", _interrupt)
    assert main(["improve", "--out", str(tmp_path / "i")]) == 130
    err = capsys.readouterr().err
    assert f"kept in {tmp_path / 'i'}" in err and "run the same command again" in err


def test_demo_says_it_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import flowrl.demo.run as demo_run

    monkeypatch.setattr(demo_run.Demo, "run", _interrupt)
    assert main(["demo", "--out", str(tmp_path / "d")]) == 130
    assert "run `flowrl demo --out" in capsys.readouterr().err


def test_eval_says_nothing_was_written(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import flowrl.cli.train as cli_train

    monkeypatch.setattr(cli_train, "_eval_agent", _interrupt)
    assert main(["eval", "--agent", "example", "--model", "smollm2-135m"]) == 130
    assert "nothing was written" in capsys.readouterr().err
