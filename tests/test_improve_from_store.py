"""`flowrl improve --from-store`: round 1 trains on what a deployment recorded, collects nothing, never writes
the user's store, and says how many runs had a verdict, from where, and why the rest were left out."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model  # noqa: E402
from test_improve import HELD, TRAIN, FakePolicies, ScriptedAgent, grade  # noqa: E402

from flowrl.evaluate.results import verify  # noqa: E402
from flowrl.improve.loop import ImproveConfig, ImproveError, improve  # noqa: E402
from flowrl.store.files import TraceStore  # noqa: E402
from flowrl.trace.schema import ExecutionTrace  # noqa: E402


def _production_store(root: Path) -> TraceStore:
    """Twelve user runs, no reference on any: the host said how four went (three right, one wrong), a reviewer
    labelled one, and one asked a held-out task's query."""
    store = TraceStore(root)
    for i in range(12):
        n = 3 * i if i % 2 == 0 else 3 * i + 1
        store.write(ExecutionTrace(trace_id=f"prod-{i:02d}", user_query=f"What is {i} times 3?",
                                   final_response=f"The answer is {n}."))  # fmt: skip
    store.write(ExecutionTrace(trace_id="prod-held", user_query=HELD[0].query, final_response="The answer is 300."))
    for i, ok in ((0, True), (2, True), (4, True), (1, False)):
        store.record_outcome(f"prod-{i:02d}", success=ok)
    store.label("prod-06", True)
    return store


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_round_one_trains_on_the_store_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny")
    store = _production_store(tmp_path / "prod")
    before = _files(store.root)
    cfg = ImproveConfig(out=tmp_path / "out", base_model=str(model), max_steps=1, from_store=str(store.root),
                        control="unfiltered", hook_options={"run_methods": ["a_run"]})  # fmt: skip
    stages: list[tuple[str, str]] = []
    policies = FakePolicies()
    (result,) = improve(lambda p: ScriptedAgent(p), [], HELD, grade, cfg, on_stage=lambda s, m: stages.append((s, m)),
                        policies=policies)  # fmt: skip

    assert result.collected == 0 and "collect-1" not in policies.served  # nothing collected
    assert _files(store.root) == before  # read, never written (scored in memory)
    summary = json.loads((tmp_path / "out" / "round-1" / "select.json").read_text())["from_store"]
    assert summary["read"] == 13 and summary["held_out_queries"] == 1
    assert summary["verdicts"]["host"] == 4 and summary["verdicts"]["manual"] == 1
    assert summary["selected"] == summary["right"] and summary["control"] == summary["selected"]
    (line,) = [m for s, m in stages if s == "select"]
    assert "13 runs in" in line and "from the host's outcome" in line and "1 asked a held-out task's query" in line
    data = json.loads(result.eval_path.read_text())
    assert verify(data) == [] and set(data["arms"]) == {"base", "round-1", "control-1"}


def test_from_store_refuses_later_rounds_and_a_store_with_nothing_right(tmp_path: Path) -> None:
    with pytest.raises(ImproveError, match="--from-store with --rounds 2: later rounds"):
        ImproveConfig(out=tmp_path / "out", rounds=2, from_store=str(tmp_path))
    store = TraceStore(tmp_path / "prod")
    store.write(ExecutionTrace(trace_id="prod-0", user_query="What is 1 times 3?", final_response="The answer is 4."))
    store.record_outcome("prod-0", success=False)
    cfg = ImproveConfig(out=tmp_path / "out", base_model=str(build_tiny_model(tmp_path / "tiny")), max_steps=1,
                        from_store=str(store.root), hook_options={"run_methods": ["a_run"]})  # fmt: skip
    with pytest.raises(ImproveError, match="no stored run in .* was judged right"):
        improve(lambda p: ScriptedAgent(p), [], HELD, grade, cfg, policies=FakePolicies())


def test_the_baseline_is_the_adapter_in_production_and_unlabelled_runs_can_be_skipped(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny")
    store = _production_store(tmp_path / "prod")
    production = _lora_of(model, tmp_path / "production-adapter")
    cfg = ImproveConfig(out=tmp_path / "out", base_model=str(model), max_steps=1, from_store=str(store.root),
                        unlabelled="skip", adapter=str(production),
                        hook_options={"run_methods": ["a_run"]})  # fmt: skip
    policies = FakePolicies()
    (result,) = improve(lambda p: ScriptedAgent(p), [], HELD, grade, cfg, policies=policies)
    assert policies.served["eval-base"].adapter == production  # compared with what the agent runs today
    summary = json.loads((tmp_path / "out" / "round-1" / "select.json").read_text())["from_store"]
    assert summary["verdicts"] == {"host": 4, "manual": 1} and summary["unlabelled"] == 7
    assert summary["selected"] == 4  # the three the host said were right, and the one labelled good
    # the production model improved: training went on from its adapter, not from a new one on the base model
    record = json.loads((result.adapter / "flowrl_train.json").read_text())
    assert record["result"]["info"]["init_adapter"]["path"] == str(production)


def _lora_of(model: Path, out: Path) -> Path:
    """A LoRA adapter of the tiny model, as a deployment would run it (rank 4: not the training default)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(model), lora).save_pretrained(out)
    return out


def test_with_references_the_production_adapter_collects_and_is_trained_on(tmp_path: Path) -> None:
    """`--adapter` without `--from-store`: round 1 collects with what runs today and trains that adapter further
    (before, it collected with the base model and trained a new adapter beside it)."""
    model = build_tiny_model(tmp_path / "tiny")
    production = _lora_of(model, tmp_path / "production-adapter")
    cfg = ImproveConfig(out=tmp_path / "out", base_model=str(model), max_steps=1, samples=1, adapter=str(production),
                        hook_options={"run_methods": ["a_run"]})  # fmt: skip
    policies = FakePolicies()
    (result,) = improve(lambda p: ScriptedAgent(p), TRAIN, HELD, grade, cfg, policies=policies)
    assert policies.served["collect-1"].adapter == production
    record = json.loads((result.adapter / "flowrl_train.json").read_text())
    assert record["result"]["info"]["init_adapter"]["path"] == str(production)
