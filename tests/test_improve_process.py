"""`AgentProcess`: the user's agent built, hooked and run by another Python (`flowrl improve --agent-python`), with
its traces in the stage's store, its failures as failed tasks, and nothing left running."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.engines.policy import Policy
from flowrl.improve.process import AgentProcess, AgentProcessError
from flowrl.store.files import TraceStore

HELPERS = Path(__file__).parent / "helpers_process_agent.py"
POLICY = Policy(base_url="http://127.0.0.1:9/v1", model="collect-1", temperature=0.8, seed=3)


def _workers() -> set[int]:
    out = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-f", "flowrl.improve.worker"], capture_output=True, text=True
    ).stdout
    return {int(p) for p in out.split()}


def _open(agent: AgentProcess, store: Path):  # noqa: ANN202
    return agent.open(POLICY, store=store, metadata={"improve_round": 1}, hook_options={}, concurrency=4)


async def _ask(opened, queries: dict[str, str]) -> dict[str, object]:  # noqa: ANN001
    async def one(session: str, query: str) -> object:
        try:
            return await opened.a_run(query, session)
        except AgentProcessError as exc:
            return exc

    answers = await asyncio.gather(*(one(s, q) for s, q in queries.items()))
    return dict(zip(queries, answers, strict=True))


def test_the_agent_runs_in_its_own_python_and_its_traces_land_in_the_store(tmp_path: Path) -> None:
    before = _workers()
    agent = AgentProcess(f"{HELPERS}:make_agent", sys.executable)
    store = tmp_path / "traces"
    queries = {f"s{i}": f"query {i}" for i in range(6)} | {"s-raise": "raise", "s-slow": "slow"}
    with _open(agent, store) as opened:
        answers = asyncio.run(_ask(opened, queries))
    assert _workers() <= before, "the worker was left running"
    for session, query in queries.items():
        if query == "raise":
            assert isinstance(answers[session], AgentProcessError)
            assert "ValueError: the agent failed on purpose" in str(answers[session])
        else:
            assert answers[session] == f"{query.upper()} via collect-1 at http://127.0.0.1:9/v1 t=0.8"
    traces = {t.session_id: t for t in TraceStore(store).iter_traces()}
    assert set(traces) == set(queries)  # one trace a run, keyed by the loop's session id, the failed run too
    assert all(t.metadata["improve_round"] == 1 for t in traces.values())
    assert traces["s0"].final_response == answers["s0"]
    assert opened.stats["written"] == len(queries) and opened.stats["errors"] == 0
    assert opened.agent_type == "Driven"
    log = (tmp_path / "traces.agent.log").read_text()
    assert "the agent prints this" in log  # its prints went to the log, not into the replies


def test_a_factory_that_fails_stops_the_stage_with_one_line(tmp_path: Path) -> None:
    agent = AgentProcess(f"{HELPERS}:broken_factory", sys.executable)
    with pytest.raises(AgentProcessError) as caught, _open(agent, tmp_path / "traces"):
        pass
    message = str(caught.value)
    assert "\n" not in message and "RuntimeError: cannot build the agent: no config" in message
    assert str(tmp_path / "traces.agent.log") in message


def test_a_python_without_flowrl_is_named_with_the_fix(tmp_path: Path) -> None:
    bare = Path(sys.base_prefix) / "bin" / "python3"
    check = subprocess.run([bare, "-c", "import flowrl"], capture_output=True, cwd=tmp_path, env={})
    if not bare.exists() or check.returncode == 0:
        pytest.skip("no interpreter without flowrl here")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    agent = AgentProcess(f"{HELPERS}:make_agent", bare, env=env, cwd=tmp_path)
    with pytest.raises(AgentProcessError, match="flowrl is not installed there: .* -m pip install flowrl"):
        with _open(agent, tmp_path / "traces"):
            pass


def test_a_worker_that_dies_fails_what_is_in_flight_and_the_stage(tmp_path: Path) -> None:
    before = _workers()
    agent = AgentProcess(f"{HELPERS}:make_agent", sys.executable, stop_timeout=10)
    with pytest.raises(AgentProcessError, match="did not finish its traces"):
        with _open(agent, tmp_path / "traces") as opened:
            answers = asyncio.run(_ask(opened, {"a": "slow", "b": "die"}))
            assert all(isinstance(a, AgentProcessError) for a in answers.values())
            assert "exited with code 3" in str(answers["b"])
    assert _workers() <= before


def test_not_an_executable_is_a_config_error(tmp_path: Path) -> None:
    from flowrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--agent-python .*not an executable"):
        AgentProcess(f"{HELPERS}:make_agent", tmp_path / "nope")


def test_the_cli_takes_the_agents_python(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flowrl.cli import app
    from flowrl.errors import ConfigError

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"task_id": "t{i}", "query": "q{i}", "answer": "a"}}\n' for i in range(3)))
    args = ["improve", "--agent", f"{HELPERS}:make_agent", "--tasks", str(tasks), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--agent-python", str(tmp_path / "nope")])
    assert isinstance(result.exception, ConfigError) and "--agent-python" in str(result.exception)
    assert "not an executable" in str(result.exception)
    result = CliRunner().invoke(app, ["improve", "--agent-python", sys.executable])
    assert isinstance(result.exception, ConfigError) and "go with --agent MODULE:FACTORY" in str(result.exception)


def test_hook_options_that_cannot_cross_to_the_agents_python_are_refused(tmp_path: Path) -> None:
    from flowrl.errors import ConfigError

    agent = AgentProcess(f"{HELPERS}:make_agent", sys.executable)
    options = {"on_trace": print}  # a callable: it would arrive as its repr, silently doing nothing
    with pytest.raises(ConfigError, match="as JSON"):
        with agent.open(POLICY, store=tmp_path / "t", metadata={}, hook_options=options, concurrency=1):
            pass
    assert agent.started == 0
