"""Issue 22, "rough edges": `traces ls` at 80 columns, `export` overwriting, failed tools in synthesised
transcripts, the report's step count, and `build-dataset` on an unscored store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace
from flowrl.trace.transcript import synthesize_messages

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


def _small_store(root: Path) -> TraceStore:
    store = TraceStore(root)
    for i in range(3):
        store.write(
            ExecutionTrace(
                trace_id=f"trace-{i:08d}",
                timestamp=f"2026-11-1{i}T09:3{i}:00",
                agent_name="research-agent",
                session_id="a-rather-long-session-name",
                user_query="Compare the quarterly revenue of three companies " * 3,
                tool_calls=[ToolCallTrace(tool_name="search")] * (i + 1),
                reward_score=0.25 * i,
                label=i > 0,
                label_source="manual" if i == 2 else "engine",
            )
        )
    return store


@pytest.mark.parametrize("columns", ["80", None])  # None: piped, rich's default width of 80
def test_traces_ls_keeps_the_key_columns_at_80_columns(
    tmp_path: Path, columns: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    store = _small_store(tmp_path / "s")
    assert main(["traces", "ls", "--store", str(store.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:2] == ["trace_id", "time"] and {"tools", "ok", "reward", "label", "query"} <= set(header)
    rows = lines[1:4]
    assert all(len(line) <= 80 for line in lines[:4])
    for i, line in enumerate(rows):
        assert f"trace-{i:08d}" in line and f"2026-11-1{i} 09:3{i}" in line
        assert f"  {i + 1}  " in line  # tools
        assert f"{0.25 * i:.2f}" in line
        assert ("good (manual)" if i == 2 else "good" if i else "bad") in line
        assert "Compare the" in line and line.rstrip().endswith("…")  # the query is what gets shortened
    assert "hidden" in lines[4]


def test_traces_ls_shows_every_column_when_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    store = _small_store(tmp_path / "s")
    assert main(["traces", "ls", "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "research-agent" in out and "a-rather-long…" in out and "hidden" not in out


def test_failed_tool_message_in_a_synthesised_transcript_carries_the_error() -> None:
    calls = [
        {
            "tool_name": "stock",
            "arguments": {"ticker": "ACME"},
            "result": None,
            "success": False,
            "error": "HTTP 503 from quotes API",
        }
    ]
    tool = [m for m in synthesize_messages("price?", calls, "") if m["role"] == "tool"]
    assert tool[0]["content"] == "Error: HTTP 503 from quotes API"
    ok = synthesize_messages("q", [{"tool_name": "calc", "result": "4", "success": True}], "4")
    assert [m["content"] for m in ok if m["role"] == "tool"] == ["4"]


def test_failed_tool_in_a_trace_without_transcript_shows_its_error() -> None:
    from flowrl.trace.load import load_trace

    trace = load_trace(
        {
            "schema_version": 1,
            "trace_id": "t1",
            "user_query": "price?",
            "final_response": "n/a",
            "tool_calls": [{"tool_name": "stock", "result": "", "success": False, "error": "timeout"}],
        }
    )
    assert [m["content"] for m in trace.messages if m["role"] == "tool"] == ["Error: timeout"]


def test_report_counts_logged_steps_without_the_summary_line(tmp_path: Path) -> None:
    from flowrl.report import make_report

    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": 1.5},
        {"step": 2, "summary": True, "loss": 1.75, "trl": {"train_runtime": 3.0}},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = make_report(TraceStore(tmp_path / "s"), tmp_path / "out", [run]).html.read_text()
    assert "2 logged steps" in page and "3 logged steps" not in page
    assert "last loss 1.5" in page


def test_export_refuses_to_overwrite_without_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    from helpers_export import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    args = ["export", "--model", str(model), "--out", str(out), "--quant", "f16", "--no-verify", "--format", "gguf"]
    assert main(args) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "--overwrite" in err[0]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing touched
    (out / "model-q8_0.gguf").write_bytes(b"stale")  # an earlier export's file goes too
    (out / "notes.txt").write_text("mine")
    assert main([*args, "--overwrite"]) == 0
    assert not (out / "model-q8_0.gguf").exists() and (out / "notes.txt").read_text() == "mine"
    assert (out / "model-f16.gguf").stat().st_mtime_ns != before["model-f16.gguf"]
    assert json.loads((out / "export.json").read_text())["quant"] == "f16"


@pytest.mark.parametrize("method", ["kto", "sft", "dpo"])
def test_build_dataset_on_an_unscored_store_says_to_run_score(
    method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(RL_TRACES, tmp_path / "s")
    code = main(["build-dataset", "-m", method, "--store", str(tmp_path / "s"), "-o", str(tmp_path / "ds"), "-q"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run `flowrl score --store {tmp_path / 's'}` first" in err[0]


def test_build_dataset_hint_is_not_given_for_a_scored_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(RL_TRACES, tmp_path / "s")
    TraceStore(tmp_path / "s").label("0498911e921f", True)
    code = main(["build-dataset", "-m", "dpo", "--store", str(tmp_path / "s"), "-o", str(tmp_path / "ds"), "-q"])
    assert code == 2 and "flowrl score" not in capsys.readouterr().err


def test_every_problem_and_warning_is_printed_once(tmp_path: Path) -> None:
    """Issue 22: a skipped file was logged as it was read and named again at the end of the command, and flowrl's
    own warnings read `WARNING flowrl.x: flowrl: ...`."""
    import subprocess
    import sys

    _small_store(tmp_path)
    bad = tmp_path / "2026-11-10" / "broken.json"
    bad.write_text("{bad")
    done = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "traces", "ls", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("broken.json") == 1 and "WARNING flowrl" not in done.stderr
    verbose = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "-v", "traces", "ls", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verbose.stderr.count("broken.json") == 2  # --verbose also logs it as it is read
