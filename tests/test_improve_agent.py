"""`flowrl improve --agent MODULE:FACTORY --tasks FILE`: a user's own OpenAI-SDK agent goes through a whole round
on the default model, served by llama-server, without loading a model in its own code. Its runs are captured
through the OpenAI SDK patch with the token ids the endpoint returned; selection follows the user's grade; the
round's adapter is served beside the base; nothing is left running afterwards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowrl.engines import llama_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not llama_server.available(), reason=f"no llama-server binary: {llama_server.BUILD_HINT}"),
]
pytest.importorskip("trl")
pytest.importorskip("openai")

HERE = Path(__file__).parent


def _servers() -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "llama-server"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_a_users_openai_agent_goes_through_a_round(tmp_path: Path) -> None:
    from flowrl.cli import app
    from flowrl.store.files import TraceStore

    tasks = tmp_path / "tasks.jsonl"
    pairs = [(a, b) for a in range(1, 5) for b in range(1, 4)]
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"add-{a}-{b}", "query": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
            for a, b in pairs
        )
    )
    before = _servers()
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "improve",
            "--agent", f"{HERE / 'helpers_openai_agent.py'}:make_agent",
            "--tasks", str(tasks),
            "--grade", f"{HERE / 'helpers_openai_agent.py'}:last_number_grade",
            "--train-tasks", "6", "--eval-tasks", "4", "--samples", "2",
            "--max-steps", "1", "--slots", "4", "--concurrency", "4",
            "--out", str(out),
        ],
    )  # fmt: skip
    assert _servers() <= before, "llama-server left running"
    collected = json.loads((out / "round-1" / "collect.json").read_text())
    assert collected["runs"] == 12 and len(collected["verdicts"]) == 12
    traces = list(TraceStore(out / "traces").iter_traces())
    assert len(traces) == 12
    for trace in traces:  # the agent's own LLM calls, with what the endpoint returned
        (call,) = trace.llm_calls
        assert call.prompt_token_ids and call.token_ids and call.logprobs and len(call.logprobs) == len(call.token_ids)
        assert trace.metadata["reference_answer"]
    if collected["right"] == 0:
        assert result.exit_code != 0 and "no run was graded right" in result.output
        return
    assert result.exit_code == 0, result.output
    selected = json.loads((out / "round-1" / "select.json").read_text())
    assert selected["n_selected"] == collected["right"]  # exactly the grade's verdicts
    data = json.loads((out / "round-1" / "eval.json").read_text())
    assert set(data["arms"]) == {"base", "round-1"} and data["arms"]["base"]["n"] == 4
    assert (out / "round-1" / "adapter" / "adapter-lora-f32.gguf").is_file()  # served beside the base, not merged
    assert "held-out success" in result.output
