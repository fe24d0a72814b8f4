from __future__ import annotations

from flowrl.rewards import RewardEngine, RewardResult
from flowrl.rewards.reference import ReferenceAnswerReward, answer_matches
from flowrl.trace.schema import ExecutionTrace


def test_reference_answer_matches_whole_words_and_numbers() -> None:
    assert answer_matches("83", "45 + 38 = 83.")
    assert answer_matches("Paris", "The capital is paris")
    assert answer_matches("1000", "It is 1,000")
    assert not answer_matches("83", "45 + 38 = 830")
    assert not answer_matches("8", "8.5 is the result")
    assert not answer_matches("Rome", "Romeo")


def test_reference_reward_reads_metadata_and_grpo_columns() -> None:
    r = ReferenceAnswerReward()
    assert r.score(ExecutionTrace(final_response="42", metadata={"reference_answer": "42"})).value == 1.0
    assert r.score(ExecutionTrace(final_response="41", metadata={"reference_answer": "42"})).value == 0.0
    assert r.score(ExecutionTrace(final_response="42")).value is None
    func = r.as_reward_func()
    assert func(prompts=["What is 6*7?"] * 2, completions=["It is 42", "It is 24"], reference_answer=["42", "42"]) == [
        1.0,
        0.0,
    ]
    # a reference guessed from another run's answer is not a reference
    assert func(prompts=["q"], completions=["x"], reference_answer=["x"], reference_source=["best_trace"]) == [None]


def test_a_failed_task_is_never_labelled_good() -> None:
    engine = RewardEngine(rewards={}, weights={})
    high_but_failed = {
        "syntax": RewardResult(1.0),
        "format": RewardResult(1.0),
        "tool_success": RewardResult(1.0),
        "task_completion": RewardResult(0.0),
    }
    engine.weights = {"syntax": 1.0, "format": 1.0, "tool_success": 2.0, "task_completion": 1.5}
    assert engine.compute_combined(high_but_failed) > 0.6
    assert engine.get_binary_label(high_but_failed) is False
    assert engine.get_binary_label(engine.compute_combined(high_but_failed)) is True  # a bare score has no gates
    wrong = {"format": RewardResult(1.0), "reference_answer": RewardResult(0.0)}
    assert engine.get_binary_label(wrong) is False


def test_default_engine_has_reference_answer() -> None:
    with RewardEngine() as engine:
        assert "reference_answer" in engine.names
        results = engine.compute_all(
            ExecutionTrace(user_query="What is 45 + 38?", final_response="83", metadata={"reference_answer": "83"})
        )
        assert results["reference_answer"].value == 1.0
