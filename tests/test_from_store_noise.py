"""Noisy host feedback in `flowrl improve --from-store`: a host's "right" that the run itself contradicts is left out
and counted (`--check-outcomes engine`, the default), and the learned reward (grounding among its features,
balanced classes) proposes the rare right runs among the unlabelled ones instead of only the common wrong ones.

Reproduces the production benchmark's failure (docs/results/production-2026-12-06): 20 of the 43 runs the host
said were right were wrong answers, all trained on; and the learned reward proposed 0 right of 1,050."""

from __future__ import annotations

from pathlib import Path

from flowrl.improve.config import ImproveConfig
from flowrl.improve.from_store import select_from_store
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace


def _run(i: int, right: bool) -> ExecutionTrace:
    """An agent run that computed i * 7 with its tool; a right one answers with what the tool returned, a wrong one
    with a number of its own."""
    result = f"{{'success': True, 'output': '{7 * i}', 'error': None}}"
    answer = f"The answer is {7 * i}." if right else f"The answer is {7 * i + 1 + i % 5}."
    call = ToolCallTrace(tool_name="exec_code", arguments={"code": f"print({i} * 7)"}, result=result)
    return ExecutionTrace(trace_id=f"run-{i:03d}", user_query=f"What is {i} times 7?", tool_calls=[call],
                          final_response=answer)  # fmt: skip


def _store(root: Path) -> tuple[TraceStore, set[str], set[str]]:
    """120 runs, one in ten right. The host told how the first 60 went, wrongly for 6 wrong ones (said right);
    returns the store, the flipped ids, and the unlabelled right ids."""
    store = TraceStore(root)
    flipped, unlabelled_right = set(), set()
    for i in range(120):
        right = i % 10 == 0
        store.write(_run(i, right))
        if i < 60:
            said = right or i % 10 == 5  # 6 wrong runs the host said were right
            store.record_outcome(f"run-{i:03d}", success=said)
            if said and not right:
                flipped.add(f"run-{i:03d}")
        elif right:
            unlabelled_right.add(f"run-{i:03d}")
    return store, flipped, unlabelled_right


def test_a_host_right_that_the_run_contradicts_is_left_out_and_counted(tmp_path: Path) -> None:
    store, flipped, _ = _store(tmp_path / "prod")
    checked = select_from_store(str(store.root), [], "sft", unlabelled="skip")
    taken = select_from_store(str(store.root), [], "sft", unlabelled="skip", check_outcomes="off")
    assert {t.trace_id for t in taken.chosen} >= flipped and taken.right == 12  # before: every flipped run trained on
    assert not {t.trace_id for t in checked.chosen} & flipped and checked.right == 6
    assert checked.contradicted == {"unfounded_answer": 6}
    line = checked.describe("prod", "sft")
    assert "6 the host said were right, contradicted by the run (6 an answer with a number from neither" in line
    assert "60 without a verdict" in line  # the unlabelled ones, not the contradicted ones


def test_the_learned_reward_proposes_the_rare_right_runs(tmp_path: Path) -> None:
    store, _, unlabelled_right = _store(tmp_path / "prod")
    got = select_from_store(str(store.root), [], "sft", unlabelled="learned", confidence=0.9)
    info = got.learned
    assert info is not None and info["proposed_right"] > 0  # an unweighted fit proposed none (0 right of 1,050)
    proposed_right = {t.trace_id for t in got.chosen if t.trace_id >= "run-060"}
    assert proposed_right and proposed_right <= unlabelled_right  # only runs that were right


def test_check_outcomes_is_an_improve_option(tmp_path: Path) -> None:
    assert ImproveConfig(out=tmp_path, from_store=str(tmp_path)).check_outcomes == "engine"
    assert ImproveConfig(out=tmp_path, from_store=str(tmp_path), check_outcomes="off").check_outcomes == "off"
