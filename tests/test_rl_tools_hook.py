"""flowrl.rl_tools through its drop-in hooks/flowrl_rl_tools.py: the agent-callable training tools, on a fake agent."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

HOOK = Path(__file__).resolve().parents[1] / "hooks" / "flowrl_rl_tools.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("flowrl_rl_tools", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeAgent:
    """What the tools need of a FlowAgent: add_tool and amd's model names."""

    def __init__(self, async_add_tool: bool = False) -> None:
        self.tools: dict[str, tuple] = {}
        self.amd = SimpleNamespace(fast_llm_model="openrouter/a", complex_llm_model="openrouter/b")
        self.async_add_tool = async_add_tool

    def add_tool(self, func, name=None, description=None, **kwargs):
        if self.async_add_tool:

            async def register():
                self.tools[name] = (func, description)

            return register()
        self.tools[name] = (func, description)


def _run(coro):
    return asyncio.run(coro)


def _fake_train(script: str):
    """A stand-in for `flowrl train`: prints its arguments, then runs `script`."""
    return lambda: [sys.executable, "-c", f"import sys; print('args', sys.argv[1:], flush=True); {script}", "--"]


def test_registers_the_five_tools(hook, tmp_path: Path) -> None:
    agent = FakeAgent()
    hook.register_rl_tools(agent, tmp_path)
    assert set(agent.tools) == {
        "start_rl_training",
        "check_training_status",
        "stop_rl_training",
        "switch_rl_model",
        "list_rl_models",
    }
    assert all(desc for _, desc in agent.tools.values())


def test_async_add_tool_is_awaited(hook, tmp_path: Path) -> None:
    agent = FakeAgent(async_add_tool=True)
    hook.register_rl_tools(agent, tmp_path)
    assert len(agent.tools) == 5


def test_start_status_stop(hook, tmp_path: Path) -> None:
    tools = hook.RLTools(FakeAgent(), tmp_path, command=_fake_train("import time; time.sleep(60)"))
    text = _run(tools.start_rl_training("v1", method="kto", dataset="data/kto"))
    assert text.startswith("✓ Training started: v1 (kto)")
    assert "already training" in _run(tools.start_rl_training("v1"))
    deadline = time.time() + 10
    while "args" not in (tmp_path / "v1" / "train.log").read_text() and time.time() < deadline:
        time.sleep(0.05)
    status = _run(tools.check_training_status())
    assert status.startswith("v1: running (kto")
    assert "'train', '--method', 'kto', '--output-dir'" in status and "'--dataset', 'data/kto'" in status
    assert _run(tools.stop_rl_training("v1")).startswith("✓ stopped v1")
    record = json.loads((tmp_path / "v1" / "flowrl_run.json").read_text())
    assert record["state"] == "stopped"
    assert "stopped" in _run(tools.list_rl_models())
    assert "no training started by this process is running" in _run(tools.stop_rl_training("v1"))


def test_finished_run_is_reported_with_its_exit_code(hook, tmp_path: Path) -> None:
    tools = hook.RLTools(FakeAgent(), tmp_path, command=_fake_train("sys.exit(3)"))
    _run(tools.start_rl_training("bad"))
    tools._procs["bad"].wait(timeout=10)
    assert _run(tools.check_training_status("bad")).startswith("bad: failed (sft")
    assert "exit code 3" in _run(tools.check_training_status("bad"))


def test_status_and_list_without_runs(hook, tmp_path: Path) -> None:
    tools = hook.RLTools(FakeAgent(), tmp_path / "none")
    assert "No training runs found" in _run(tools.check_training_status())
    assert "No trained models found" in _run(tools.list_rl_models())
    assert "plain name" in _run(tools.start_rl_training("../escape"))


def test_switch_to_an_exported_model_and_back(hook, tmp_path: Path) -> None:
    agent = FakeAgent()
    tools = hook.RLTools(agent, tmp_path)
    run = tmp_path / "v2"
    run.mkdir()
    (run / "flowrl_run.json").write_text(
        json.dumps({"model_name": "v2", "method": "sft", "state": "completed", "ollama_model": "flowrl-v2"})
    )
    assert "ollama/flowrl-v2" in _run(tools.switch_rl_model("v2"))
    assert agent.amd.fast_llm_model == agent.amd.complex_llm_model == "ollama/flowrl-v2"
    assert _run(tools.list_rl_models()) == "✓ v2: completed, sft, ollama/flowrl-v2"
    assert _run(tools.switch_rl_model("original")).startswith("✓ switched back")
    assert agent.amd.fast_llm_model == "openrouter/a" and agent.amd.complex_llm_model == "openrouter/b"
    assert "no run named nope" in _run(tools.switch_rl_model("nope"))


def test_switch_without_ollama_keeps_the_agent_and_says_what_to_run(hook, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("peft")
    from helpers_export import save_tiny_adapter, save_tiny_model

    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    base = save_tiny_model(tmp_path / "base")
    save_tiny_adapter(base, tmp_path / "runs" / "v3" / "train")
    (tmp_path / "runs" / "v3" / "flowrl_run.json").write_text(
        json.dumps(
            {
                "model_name": "v3",
                "method": "sft",
                "state": "completed",
                "output_dir": str(tmp_path / "runs" / "v3" / "train"),
            }
        )
    )
    agent = FakeAgent()
    text = _run(hook.RLTools(agent, tmp_path / "runs").switch_rl_model("v3"))
    assert "Ollama is not installed" in text and "ollama create flowrl-v3 -f" in text
    assert agent.amd.fast_llm_model == "openrouter/a"
    assert (tmp_path / "runs" / "v3" / "export" / "v3-q8_0.gguf").is_file()


def test_switch_reports_an_export_failure_instead_of_raising(hook, tmp_path: Path) -> None:
    run = tmp_path / "v4"
    run.mkdir()
    (run / "flowrl_run.json").write_text(
        json.dumps({"model_name": "v4", "state": "completed", "output_dir": str(tmp_path / "missing")})
    )
    text = _run(hook.RLTools(FakeAgent(), tmp_path).switch_rl_model("v4"))
    assert text.startswith("✗ export of v4 failed")
