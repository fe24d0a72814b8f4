"""A reward that crashes is an error, not "cannot judge": results, engine, judge, TRL and `flowrl score`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import flowrl.cli.score as score_cli
from flowrl.cli import main
from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.judge import LLMJudgeReward
from flowrl.rewards.judge_client import JudgeRequestError
from flowrl.rewards.scoring import ErrorBudgetExceeded, score_store
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace


class Fixed(Reward):
    def __init__(self, name: str, value: float | None) -> None:
        self.name, self.value = name, value

    def score(self, trace):
        return RewardResult(self.value)


class Crashing(Reward):
    """Raises on the traces (or completions) whose answer contains `marker`; 0.5 elsewhere."""

    name = "crashing"

    def __init__(self, marker: str = "") -> None:
        self.marker = marker

    def score(self, trace):
        if self.marker in trace.final_response:
            raise ValueError("kaputt")
        return RewardResult(0.5)


def test_a_crash_is_an_error_and_cannot_judge_is_not():
    crashed = Crashing().safe_score(ExecutionTrace(final_response="x"))
    assert crashed.value is None and crashed.error == "ValueError: kaputt"
    assert crashed.details["error"] == "ValueError: kaputt"  # what the store keeps in reward_details
    cannot = Fixed("f", None).safe_score(ExecutionTrace())
    assert cannot.value is None and cannot.error is None
    assert RewardResult(0.7, error="boom").value is None  # an error never carries a value


def test_combined_score_with_a_crashed_reward_is_not_a_reweighted_mean():
    engine = RewardEngine({"good": Fixed("good", 1.0), "crashing": Crashing()}, {"good": 1.0, "crashing": 1.0})
    results = engine.compute_all(ExecutionTrace(final_response="answer"))
    assert engine.errors(results) == {"crashing": "ValueError: kaputt"}
    assert engine.compute_combined(results) is None  # not 1.0, the mean over "good" alone
    assert engine.get_binary_label(results) is None  # no label from a score that lost a reward
    cannot = {"good": RewardResult(1.0), "crashing": RewardResult(None)}
    assert engine.compute_combined(cannot) == 1.0  # "cannot judge" still drops out of the mean
    traces = [ExecutionTrace(final_response="x"), ExecutionTrace(final_response="y")]
    assert engine.compute_for_group(traces) == [None, None]


def test_crash_of_a_weight_zero_reward_leaves_the_combined_score_alone():
    engine = RewardEngine({"good": Fixed("good", 1.0), "crashing": Crashing()}, {"good": 1.0, "crashing": 0.0})
    results = engine.compute_all(ExecutionTrace(final_response="answer"))
    assert engine.errors(results) == {"crashing": "ValueError: kaputt"}
    assert engine.compute_combined(results) == 1.0


def test_a_batch_that_raises_or_returns_garbage_is_an_error_per_trace():
    class BadBatch(Reward):
        name = "bad"

        def score_batch(self, traces):
            return [RewardResult(1.0)]  # one result for two traces

    engine = RewardEngine({"bad": BadBatch()}, {"bad": 1.0})
    results = engine.compute_batch([ExecutionTrace(), ExecutionTrace()])
    assert all("returned 1 results for 2 traces" in r["bad"].error for r in results)
    assert engine.rewards["bad"].crashes == 2


class _RaisingClient:
    model = "fake"
    stats = {"requests": 0}

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def complete_json(self, messages, parse):
        raise self.exc


class _PartialClient:
    """Answers a relative request with a score for trajectory 1 only."""

    model = "fake"
    stats = {"requests": 0}

    def complete_json(self, messages, parse):
        return parse({"scores": [{"trajectory_id": "1", "score": 0.8}]}), False


@pytest.mark.parametrize(
    "exc",
    [JudgeRequestError("cannot reach http://judge/v1: refused", True), RuntimeError("judge bug")],
    ids=["request", "bug"],
)
@pytest.mark.parametrize("mode", ["relative", "absolute"])
def test_judge_errors_surface_as_errors(exc, mode):
    judge = LLMJudgeReward(mode=mode, client=_RaisingClient(exc))
    results = judge.score_batch([ExecutionTrace(user_query="q", final_response=a) for a in ("a", "b")])
    assert [r.value for r in results] == [None, None]
    assert all(r.error and str(exc) in r.error for r in results)
    engine = RewardEngine({"judge": judge, "good": Fixed("good", 1.0)}, {"judge": 1.0, "good": 1.0})
    assert engine.compute_combined({"judge": results[0], "good": RewardResult(1.0)}) is None


def test_judge_without_a_model_is_an_error(monkeypatch):
    for name in ("FLOWRL_JUDGE_MODEL", "FLOWRL_JUDGE_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    result = LLMJudgeReward(base_url="http://127.0.0.1:9/v1").score(ExecutionTrace(final_response="a"))
    assert result.value is None and "FLOWRL_JUDGE_MODEL" in result.error


def test_judge_reply_missing_a_trajectory_is_an_error_for_that_one():
    judge = LLMJudgeReward(client=_PartialClient())
    first, second = judge.score_batch([ExecutionTrace(user_query="q", final_response=a) for a in ("a", "b")])
    assert first.value == 0.8 and first.error is None
    assert second.value is None and second.error == "the judge gave no score for it"


# -- TRL ----------------------------------------------------------------------------------------------------


def test_trl_crash_gives_none_to_its_whole_prompt_group_and_is_counted(caplog):
    func = Crashing(marker="boom").as_reward_func()
    metrics: list[tuple[str, float]] = []
    prompts = ["p1", "p1", "p2", "p2"]
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        out = func(
            prompts=prompts, completions=["ok", "boom", "ok", "ok"], log_metric=lambda n, v: metrics.append((n, v))
        )
        again = func(
            prompts=prompts, completions=["ok", "boom", "ok", "ok"], log_metric=lambda n, v: metrics.append((n, v))
        )
    assert out == again == [None, None, 0.5, 0.5]  # p1's group drops the reward alike; p2's keeps it
    assert func.stats == {"calls": 2, "completions": 8, "errors": 2, "voided": 4}
    assert metrics == [("flowrl/crashing/errors", 1.0), ("flowrl/crashing/errors", 1.0)]
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "kaputt" in tracebacks[0].getMessage()  # logged once with its traceback
    clean = func(prompts=["p"], completions=["ok"])
    assert clean == [0.5] and func.stats["errors"] == 2


def test_trl_batch_that_raises_is_none_for_every_completion_not_an_exception():
    class Down(Reward):
        name = "down"

        def score_batch(self, traces):
            raise ConnectionError("service down")

    func = Down().as_reward_func()
    assert func(prompts=["p", "q"], completions=["a", "b"]) == [None, None]
    assert func.stats["errors"] == 2


# -- flowrl score -------------------------------------------------------------------------------------------


def _store(root: Path, n: int) -> TraceStore:
    store = TraceStore(root)
    for i in range(n):
        store.write(
            ExecutionTrace(
                trace_id=f"t{i}",
                timestamp="2026-11-22T10:00:00",
                user_query=f"task {i}",
                final_response=f"answer {i}",
                success=True,
            )
        )
    return store


def _with_crashing(monkeypatch, marker: str) -> None:
    """`flowrl score` builds its engine with RewardEngine.from_config; add the crashing reward to it."""

    class Engine(RewardEngine):
        @classmethod
        def from_config(cls, path=None):
            return RewardEngine(
                {"good": Fixed("good", 1.0), "crashing": Crashing(marker)}, {"good": 1.0, "crashing": 1.0}
            )

    monkeypatch.setattr(score_cli, "RewardEngine", Engine)


def _files(store: TraceStore) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(store.root.rglob("*.json"))}


def test_score_with_a_crashing_reward_reports_errors_writes_nothing_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    store = _store(tmp_path / "store", 4)
    score_store(store, RewardEngine({"good": Fixed("good", 1.0)}, {"good": 1.0}))  # labels already stored
    store.label("t1", False, "reviewed")
    before = _files(store)
    _with_crashing(monkeypatch, marker="answer")
    rc = main(["score", "--store", str(store.root), "--all"])
    captured = capsys.readouterr()
    assert rc != 0
    assert "errors" in captured.out and "cannot judge" in captured.out
    assert "crashing crashed on 4 of 4 traces, first: ValueError: kaputt" in captured.err
    assert "nothing written" in captured.out
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("flowrl: error: reward 'crashing' crashed on 4 of 4 traces")
    assert "nothing was written" in last and "--max-error-rate" in last and "enabled = false" in last
    assert _files(store) == before  # nothing lost, nothing half-written
    assert store.get("t0").label is True and store.get("t0").rewards == {"good": 1.0}


def test_score_within_the_budget_writes_and_reports_the_error_count(tmp_path, monkeypatch, capsys):
    store = _store(tmp_path / "store", 50)  # 100 (trace, reward) results: one error is the 1% budget
    _with_crashing(monkeypatch, marker="answer 7")
    assert main(["score", "--store", str(store.root)]) == 0
    captured = capsys.readouterr()
    assert "scored 50 of 50 traces" in captured.out
    assert (
        "errors: 1 of 100 results (1.0%, budget 1%)" in captured.out
        and "1 traces written without a combined score" in captured.out
    )
    assert "crashing crashed on 1 of 50 traces, first: ValueError: kaputt" in captured.err
    crashed = store.get("t7")
    assert crashed.rewards == {"good": 1.0, "crashing": None}
    assert crashed.reward_details["crashing"]["error"] == "ValueError: kaputt"
    assert crashed.reward_score is None and crashed.label is None
    fine = store.get("t8")
    assert fine.reward_score == pytest.approx(0.75) and fine.label is True
    assert main(["score", "--store", str(store.root)]) == 0  # a stored error is a result: nothing to redo
    assert "scored 0 of 50 traces" in capsys.readouterr().out


def test_max_error_rate_option_and_library_budget(tmp_path, monkeypatch, capsys):
    store = _store(tmp_path / "store", 4)
    _with_crashing(monkeypatch, marker="answer 0")  # 1 error in 8 results: 12.5%
    assert main(["score", "--store", str(store.root), "--max-error-rate", "0.2"]) == 0
    assert "errors: 1 of 8 results" in capsys.readouterr().out
    engine = RewardEngine({"crashing": Crashing("answer 0")}, {"crashing": 1.0})
    with pytest.raises(ErrorBudgetExceeded) as info:
        score_store(store, engine, rescore_all=True, max_error_rate=0.0)
    assert info.value.summary.error_results == 1 and info.value.summary.scored == 0
