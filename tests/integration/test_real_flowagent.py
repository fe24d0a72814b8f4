"""flowrl's live capture against the real toolboxv2 FlowAgent 0.1.28, offline.

toolboxv2 lives in its own venv (tests/integration/toolbox_env.py, scripts/setup_toolboxv2_env.sh),
built on first use (about 25-30 s with PyPI reachable) and reused afterwards. The scenario runs in
tests/integration/flowagent_driver.py in a subprocess of that venv, sandboxed: HOME, TB_DATA_DIR,
TMPDIR and FLOWRL_HOME under tmp_path, and a PATH whose first entry holds `pip`/`playwright`
stand-ins that exit 1 (toolboxv2's isaa web helper may run `pip install playwright && playwright
install chromium` through os.system).

The driver runs the same scenario on an unhooked agent (baseline) and on a hooked one, then unhooks
and runs once more. These tests read the JSON summary the driver printed and the files in the store.

Skipped (with the reason) when pip cannot install toolboxv2 here, e.g. without network; set
FLOWRL_REQUIRE_TOOLBOX=1 to make that a failure instead.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DRIVER = HERE / "flowagent_driver.py"
DRIVER_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def run(toolbox_python: Path, toolbox_env: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the driver once for the whole module; returns the summary plus what is in the store."""
    root = tmp_path_factory.mktemp("flowagent_it")
    store = root / "store"
    out = root / "summary.json"
    env = toolbox_env.sandbox_env(root, toolbox_python.parent.parent)
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(toolbox_python), str(DRIVER), "--store", str(store), "--out", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
    )
    seconds = time.monotonic() - t0
    log = (proc.stdout + "\n" + proc.stderr)[-6000:]
    assert out.exists(), f"driver wrote no summary (exit {proc.returncode}):\n{log}"
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert "fatal" not in summary, f"driver failed:\n{summary['fatal']}\n--- log tail ---\n{log}"
    assert proc.returncode == 0, f"driver exit {proc.returncode}:\n{log}"
    print(f"driver: {seconds:.1f} s; its timings: {summary['timings']}")
    files = sorted(p for p in store.rglob("*.json") if ".staging" not in p.parts)
    traces = [json.loads(p.read_text(encoding="utf-8")) for p in files]
    fake_log = root / "fake_tool_calls.log"
    return {
        "summary": summary,
        "store": store,
        "files": files,
        "traces": traces,
        "root": root,
        "seconds": seconds,
        "fake_tool_calls": fake_log.read_text() if fake_log.exists() else "",
    }


RUNS = ("weather", "followup", "stock", "sidecar", "stream")


def _by_run(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Map each hooked run of the scenario to the one stored trace whose user_query is its query."""
    queries = {name: run["summary"]["hooked"]["runs"][name]["query"] for name in RUNS}
    queries["weather"] = queries["weather"].split(" My OpenAI key")[0]  # the rest holds the masked secret
    found: dict[str, dict[str, Any]] = {}
    for name, query in queries.items():
        matches = [t for t in run["traces"] if (t.get("user_query") or "").startswith(query)]
        assert len(matches) == 1, (
            f"run {name!r}: expected one trace with user_query starting {query!r}, got "
            f"{len(matches)}; stored user_queries: {[t.get('user_query') for t in run['traces']]}"
        )
        found[name] = matches[0]
    return found


def _calls(trace: dict[str, Any], tool: str) -> list[dict[str, Any]]:
    return [c for c in trace.get("tool_calls") or [] if c.get("tool_name") == tool]


# ------------------------------------------------------------------------------------------------


def test_driver_uses_this_checkout_and_real_flowagent(
    run: dict[str, Any], toolbox_python: Path, toolbox_env: Any
) -> None:
    summary = run["summary"]
    venv = toolbox_python.parent.parent
    assert Path(summary["toolboxv2_path"]).is_relative_to(venv), summary["toolboxv2_path"]
    assert Path(summary["flowrl_path"]) == REPO_ROOT / "flowrl"
    assert summary["toolboxv2_version"] == toolbox_env.TOOLBOXV2_VERSION
    assert summary["baseline"]["unscripted_main_calls"] == 0
    assert summary["hooked"]["unscripted_main_calls"] == 0
    assert summary["baseline"]["hold_timeouts"] == summary["hooked"]["hold_timeouts"] == 0


def test_scenario_behaves_as_scripted_without_the_hook(run: dict[str, Any]) -> None:
    """Guards the test itself: the baseline shows the FlowAgent behaviour the other tests rely on."""
    base = run["summary"]["baseline"]["runs"]
    answers = run["summary"]["answers"]
    for name in ("weather", "followup", "stock", "stream"):
        assert base[name]["result"] == answers[name], name
    assert base["followup"]["run_id"] == base["weather"]["run_id"], "FlowAgent no longer auto-resumes"
    assert base["stock"]["result_type"] == "tuple" and base["stock"]["ctx_type"] == "ExecutionContext"
    assert base["sidecar"]["took_sidecar_path"], "FlowAgent no longer answers an immediate ping from the sidecar"


def test_hook_leaves_return_values_unchanged(run: dict[str, Any]) -> None:
    base = run["summary"]["baseline"]["runs"]
    hooked = run["summary"]["hooked"]["runs"]
    for name in RUNS:
        assert hooked[name]["result"] == base[name]["result"], name
        assert hooked[name].get("result_type") == base[name].get("result_type"), name
    assert hooked["stock"]["ctx_type"] == "ExecutionContext"
    assert hooked["stock"]["ctx_run_id"] == hooked["stock"]["run_id"]
    assert hooked["followup"]["run_id"] == hooked["weather"]["run_id"], "the hook broke auto-resume"
    assert hooked["sidecar"]["took_sidecar_path"] == base["sidecar"]["took_sidecar_path"]
    assert hooked["stream"]["stable_chunks"] == base["stream"]["stable_chunks"]
    assert hooked["stream"]["done_success"] is True


def test_one_trace_per_run(run: dict[str, Any]) -> None:
    summary = run["summary"]
    assert len(run["traces"]) == len(RUNS), [t.get("user_query") for t in run["traces"]]
    assert len({t["trace_id"] for t in run["traces"]}) == len(RUNS)
    assert len(summary["files_after_flush"]) >= len(RUNS)
    _by_run(run)  # each run's query appears exactly once


def test_traces_are_valid_flowrl_traces(run: dict[str, Any]) -> None:
    from flowrl.store.files import TraceStore

    store = TraceStore(run["store"])
    assert len(list(store.iter_traces())) == len(RUNS) and not store.problems, store.problems
    for trace in run["traces"]:
        assert trace["schema_version"] >= 1
        assert trace["source"] == "live"
        assert trace["agent_name"] == "flowrl_it"
    for name, trace in _by_run(run).items():
        expected = run["summary"]["hooked"]["runs"][name]
        assert trace["session_id"] == expected["session_id"], name
        assert trace.get("run_id") == expected["run_id"], name


def test_user_query_is_the_query_of_that_run(run: dict[str, Any]) -> None:
    """On auto-resume FlowAgent keeps the first query in ctx.query; the trace must hold the new one."""
    traces = _by_run(run)
    assert traces["followup"]["user_query"] == "And in Rome?"
    assert traces["weather"]["user_query"] != traces["followup"]["user_query"]
    assert traces["stock"]["user_query"] == run["summary"]["hooked"]["runs"]["stock"]["query"]
    assert traces["stream"]["user_query"] == run["summary"]["hooked"]["runs"]["stream"]["query"]
    assert traces["sidecar"]["user_query"] == run["summary"]["hooked"]["runs"]["sidecar"]["query"]


def test_tool_calls_have_call_ids_and_honest_success(run: dict[str, Any]) -> None:
    traces = _by_run(run)
    (berlin,) = _calls(traces["weather"], "get_weather")
    assert berlin["call_id"] == "call_w2"
    assert berlin["success"] is True and not berlin.get("error")
    assert "Berlin: 21C, sunny" in berlin["result"]
    assert berlin["arguments"] in ({"city": "Berlin"}, '{"city": "Berlin"}')

    (rome,) = _calls(traces["followup"], "get_weather")
    assert rome["call_id"] == "call_f1" and rome["success"] is True
    ids = {c.get("call_id") for c in traces["followup"]["tool_calls"]}
    assert not ids & {"call_w1", "call_w2", "call_w3"}, f"run 1's calls leaked into the follow-up: {ids}"

    (stock,) = _calls(traces["stock"], "fetch_stock")
    assert stock["call_id"] == "call_s1"
    assert stock["success"] is False, stock
    assert "quote service unreachable" in ((stock.get("error") or "") + stock["result"]), stock

    (oslo,) = _calls(traces["stream"], "get_weather")
    assert oslo["call_id"] == "call_o1" and oslo["success"] is True

    for name, trace in traces.items():
        ids = [c.get("call_id") for c in trace["tool_calls"]]
        assert all(ids), f"{name}: a tool call without call_id: {trace['tool_calls']}"
        assert len(ids) == len(set(ids)), f"{name}: a call recorded twice (think is appended twice by FlowAgent): {ids}"


def test_think_is_captured_once(run: dict[str, Any]) -> None:
    trace = _by_run(run)["weather"]
    thinks = _calls(trace, "think")
    in_steps = [
        s for s in trace.get("reasoning_steps") or [] if "Plan: one get_weather call" in (s.get("content") or "")
    ]
    assert len(thinks) + len(in_steps) >= 1, "the think call is neither a tool call nor a reasoning step"
    assert len(thinks) <= 1


def test_final_response_and_success(run: dict[str, Any]) -> None:
    traces = _by_run(run)
    answers = run["summary"]["answers"]
    for name in ("weather", "followup", "stock", "stream"):
        assert traces[name]["final_response"] == answers[name], name
    assert traces["weather"]["success"] is True
    assert traces["followup"]["success"] is True
    assert traces["stream"]["success"] is True
    assert traces["stock"]["success"] is False


def test_sidecar_reply_is_recorded_as_its_own_turn(run: dict[str, Any]) -> None:
    """A query arriving while the previous run's commit is pending is answered by FlowAgent's sidecar
    (one LLM call, no ReAct loop). Its trace must not borrow the unfinished run's tools or answer."""
    summary = run["summary"]
    if not summary["hooked"]["runs"]["sidecar"]["took_sidecar_path"]:
        pytest.skip("FlowAgent did not take the sidecar path this time (the commit finished first)")
    trace = _by_run(run)["sidecar"]
    assert trace["final_response"] == summary["hooked"]["runs"]["sidecar"]["result"]
    assert not _calls(trace, "fetch_stock"), trace["tool_calls"]


def _check_openai_messages(name: str, messages: list[dict[str, Any]]) -> None:
    assert messages, f"{name}: no messages"
    seen_call_ids: set[str] = set()
    answered: set[str] = set()
    for i, m in enumerate(messages):
        where = f"{name}: messages[{i}]"
        assert m.get("role") in {"system", "user", "assistant", "tool"}, f"{where}: role {m.get('role')!r}"
        if m["role"] in ("system", "user"):
            assert isinstance(m.get("content"), str), where
        if m["role"] == "assistant":
            assert m.get("content") is None or isinstance(m["content"], str), where
            for tcall in m.get("tool_calls") or []:
                assert tcall.get("type") == "function" and tcall.get("id"), f"{where}: {tcall}"
                assert isinstance(tcall["function"]["name"], str), where
                assert isinstance(tcall["function"]["arguments"], str), f"{where}: arguments must be a JSON string"
                json.loads(tcall["function"]["arguments"])
                seen_call_ids.add(tcall["id"])
        if m["role"] == "tool":
            assert m.get("tool_call_id") in seen_call_ids, f"{where}: answers an unknown call {m.get('tool_call_id')!r}"
            assert m["tool_call_id"] not in answered, (
                f"{where}: {m['tool_call_id']} answered twice (FlowAgent appends think twice)"
            )
            answered.add(m["tool_call_id"])
            assert isinstance(m.get("content"), str), where


def test_messages_are_openai_chat_format(run: dict[str, Any]) -> None:
    traces = _by_run(run)
    for name, trace in traces.items():
        _check_openai_messages(name, trace["messages"])
        users = [m["content"] for m in trace["messages"] if m["role"] == "user"]
        assert any(u.startswith(trace["user_query"][:20]) for u in users), f"{name}: user turn missing: {users}"
    for name, call_id in (("weather", "call_w2"), ("followup", "call_f1"), ("stock", "call_s1"), ("stream", "call_o1")):
        msgs = traces[name]["messages"]
        assert any(tc["id"] == call_id for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls") or []), (
            name
        )
        assert any(m["role"] == "tool" and m.get("tool_call_id") == call_id for m in msgs), name


def test_finished_turns_carry_their_final_status(run: dict[str, Any]) -> None:
    """FlowAgent sets "completed" only in its background commit (execution_engine.py:1742); when
    a_run returns, the context still says "running". Settled runs must be stored as completed."""
    traces = _by_run(run)
    statuses = {name: traces[name].get("status") for name in ("weather", "followup", "stock")}
    assert statuses == {"weather": "completed", "followup": "completed", "stock": "completed"}, statuses


def test_flush_right_after_a_run_neither_hangs_nor_loses_it(run: dict[str, Any]) -> None:
    """The driver calls hook.flush() on the event loop's thread right after the a_stream run, while
    FlowAgent's commit of it is pending. It must return promptly with that run written."""
    summary = run["summary"]
    assert summary["flush_returned"] == "True"
    assert summary["flush_seconds"] < 10, summary["flush_seconds"]
    stream = _by_run(run)["stream"]
    assert stream["final_response"] == summary["answers"]["stream"]
    if summary["pending_commit_at_flush"]:
        assert stream["status"] in ("completed", "running"), stream["status"]


def test_secret_is_masked_in_every_stored_file(run: dict[str, Any]) -> None:
    secret = run["summary"]["secret"]
    leaks = [str(p) for p in run["store"].rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks, f"the raw key is in {leaks}"
    weather = _by_run(run)["weather"]
    assert "REDACTED" in weather["user_query"], weather["user_query"]


def test_unhook_restores_the_agent(run: dict[str, Any]) -> None:
    summary = run["summary"]
    assert summary["patched_while_hooked"], "hook_into_agent patched nothing on FlowAgent or its engine"
    assert summary["not_restored_after_unhook"] == []
    assert summary["after_unhook"]["result"] == summary["answers"]["after_unhook"]
    assert summary["files_after_unhook_run"] == summary["files_after_flush"], "a run after unhook() wrote a trace"
    assert not [t for t in run["traces"] if (t.get("user_query") or "").startswith("Weather in Paris")]


def test_hook_stats_add_up(run: dict[str, Any]) -> None:
    stats = run["summary"].get("stats_final")
    assert isinstance(stats, dict), f"hook.stats is missing or not a dataclass/dict: {stats!r}"
    problems = {
        k: v
        for k, v in stats.items()
        if k in ("errors", "write_errors", "build_errors", "capture_errors", "dropped", "mask_failures") and v
    }
    assert not problems, f"hook.stats reports problems: {stats}"
    assert stats.get("written") == stats.get("captured") == len(RUNS), stats
    assert stats.get("secrets_masked", 1) >= 1, stats
    assert run["summary"]["flush_returned"] == "True"


def test_sandbox_held(run: dict[str, Any]) -> None:
    """toolboxv2 wrote into the sandboxed HOME and TB_DATA_DIR; the fake pip blocked any install."""
    root = run["root"]
    assert (root / "tb_data" / ".data").is_dir()
    assert (root / "home" / ".config" / "ToolBoxV2").is_dir()
    # toolboxv2 loads its isaa module on the first run commit (execution_engine.py _commit_run_slow ->
    # get_mod("isaa") -> module.py imports the web helper), which runs `pip install playwright ...`
    # when playwright is missing. Every such attempt must have hit the refusing stand-in.
    for line in run["fake_tool_calls"].splitlines():
        assert "/fakebin/" in line, line
    print("refused install attempts:", run["fake_tool_calls"].splitlines())
