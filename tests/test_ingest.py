"""Ingest on the shared FlowAgent 0.1.28 fixtures: real checkpoints, obs files, live file and rl_traces."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from flowrl.ingest import CheckpointLoader, ingest_paths
from flowrl.store.files import TraceStore

AGENT = "sample_agent"
QUERIES = {
    "2c4cbe40": ("coding", "What is the sum of squares from 1 to 10?", "The sum of squares from 1 to 10 is 385."),
    "abb7cda3": (
        "research",
        "What's the weather in Berlin and the current ACME stock price?",
        "Berlin: 21C and sunny. I could not get the ACME quote because the quote service is unreachable.",
    ),
    "f90efd19": ("coding", "And the sum of cubes?", "The sum of cubes from 1 to 10 is 3025 (= 55^2)."),
}


@pytest.fixture
def data_dir(flowagent_fixtures: Path) -> Path:
    return flowagent_fixtures / "tb_data_dir"


@pytest.fixture
def agents(data_dir: Path) -> Path:
    return data_dir / ".data" / "main-vm" / "Agents"


@pytest.fixture
def copy_agents(agents: Path, tmp_path: Path) -> Path:
    target = tmp_path / "data" / "Agents"
    shutil.copytree(agents, target)
    return target


def _rendering(flowagent_fixtures: Path) -> dict[str, dict]:
    """toolboxv2's own rl traces of the three runs, by run id (tasks_created[0].task_id)."""
    out = {}
    for p in (flowagent_fixtures / "rendering" / "rl_traces").rglob("*.json"):
        d = json.loads(p.read_text())
        out[d["tasks_created"][0]["task_id"]] = d
    return out


def _by_run(traces) -> dict:
    return {t.run_id: t for t in traces}


def test_data_dir_gives_one_trace_per_user_turn(data_dir: Path, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([data_dir], store)
    traces = list(store.iter_traces())
    assert len(traces) == 3 and summary.new == 3
    # three snapshots hold 1 + 2 + 3 turns and the obs files the same 3 runs again: 9 reads, 6 duplicates
    assert (summary.read, summary.duplicate, summary.skipped, summary.rejected_count) == (9, 6, 0, 0)
    for run_id, t in _by_run(traces).items():
        session, query, answer = QUERIES[run_id]
        assert (t.session_id, t.user_query, t.final_response, t.agent_name) == (session, query, answer, AGENT)
        assert t.source == "checkpoint"
        assert not t.final_response.startswith("RUN SUMMARY")


def test_traces_match_toolboxv2s_own_rendering(data_dir: Path, flowagent_fixtures: Path) -> None:
    expected = _rendering(flowagent_fixtures)
    traces = _by_run(CheckpointLoader(data_dir).load())
    assert set(traces) == set(expected)
    for run_id, exp in expected.items():
        t = traces[run_id]
        assert t.user_query == exp["user_query"]
        assert t.final_response == exp["final_response"]
        assert [(c.tool_name, c.arguments, c.result, c.success) for c in t.tool_calls] == [
            (c["tool_name"], c["arguments"], c["result"], c["success"]) for c in exp["tool_calls"]
        ]
        assert [r.content for r in t.reasoning_steps] == [r["content"] for r in exp["reasoning_steps"]]
        assert (t.total_tokens_in, t.total_tokens_out) == (exp["total_tokens_in"], exp["total_tokens_out"])
        assert t.execution_duration_ms == pytest.approx(exp["execution_duration_ms"])
        assert [x["task_id"] for x in t.tasks_completed] == [x["task_id"] for x in exp["tasks_completed"]]
        assert [x["task_id"] for x in t.tasks_failed] == [x["task_id"] for x in exp["tasks_failed"]]


def test_honest_tool_success_and_model_reported_success(data_dir: Path) -> None:
    traces = _by_run(CheckpointLoader(data_dir).load())
    cubes = traces["f90efd19"].tool_calls
    assert cubes[0].tool_name == "exec_code" and cubes[0].success is False  # obs said "ok", result has a traceback
    assert "IndexError" in cubes[0].result and cubes[1].success is True
    research = traces["abb7cda3"]
    assert {c.tool_name: c.success for c in research.tool_calls} == {
        "load_tools": True,
        "get_weather": True,
        "fetch_stock": False,
    }
    assert research.success is False and traces["2c4cbe40"].success is True
    assert [c.call_id for c in research.tool_calls] == ["call_4", "call_5", "call_6"]
    assert research.tool_calls[2].duration_ms == pytest.approx(0.9)


def test_messages_are_the_working_history(data_dir: Path, flowagent_fixtures: Path) -> None:
    """The transcript rebuilt from obs steps equals ExecutionContext.working_history (think result once)."""
    contexts = json.loads((flowagent_fixtures / "rendering" / "execution_contexts.json").read_text())
    traces = _by_run(CheckpointLoader(data_dir).load())
    for ctx in contexts.values():
        expected, seen = [], set()
        for m in ctx["working_history"]:
            if m["role"] == "tool":
                if m["tool_call_id"] in seen:
                    continue
                seen.add(m["tool_call_id"])
            expected.append(m)
        assert traces[ctx["run_id"]].messages == expected


def test_statistics_are_not_spread_over_turns(copy_agents: Path) -> None:
    shutil.rmtree(copy_agents / AGENT / "obs")
    traces = CheckpointLoader(copy_agents).load()
    assert len(traces) == 3
    for t in traces:
        assert (t.total_tokens_in, t.total_tokens_out, t.total_cost, t.llm_calls_count) == (None, None, None, None)
        assert t.success is None and t.tool_calls == []
        assert t.messages == [
            {"role": "user", "content": t.user_query},
            {"role": "assistant", "content": t.final_response},
        ]


def test_obs_only_then_checkpoints_collapse_into_the_same_traces(copy_agents: Path, tmp_path: Path) -> None:
    """The lag artefact: a run is first seen only in obs, its turn reaches a checkpoint later."""
    store = TraceStore(tmp_path / "store")
    first = ingest_paths([copy_agents / AGENT / "obs"], store)
    assert first.new == 3 and first.new_by_source == {"obs": 3}
    again = ingest_paths([copy_agents], store)
    assert again.new == 0 and again.duplicate == again.read == 9
    assert store.count() == 3


def test_checkpoints_without_obs_collapse_with_the_joined_traces(copy_agents: Path, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    obs = copy_agents / AGENT / "obs"
    moved = tmp_path / "obs-later"
    shutil.move(str(obs), moved)
    assert ingest_paths([copy_agents], store).new == 3
    shutil.move(str(moved), obs)
    assert ingest_paths([copy_agents], store).new == 0
    assert store.count() == 3


def test_the_same_turn_in_many_snapshots_is_one_trace(copy_agents: Path, tmp_path: Path) -> None:
    cp_dir = copy_agents / "checkpoint" / AGENT
    newest = sorted(cp_dir.glob("*.pkl"))[-1]
    for n in range(5):
        shutil.copy(newest, cp_dir / f"agent_checkpoint_20261123_00000{n}.pkl")
    shutil.copy(newest, cp_dir / "final_checkpoint.pkl")
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([copy_agents], store)
    assert summary.new == 3 and store.count() == 3


def test_reingest_adds_nothing(data_dir: Path, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    ingest_paths([data_dir], store)
    files = sorted(p.name for p in store.iter_paths())
    again = ingest_paths([data_dir], store)
    assert again.new == 0 and again.duplicate == again.read
    assert sorted(p.name for p in store.iter_paths()) == files


@pytest.mark.parametrize("which", ["agents", "checkpoint_dir", "single_pkl", "obs_file"])
def test_every_kind_of_path(which: str, agents: Path, data_dir: Path) -> None:
    cp_dir = agents / "checkpoint" / AGENT
    path = {
        "agents": agents,
        "checkpoint_dir": cp_dir,
        "single_pkl": sorted(cp_dir.glob("*.pkl"))[0],
        "obs_file": agents / AGENT / "obs" / "run_abb7cda3.json",
    }[which]
    traces = CheckpointLoader(path).load()
    expected = {"agents": 3, "checkpoint_dir": 3, "single_pkl": 1, "obs_file": 1}[which]
    assert len(traces) == expected
    if which == "checkpoint_dir":  # the agent's obs dir comes along, so turns carry their tool calls
        assert all(t.tool_calls or t.reasoning_steps for t in traces)


def test_rl_traces_import(flowagent_fixtures: Path, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([flowagent_fixtures / "rendering" / "rl_traces"], store)
    assert summary.new == 3 and summary.new_by_source == {"import": 3}
    ids = {p.stem for p in (flowagent_fixtures / "rendering" / "rl_traces").rglob("*.json")}
    assert {t.trace_id for t in store.iter_traces()} == ids
    cubes = next(t for t in store.iter_traces() if t.user_query == "And the sum of cubes?")
    assert [c.success for c in cubes.tool_calls] == [False, True]
    assert ingest_paths([flowagent_fixtures / "rendering" / "rl_traces"], store).new == 0


def _live_setup(copy_agents: Path, flowagent_fixtures: Path, age_s: float) -> Path:
    obs = copy_agents / AGENT / "obs"
    (obs / "run_abb7cda3.json").unlink()  # the run never finished: no run file
    live = obs / "live_abb7cda3.jsonl"
    shutil.copy(flowagent_fixtures / "rendering" / "live_abb7cda3.captured_mid_run.jsonl", live)
    old = time.time() - age_s
    os.utime(live, (old, old))
    shutil.rmtree(copy_agents / "checkpoint")
    return live


def test_interrupted_run_from_live_file(copy_agents: Path, flowagent_fixtures: Path) -> None:
    _live_setup(copy_agents, flowagent_fixtures, age_s=3600)
    loader = CheckpointLoader(copy_agents)
    traces = {t.run_id: t for t in loader.load()}
    t = traces["abb7cda3"]
    assert t.source == "live-file" and t.status == "interrupted" and t.success is None
    assert t.user_query == QUERIES["abb7cda3"][1] and t.agent_name == AGENT
    assert t.final_response == ""
    names = [c.tool_name for c in t.tool_calls]
    assert names == ["load_tools", "get_weather", "fetch_stock"]  # snapshot + the step logged after it
    assert t.tool_calls[2].success is False
    assert t.messages[1] == {"role": "user", "content": QUERIES["abb7cda3"][1]}


def test_live_file_of_a_running_run_is_left_alone(copy_agents: Path, flowagent_fixtures: Path) -> None:
    _live_setup(copy_agents, flowagent_fixtures, age_s=0)
    loader = CheckpointLoader(copy_agents)
    assert "abb7cda3" not in {t.run_id for t in loader.load()}
    assert any("still in progress" in r for r in loader.summary.skip_reasons)


def test_live_file_next_to_its_run_file_is_skipped(copy_agents: Path, flowagent_fixtures: Path) -> None:
    obs = copy_agents / AGENT / "obs"
    shutil.copy(flowagent_fixtures / "rendering" / "live_abb7cda3.captured_mid_run.jsonl", obs / "live_abb7cda3.jsonl")
    traces = CheckpointLoader(copy_agents, live_idle_s=0).load()
    assert [t.source for t in traces] == ["checkpoint"] * 3


def test_imported_trace_with_an_unsafe_id_and_other_json(flowagent_fixtures: Path, tmp_path: Path) -> None:
    day = tmp_path / "rl" / "2026-11-22"
    day.mkdir(parents=True)
    src = next((flowagent_fixtures / "rendering" / "rl_traces").rglob("*.json"))
    data = json.loads(src.read_text())
    (day / "a.json").write_text(json.dumps({**data, "trace_id": "../../escape"}))
    (day / "b.json").write_text(json.dumps({"something": "else"}))  # not a trace: ignored while walking
    loader = CheckpointLoader(tmp_path / "rl")
    traces = loader.load()
    assert [t.trace_id[:4] for t in traces] == ["imp-"] and loader.summary.rejected_count == 0
    explicit = CheckpointLoader(day / "b.json")
    assert explicit.load() == [] and "not a trace file" in explicit.summary.rejected[0].reason
