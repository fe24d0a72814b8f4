"""LearnedReward: learns from manual labels, reports held-out accuracy, saves and loads, None until ready."""

from __future__ import annotations

import json
import random

import pytest

from flowrl.errors import ConfigError
from flowrl.rewards.learned import FEATURES, LearnedReward
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

pytest.importorskip("numpy")


def make_trace(i: int, good: bool, label_source: str | None = "manual") -> ExecutionTrace:
    rng = random.Random(i)
    calls = [
        ToolCallTrace(tool_name="search", arguments={"q": f"{i}-{k}"}, result="found it")
        for k in range(rng.randint(1, 3))
    ]
    if not good:
        calls.append(
            ToolCallTrace(
                tool_name="fetch", arguments={"id": i}, result="Error executing fetch: timeout", success=False
            )
        )
    return ExecutionTrace(
        trace_id=f"t{i:04d}",
        user_query=f"question {i}",
        tool_calls=calls,
        final_response=("Here is the answer " * rng.randint(1, 5)) if good else "Error: could not finish",
        success=good if rng.random() > 0.2 else None,
        label=good,
        label_source=label_source,
        manual_review=label_source == "manual",
    )


def labelled(n: int) -> list[ExecutionTrace]:
    return [make_trace(i, good=i % 2 == 0) for i in range(n)]


def test_none_until_enough_labels():
    reward = LearnedReward(min_labels=20)
    report = reward.fit(labelled(8))
    assert not report.trained and "need 20" in report.reason
    r = reward.score(make_trace(99, True))
    assert r.value is None and "need 20" in r.details["reason"]


def test_needs_both_classes():
    reward = LearnedReward(min_labels=5)
    report = reward.fit([make_trace(i, True) for i in range(10)])
    assert not report.trained
    assert reward.score(make_trace(1, True)).value is None


def test_engine_labels_are_not_training_data():
    reward = LearnedReward(min_labels=5)
    report = reward.fit([make_trace(i, i % 2 == 0, label_source="engine") for i in range(30)])
    assert report.n_labels == 0 and not report.trained


def test_learns_and_reports_heldout_accuracy():
    reward = LearnedReward(min_labels=20)
    report = reward.fit(labelled(60))
    assert report.trained and report.n_labels == 60 and report.n_good == 30
    assert report.heldout_n > 0
    assert report.heldout_accuracy is not None and report.heldout_accuracy >= 0.8
    good, bad = reward.score(make_trace(1001, True)), reward.score(make_trace(1002, False))
    assert good.value > 0.5 > bad.value
    assert good.details["n_labels"] == 60


def test_uses_other_rewards_values_as_features():
    reward = LearnedReward()
    t = make_trace(5, True)
    t.rewards = {"code_execution": 0.25}
    feats = dict(zip(FEATURES, reward.features(t)))
    assert feats["r_code_execution"] == 0.25 and feats["missing_code_execution"] == 0.0
    assert feats["r_tool_success"] == 1.0  # computed here when the trace has no value yet
    t.rewards = {}
    feats = dict(zip(FEATURES, reward.features(t)))
    assert feats["r_code_execution"] == 0.5 and feats["missing_code_execution"] == 1.0


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "learned.json"
    reward = LearnedReward(model=path, min_labels=20)
    reward.fit(labelled(40))
    assert path.is_file()
    state = json.loads(path.read_text())
    assert state["format"] == "flowrl-learned-reward" and state["features"] == list(FEATURES)
    again = LearnedReward(model=path)
    assert again.trained
    t = make_trace(777, False)
    assert again.score(t).value == pytest.approx(reward.score(t).value)


def test_load_rejects_foreign_file(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"weights": [1]}')
    with pytest.raises(ConfigError, match="not a flowrl learned-reward model"):
        LearnedReward(model=path)


def test_prepare_keeps_a_loaded_model_when_retrain_is_off(tmp_path):
    path = tmp_path / "m.json"
    LearnedReward(model=path, min_labels=20).fit(labelled(40))
    reward = LearnedReward(model=path, retrain=False)
    assert reward.prepare([]) is None and reward.trained


@pytest.mark.parametrize(
    ("answer", "flagged"),
    [
        ("Error: could not finish", 1.0),
        ("<think>the tool failed</think>System-Error: timeout", 1.0),  # was 0: a reasoning block hid it
        ("Errors in the table were fixed: the total is 42", 0.0),  # was 1: not an error report
    ],
)
def test_error_answer_feature_is_the_trace_rule(answer, flagged):
    trace = make_trace(7, True)
    trace.final_response = answer
    assert dict(zip(FEATURES, LearnedReward().features(trace)))["error_answer"] == flagged


def test_balanced_classes_let_a_rare_good_kind_reach_confidence():
    """Right runs are rare in production: 6 good among 99 labels, their answers long, as are 3 of the bad ones.
    Unweighted, a long answer is good 6 times in 9, never 0.9 sure; with balanced classes each class weighs the
    same, and the long answers cross 0.9 (what `improve --from-store --unlabelled learned` proposes from)."""

    def run(i: int, good: bool, long: bool) -> ExecutionTrace:
        text = ("a long and careful answer " * 6) if long else "no"
        return ExecutionTrace(trace_id=f"b{i:03d}", user_query="q", final_response=text, label=good,
                              label_source="manual", manual_review=True)  # fmt: skip

    traces = [run(i, True, True) for i in range(6)] + [run(10 + i, False, True) for i in range(3)]
    traces += [run(100 + i, False, False) for i in range(90)]
    probe = run(999, False, True)
    plain, balanced = LearnedReward(holdout=0.0), LearnedReward(holdout=0.0, balanced=True)
    assert plain.fit(traces).trained and balanced.fit(traces).trained
    assert plain.probability(probe) < 0.75 < 0.9 <= balanced.probability(probe)
