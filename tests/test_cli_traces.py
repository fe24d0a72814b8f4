from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.store.files import TraceStore

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    shutil.copytree(RL_TRACES, tmp_path / "s")
    return tmp_path / "s"


def test_ls_lists_traces(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces", "ls", "--store", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "0498911e921f" in out and "3 traces" in out


def test_ls_ids_prints_only_ids_and_honours_filters(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces", "ls", "--ids", "--store", str(store_dir)]) == 0
    ids = capsys.readouterr().out.splitlines()
    assert sorted(ids) == ["0498911e921f", "2a86d8ba994f", "eb4f7d6913ae"]
    assert main(["traces", "ls", "--ids", "--limit", "1", "--store", str(store_dir)]) == 0
    assert capsys.readouterr().out.splitlines() == ids[:1]
    assert main(["traces", "label", "2a86d8ba994f", "bad", "--store", str(store_dir)]) == 0
    capsys.readouterr()
    assert main(["traces", "ls", "--ids", "--label", "bad", "--store", str(store_dir)]) == 0
    assert capsys.readouterr().out == "2a86d8ba994f\n"
    assert main(["traces", "ls", "--ids", "--agent", "nobody", "--store", str(store_dir)]) == 0
    assert capsys.readouterr().out == ""


def test_show_prints_json(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces", "show", "0498911e921f", "--store", str(store_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["trace_id"] == "0498911e921f"


def test_label_then_filter(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces", "label", "2a86d8ba994f", "bad", "--notes", "stock failed", "--store", str(store_dir)]) == 0
    t = TraceStore(store_dir).get("2a86d8ba994f")
    assert t.label is False and t.label_source == "manual"
    capsys.readouterr()
    assert main(["traces", "ls", "--label", "bad", "--store", str(store_dir)]) == 0
    assert "1 traces" in capsys.readouterr().out


def test_errors_are_one_line_and_exit_2(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces", "show", "missing", "--store", str(store_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flowrl: error: no trace 'missing'")
    assert main(["traces", "ls", "--since", "yesterday", "--store", str(store_dir)]) == 2
    assert "YYYY-MM-DD" in capsys.readouterr().err


def test_exit_codes_of_commands_reach_the_shell() -> None:
    import typer

    from flowrl.cli import app

    @app.command("_exit3", hidden=True)
    def _exit3() -> None:
        raise typer.Exit(3)

    try:
        assert main(["_exit3"]) == 3
    finally:
        app.registered_commands.pop()
