"""`--unlabelled` of `flowrl improve --from-store`: what a run nobody labelled gets. `skip` leaves it out; `learned`
takes the learned reward's confident proposals, fitted on the labelled runs, with its agreement on held-out labels
reported; `rewards` (the default) the reward engine's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl.improve.config import ImproveConfig, ImproveError
from flowrl.improve.from_store import select_from_store
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace


def _answer(i: int, right: bool) -> str:
    if right:
        return f"I worked it out step by step and checked it twice: the answer is {3 * i}, as the tool also said."
    return "Error: tool failed"


def _store(root: Path, labelled: int = 40, unlabelled: int = 20) -> TraceStore:
    """`labelled` runs the host gave an outcome (right ones answer at length, wrong ones with an error), and
    `unlabelled` more of both kinds that nobody said anything about."""
    store = TraceStore(root)
    for i in range(labelled + unlabelled):
        right = i % 3 == 0
        calc = [ToolCallTrace(tool_name="calc", arguments={"code": f"{i} * 3"}, result=str(3 * i))] if right else []
        store.write(ExecutionTrace(trace_id=f"run-{i:03d}", user_query=f"What is {i} times 3?", tool_calls=calc,
                                   final_response=_answer(i, right)))  # fmt: skip
        if i < labelled:
            store.record_outcome(f"run-{i:03d}", success=right)
    return store


def test_skip_trains_only_on_what_somebody_said(tmp_path: Path) -> None:
    store = _store(tmp_path / "prod")
    got = select_from_store(str(store.root), [], "sft", unlabelled="skip")
    assert got.verdicts == {"host": 40} and got.unlabelled == 20
    assert {t.trace_id for t in got.chosen} == {f"run-{i:03d}" for i in range(0, 40, 3)}
    line = got.describe("prod", "sft")
    assert "40 with a verdict (40 from the host's outcome)" in line and "20 without a verdict" in line


def test_learned_proposes_confident_labels_and_reports_its_held_out_agreement(tmp_path: Path) -> None:
    store = _store(tmp_path / "prod")
    got = select_from_store(str(store.root), [], "kto", unlabelled="learned", confidence=0.9)
    info = got.learned
    assert info is not None and info["labels"] == 40 and info["held_out"] >= 1
    assert info["agreement"] == 1.0  # the two kinds of answer are told apart on labels it was not fitted on
    assert info["proposed_right"] + info["proposed_wrong"] == got.verdicts["learned"] > 0
    proposed = {t.trace_id: t.label for t in got.chosen if int(t.trace_id[4:]) >= 40}
    assert proposed and all(ok == (int(i[4:]) % 3 == 0) for i, ok in proposed.items())
    assert "the learned reward, fitted on 40 labelled runs (held-out agreement 100%" in got.describe("prod", "kto")


def test_learned_with_too_few_labels_says_so_and_proposes_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path / "prod", labelled=6, unlabelled=10)
    got = select_from_store(str(store.root), [], "sft", unlabelled="learned")
    assert got.verdicts == {"host": 6} and got.learned is not None and "need 20" in got.learned["reason"]
    assert "no proposal for the 10 unlabelled runs: 6 manual labels" in got.describe("prod", "sft")


def test_rewards_is_the_default_and_the_other_choices_need_a_store(tmp_path: Path) -> None:
    store = _store(tmp_path / "prod", labelled=3, unlabelled=3)
    got = select_from_store(str(store.root), [], "kto")
    assert got.verdicts["host"] == 3 and got.verdicts["engine"] == 3 and got.unlabelled == 3
    with pytest.raises(ImproveError, match="--unlabelled learned goes with --from-store"):
        ImproveConfig(out=tmp_path / "out", unlabelled="learned")
    with pytest.raises(ImproveError, match="--unlabelled maybe: use rewards, skip or learned"):
        ImproveConfig(out=tmp_path / "out", from_store="x", unlabelled="maybe")  # type: ignore[arg-type]
    with pytest.raises(ImproveError, match="--adapter .*: no adapter_config.json there"):
        ImproveConfig(out=tmp_path / "out", adapter=str(tmp_path))


def test_the_learned_reward_does_not_read_the_verdict_it_is_fitted_on(tmp_path: Path) -> None:
    """Every answer looks the same, so nothing but the host's outcome tells the runs apart: a model that saw the
    outcome (the task-completion reward scores it) would agree with every held-out label."""
    store = TraceStore(tmp_path / "prod")
    for i in range(60):
        store.write(ExecutionTrace(trace_id=f"run-{i:03d}", user_query="What is 2 times 3?",
                                   final_response="The answer is 6."))  # fmt: skip
        if i < 50:
            store.record_outcome(f"run-{i:03d}", success=i % 2 == 0)
    got = select_from_store(str(store.root), [], "kto", unlabelled="learned")
    assert got.learned is not None and got.learned["agreement"] < 0.8
    assert got.verdicts["learned"] == 0  # never sure of a run it cannot tell apart
