"""A real toolboxv2 0.1.28 FlowAgent through one `flowrl improve` round on SmolLM2-135M, served by llama-server.

The loop (and its training stack) runs here, in flowrl's venv; the FlowAgent is built, hooked and run in the
toolboxv2 venv (`--agent-python`, tests/integration/toolbox_env.py), on the round's served policy through its own
LiteLLM model string (`openai/<policy>`, `use_served`): no model is loaded in the agent's code. It collects,
selects, trains, serves the adapter beside the base and evaluates; or, when no run is graded right, stops with the
one-line message. Either way the stored traces hold the token ids the endpoint returned for the FlowAgent's own LLM
calls, and no worker or server is left running.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flowrl.engines import llama_server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not llama_server.available(), reason=f"no llama-server binary: {llama_server.BUILD_HINT}"),
]
pytest.importorskip("trl")

HERE = Path(__file__).resolve().parent
FACTORY = HERE / "flowagent_policy_agent.py"
CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "England": "London",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "Greece": "Athens",
}


def _running(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_a_real_flowagent_goes_through_a_round(toolbox_python: Path, toolbox_env: Any, tmp_path: Path) -> None:
    from flowrl.improve.loop import ImproveConfig, ImproveError, improve
    from flowrl.improve.process import AgentProcess
    from flowrl.improve.user import default_grade, load_tasks, split_tasks
    from flowrl.models import resolve_model
    from flowrl.store.files import TraceStore

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"task_id": f"capital-{c.lower()}", "query": f"What is the capital of {c}?", "answer": a}) + "\n"
            for c, a in CAPITALS.items()
        )
    )
    # LiteLLM would fetch its model cost map from GitHub at import (three tries, then its own copy)
    env = toolbox_env.sandbox_env(
        tmp_path / "sandbox", toolbox_python.parent.parent, {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    )
    agent = AgentProcess(f"{FACTORY}:make_agent", toolbox_python, env=env, cwd=tmp_path / "sandbox")
    train, held_out = split_tasks(load_tasks(tasks), 5, 4)
    cfg = ImproveConfig(
        out=tmp_path / "out",
        samples=2,
        max_steps=1,
        slots=4,
        concurrency=2,
        context=8192,
        reply_tokens=128,
        train_options={"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1},
    )
    before = _running("llama-server") | _running("flowrl.improve.worker")
    stages: list[str] = []
    stopped = None
    try:
        improve(agent, train, held_out, default_grade, cfg, on_stage=lambda s, m: stages.append(f"{s}: {m}"))
    except ImproveError as exc:
        stopped = str(exc)
    print("\n".join(stages))
    assert _running("llama-server") | _running("flowrl.improve.worker") <= before, "a server or worker left running"
    assert agent.started == (2 if stopped else 3), stages  # the base arm, collect; then the round's arm
    out = cfg.out
    collected = json.loads((out / "round-1" / "collect.json").read_text())
    assert collected["runs"] == 10 and len(collected["verdicts"]) == 10, stages

    # the FlowAgent's own LLM calls, with the ids the endpoint sampled (decoded: the reply the agent got)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path)
    traces = list(TraceStore(out / "traces").iter_traces())
    assert len(traces) == 10 and collected["written"] == 10
    assert {t.agent_name for t in traces} == {"flowrl_improve_it"}
    for trace in traces:
        assert trace.session_id in collected["verdicts"] and trace.metadata["reference_answer"]
        calls = [c for c in trace.llm_calls if c.token_ids]
        assert calls, f"{trace.trace_id}: no LLM call with token ids: {trace.llm_calls}"
        for call in calls:
            # logprobs None: llama-server gives none for a token that ends inside a UTF-8 character (counted)
            assert call.prompt_token_ids and (call.logprobs is None or len(call.logprobs) == len(call.token_ids))
            prompt = tokenizer.decode(call.prompt_token_ids)
            assert trace.user_query in prompt and "final_answer" in prompt  # FlowAgent's own prompt and tools
        main = calls[0]
        reply = tokenizer.decode(main.token_ids, skip_special_tokens=True).strip()
        assert reply and (reply in (trace.final_response or "") or reply in json.dumps(trace.messages)), reply

    calls = [c for t in traces for c in t.llm_calls if c.token_ids]
    assert sum(c.logprobs is not None for c in calls) >= len(calls) / 2
    if collected["right"] == 0:
        assert stopped is not None and "no run was graded right" in stopped and "\n" not in stopped
        return
    assert stopped is None, stopped
    selected = json.loads((out / "round-1" / "select.json").read_text())
    assert selected["n_selected"] == collected["right"]
    data = json.loads((out / "round-1" / "eval.json").read_text())
    assert set(data["arms"]) == {"base", "round-1"} and data["arms"]["base"]["n"] == 4
    assert (out / "round-1" / "adapter" / "adapter-lora-f32.gguf").is_file()  # served beside the base
    for arm in ("base", "round-1"):
        assert len(list(TraceStore(out / "eval-traces" / arm).iter_traces())) == 4
