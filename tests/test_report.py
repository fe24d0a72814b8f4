from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.report import make_report
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


def _store(tmp_path: Path) -> TraceStore:
    store = TraceStore(tmp_path / "store")
    for i in range(6):
        store.write(
            ExecutionTrace(
                trace_id=f"t{i}",
                timestamp=f"2026-11-{10 + i % 3:02d}T10:00:00",
                agent_name="demo",
                user_query="<script>alert(1)</script>" if i == 0 else f"task {i}",
                tool_calls=[
                    ToolCallTrace(tool_name="calc", success=i % 2 == 0),
                    ToolCallTrace(tool_name="<b>evil</b>"),
                ],
                rewards={"format": i / 5, "code_execution": None},
                reward_score=i / 5,
                label=i > 2,
                label_source="manual" if i == 5 else "engine",
            )
        )
    return store


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1 / s, "reward": s / 10, "kl": s / 100}) + "\n" for s in range(1, 5))
        + '{"step": 5, "loss"'
    )
    (run / "eval").mkdir()
    (run / "eval" / "eval_report.json").write_text(
        json.dumps(
            {
                "model": "run/adapter",
                "baseline": "smollm2-135m",
                "n_prompts": 4,
                "per_reward": {"format": {"baseline": 0.4, "model": 0.6}},
                "combined": {"baseline": 0.4, "model": 0.6},
            }
        )
    )
    return run


def test_report_has_every_section_and_escapes_trace_text(tmp_path: Path) -> None:
    result = make_report(_store(tmp_path), tmp_path / "out", [_run_dir(tmp_path)])
    page = result.html.read_text()
    for heading in ("Overview", "Before / after", "Traces per day", "Rewards", "Labels", "Tools", "Training"):
        assert f"<h2>{heading}</h2>" in page
    assert "<script>alert(1)</script>" not in page and "<b>evil</b>" not in page
    assert "&lt;b&gt;evil&lt;/b&gt;" in page
    assert "+0.200" in page  # the before/after delta
    assert "NOT whether the answer is right" not in page  # the store has no task_completion score
    assert "<td>format</td><td>well-formed replies</td>" in page  # what each reward measures, beside its name
    names = {p.name for p in result.pngs}
    assert {"traces_per_day.png", "rewards.png", "labels.png", "tools.png", "training_0.png", "eval_0.png"} <= names
    assert result.metrics.tools["calc"].failures == 3
    assert result.metrics.reward_none["code_execution"] == 6


def test_report_cli_on_an_unscored_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(RL_TRACES, tmp_path / "s")
    assert main(["report", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "run `flowrl score`" in page and "run `flowrl eval`" in page
    assert "3 traces" in capsys.readouterr().out


def test_missing_run_dir_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["report", "--store", str(tmp_path), "--out", str(tmp_path / "o"), "--run", str(tmp_path / "nope")]) == 2
    )
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="headless Chromium not installed (apt-get install chromium)"
)
def test_report_renders_in_a_real_browser(tmp_path: Path) -> None:
    result = make_report(_store(tmp_path), tmp_path / "out", [_run_dir(tmp_path)])
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1200,2400",
            f"--screenshot={shot}",
            result.html.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file() and shot.stat().st_size > 20_000  # a blank page is a few KB


def test_report_cli_on_a_segment_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flowrl.store.segments import SegmentStore

    segments = SegmentStore(tmp_path / "segs", writer_id="r")
    segments.write_many(list(_store(tmp_path).iter_traces()))
    segments.flush()
    assert main(["report", "--store", str(tmp_path / "segs"), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "&lt;b&gt;evil&lt;/b&gt;" in page and "<b>evil</b>" not in page
    assert "6 traces" in capsys.readouterr().out


def test_success_rates_are_drawn_on_an_axis_that_shows_them() -> None:
    """1/60 -> 3/60 drawn on 0..1 read as zero (the demo's first report); the axis now ends a little above the
    highest interval, on a step of 0.05, and still at 1 for rates near it."""
    from flowrl.report.plots import rate_top

    low = [{"rate": 1 / 60, "ci95": [0.003, 0.089]}, {"rate": 3 / 60, "ci95": [0.017, 0.137]}]
    assert rate_top(low) == pytest.approx(0.2)
    assert rate_top([{"rate": 0.9, "ci95": [0.8, 0.97]}]) == 1.0
    assert all(rate_top([{"rate": r, "ci95": [r, hi]}]) >= hi for r, hi in ((0.0, 0.06), (0.3, 0.45), (0.5, 0.86)))


def test_the_report_shows_the_promotion_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each candidate's rate with its interval against the model it had to beat, the refusals with their reason,
    rollbacks, and what is promoted now; from promotions.jsonl beside the store and in a --run folder."""
    from flowrl.promote.history import Entry, History

    figures = {
        "n": 150,
        "rate_current": 0.02,
        "rate_candidate": 40 / 150,
        "p": 1e-9,
        "diff": 0.25,
        "diff_ci95": [0.18, 0.32],
    }
    improve_out = tmp_path / "improve-out"
    history = History(improve_out / "promotions.jsonl")
    history.append(Entry("promote", "improve-out/round-1/adapter", None, figures=figures, reason="promoted: better"))
    weak = dict(figures, rate_candidate=0.29, p=0.45, diff=0.02, diff_ci95=[-0.03, 0.07])
    history.append(
        Entry("refuse", "improve-out/round-2/adapter", "improve-out/round-1/adapter", figures=weak,
              reason="not promoted: not significant at alpha 0.05 <script>x</script>")
    )  # fmt: skip
    beside = History(tmp_path / "promotions.jsonl")  # beside the store: flowrl promote's default
    beside.append(Entry("promote", "/models/a", None, figures=figures, reason="promoted"))
    beside.rollback()

    result = make_report(_store(tmp_path), tmp_path / "out", [improve_out])  # a folder with only the history
    page = result.html.read_text()
    assert "<h2>Promotions</h2>" in page and "<script>x</script>" not in page
    assert "26.7% [20.2%, 34.3%]" in page and "+25.0 pts [+18.0 pts, +32.0 pts]" in page  # Wilson 95% of 40/150
    assert "not significant at alpha 0.05" in page and "0.45" in page
    assert "Promoted now: <b>improve-out/round-1/adapter</b>" in page  # the refused round 2 changed nothing
    assert "rollback" in page and "Promoted now: <b>the base model</b>" in page

    (tmp_path / "promotions.jsonl").write_text("{oops\n")  # a damaged record: said in its section, the page is made
    page = make_report(_store(tmp_path), tmp_path / "out", [improve_out]).html.read_text()
    assert "is not a promotion record" in page and "round-1/adapter" in page


def test_task_completion_is_not_shown_as_success(tmp_path: Path) -> None:
    """task_completion averaged 0.963 while reference_answer averaged 0.083 (a wrong "12 * 7 = 94" scores 1.0): the
    report says beside each reward what it measures."""
    store = TraceStore(tmp_path / "store")
    store.write(
        ExecutionTrace(trace_id="w", user_query="12 * 7?", rewards={"task_completion": 1.0, "reference_answer": 0.0})
    )
    page = make_report(store, tmp_path / "out").html.read_text()
    assert (
        "<td>task_completion</td><td>the run ended normally by its own account; NOT whether the answer is right" in page
    )
    assert "<td>reference_answer</td><td>the answer is the task&#x27;s reference, unhedged</td>" in page
