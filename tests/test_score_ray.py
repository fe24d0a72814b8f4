"""`flowrl score --ray`: the same rewards as the one-process run, trace by trace; no ray without --ray.

The Ray run (slow: a local Ray head takes about 10 s to start) scores a copy of the store `test_score_cli` uses,
plus traces whose code the sandbox runs, a host outcome and a manual label, on a local Ray with 2 CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.ray_scoring import decode_trace, encode_trace, score_store_ray
from flowrl.rewards.scoring import ErrorBudgetExceeded
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace
from tests.test_score_cli import fill_store

VOLATILE = {"duration", "durations", "elapsed"}  # timings the sandbox reports: they differ from run to run


def code_store(root: Path) -> TraceStore:
    """`fill_store`'s traces, plus runs whose code the sandbox executes (one clean, one failing, one mixed, two
    of the same task) and a host outcome."""
    store = fill_store(root)
    runs = {
        "code-ok": [("exec_code", {"code": "print(sum(range(10)))"}), ("bash", {"command": "true"})],
        "code-bad": [("python", {"code": "raise ValueError('no')"})],
        "code-mixed": [
            ("run_python", {"code": "import json; print(json.dumps([1]))"}),
            ("shell", {"command": "exit 3"}),
        ],
        "code-same-task": [("exec_code", {"code": "print(45)"})],
    }
    for i, (trace_id, calls) in enumerate(runs.items()):
        store.write(
            ExecutionTrace(
                trace_id=trace_id,
                timestamp=f"2026-11-24T10:0{i}:00",
                user_query="sum of 0..9?" if trace_id in ("code-ok", "code-same-task") else f"task {trace_id}",
                final_response="45",
                success=trace_id != "code-bad",
                tool_calls=[ToolCallTrace(tool_name=name, arguments=args, result="") for name, args in calls],
            )
        )
    store.record_outcome("code-ok", success=True, reference="45", source="test")
    return store


def config(tmp_path: Path) -> Path:
    path = tmp_path / "rewards.toml"
    path.write_text("[rewards.code_execution]\nenabled = true\ntimeout = 20\n")
    return path


def stable(value: object) -> object:
    """Details without the sandbox's timings."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def scored(store: TraceStore) -> dict[str, dict]:
    return {
        t.trace_id: {
            "rewards": t.rewards,
            "details": stable(t.reward_details),
            "score": t.reward_score,
            "label": (t.label, t.label_source, t.manual_review),
        }
        for t in store.iter_traces()
    }


def test_the_wire_keeps_a_trace_and_its_outcomes(tmp_path):
    store = code_store(tmp_path / "store")
    trace = store.get("code-ok")
    back = decode_trace(*encode_trace(trace))
    assert back == trace and back.outcomes == trace.outcomes and len(back.outcomes) == 1


def test_without_ray_nothing_imports_ray(tmp_path):
    store = code_store(tmp_path / "store")
    script = (
        "import sys\n"
        "from flowrl.cli import main\n"
        f"rc = main(['score', '--store', {str(store.root)!r}, '--config', {str(tmp_path / 'none.toml')!r}])\n"
        "assert rc == 0, rc\n"
        "print('RAY' if 'ray' in sys.modules else 'NO-RAY')\n"
    )
    (tmp_path / "none.toml").write_text("[rewards.code_execution]\nenabled = false\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "NO-RAY"
    assert "scored 9 of 9 traces" in proc.stdout


def test_ray_missing_is_one_line_naming_the_fix(tmp_path, capsys, monkeypatch):
    store = code_store(tmp_path / "store")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["score", "--store", str(store.root), "--config", str(config(tmp_path)), "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'ray[data]'" in err
    assert all(not t.rewards for t in store.iter_traces())  # nothing scored, nothing written


@pytest.mark.slow
def test_ray_scores_as_the_one_process_run(tmp_path, capsys):
    ray = pytest.importorskip("ray")
    one, on_ray = code_store(tmp_path / "one"), code_store(tmp_path / "ray")
    cfg = str(config(tmp_path))
    assert main(["score", "--store", str(one.root), "--config", cfg]) == 0
    capsys.readouterr()
    assert main(["score", "--store", str(on_ray.root), "--config", cfg, "--ray", "--ray-workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "scored 9 of 9 traces" in out and "1 manual labels kept" in out
    assert not ray.is_initialized()  # the local Ray it started is stopped

    expected, got = scored(one), scored(on_ray)
    assert set(got) == set(expected)
    for trace_id in expected:
        assert got[trace_id] == expected[trace_id], trace_id
    assert got["code-ok"]["rewards"]["code_execution"] == 1.0
    assert got["code-bad"]["rewards"]["code_execution"] == 0.0
    assert got["code-mixed"]["rewards"]["code_execution"] == 0.5
    assert got["code-ok"]["rewards"]["host_outcome"] == 1.0  # the outcome went to the worker with the trace
    assert got["manual-bad"]["label"] == (False, "manual", True)

    # a new outcome makes that trace (only) due again, on Ray as in one process
    for store in (one, on_ray):
        store.record_outcome("code-bad", success=False, source="test")
    assert main(["score", "--store", str(one.root), "--config", cfg]) == 0
    assert main(["score", "--store", str(on_ray.root), "--config", cfg, "--ray", "--ray-workers", "1"]) == 0
    out = capsys.readouterr().out.split(str(one.root))[-1]  # what the Ray run printed
    assert "scored 1 of 9 traces under" in out and "8 already scored" in out
    assert "Dataset" not in out  # Ray Data's own log lines stay out of the command's output
    assert scored(on_ray) == scored(one)
    assert json.dumps(scored(on_ray)["code-bad"]["details"]["host_outcome"], sort_keys=True)


@pytest.mark.slow
def test_ray_over_the_error_budget_writes_nothing_and_stops_ray(tmp_path):
    """A judge that cannot be reached errs on every trace: the Ray run raises ErrorBudgetExceeded as one process
    does, writes nothing, and the local Ray it started is stopped."""
    ray = pytest.importorskip("ray")
    store = code_store(tmp_path / "store")
    path = tmp_path / "judge.toml"
    path.write_text(
        "[rewards.code_execution]\nenabled = false\n"
        "[rewards.judge]\nmodel = 'm'\nbase_url = 'http://127.0.0.1:9/v1'\nmax_retries = 0\ntimeout_s = 0.5\n"
    )
    with pytest.raises(ErrorBudgetExceeded, match="reward 'judge' crashed") as info:
        score_store_ray(store, RewardEngine.from_config(path), ray_workers=2, batch_size=2)
    assert info.value.summary.todo == 9 and info.value.summary.scored == 0
    assert not ray.is_initialized()
    assert all(not t.rewards for t in store.iter_traces())
