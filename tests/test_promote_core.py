"""The promotion rule, the power check, the leak check and the append-only history (issue 38), on eval JSONs made
from outcomes the test decides."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowrl.errors import ConfigError, FlowRLError
from flowrl.evaluate.results import summarize
from flowrl.evaluate.stats import mcnemar_sample_size
from flowrl.promote import Entry, History, decide, leaked_tasks, power_problem
from flowrl.promote.history import fingerprint


def _eval(n: int, current_right: int, both: int, only_candidate: int, only_current: int = 0) -> dict:
    """n tasks: `both` right in both arms, `only_candidate` / `only_current` right in one arm only."""
    assert both <= current_right
    outcomes = {}
    for i in range(n):
        cur = i < current_right
        cand = i < both or (current_right <= i < current_right + only_candidate)
        if both <= i < both + only_current:
            cur, cand = True, False
        outcomes[f"t{i}"] = {"current": cur, "candidate": cand}
    return summarize(outcomes, base="current")


def test_a_significantly_better_candidate_is_promoted() -> None:
    d = decide(_eval(150, 10, 10, 30), candidate="candidate", current="current")
    assert d.promote and d.p < 0.001 and d.diff_ci95[0] > 0 and d.reason.startswith("promoted")


def test_an_insignificant_candidate_is_refused_in_one_line_with_n_p_and_interval() -> None:
    d = decide(_eval(150, 10, 10, 4, 1), candidate="candidate", current="current")
    assert not d.promote and "not significant" in d.reason
    assert "n = 150" in d.reason and "McNemar p = " in d.reason and "[" in d.reason and "\n" not in d.reason


def test_the_rule_reads_figures_recomputed_from_the_outcomes_not_stored_ones() -> None:
    data = _eval(150, 10, 10, 30)
    data["comparisons"][0]["diff_ci95"] = [-0.1, 0.3]  # a tampered interval does not block a real gain
    assert decide(data, candidate="candidate", current="current").promote
    data = _eval(150, 10, 10, 6)  # 6 tasks right only in the candidate: p = 0.031
    assert decide(data, candidate="candidate", current="current").promote
    assert not decide(data, candidate="candidate", current="current", alpha=0.01).promote


def test_a_missing_arm_and_a_bad_alpha_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="no arm 'x'"):
        decide(_eval(20, 2, 2, 2), candidate="x", current="current")
    with pytest.raises(ConfigError, match="--alpha 1.5"):
        decide(_eval(20, 2, 2, 2), candidate="candidate", current="current", alpha=1.5)


def test_a_held_out_set_too_small_for_a_ten_point_rise_names_the_n_needed() -> None:
    needed = mcnemar_sample_size(0.05)
    assert 100 < needed < 200  # 150 tasks tell a 10-point rise from 5% apart, as the improve benchmark uses
    problem = power_problem(0.05, 60)
    assert problem is not None and f"needs {needed}" in problem and "\n" not in problem
    assert power_problem(0.05, needed) is None


@dataclass(frozen=True)
class _Task:
    task_id: str
    query: str


def test_a_candidate_trained_on_a_held_out_task_is_found(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "What is 12 * 7?"}, {"role": "assistant", "content": "84"}]},
        {"prompt": [{"role": "user", "content": "x"}], "task_id": "cap-peru"},
    ]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    held = [_Task("mul-12-7", "what is 12 * 7 ?"), _Task("cap-peru", "Capital of Peru?"), _Task("new", "Fresh?")]
    assert leaked_tasks(held, tmp_path) == ["mul-12-7", "cap-peru"]
    with pytest.raises(ConfigError, match="no training rows"):
        leaked_tasks(held, tmp_path / "empty")


def test_history_promotes_refuses_rolls_back_and_counts_uses_of_a_held_out_set(tmp_path: Path) -> None:
    history = History(tmp_path / "promotions.jsonl")
    held = fingerprint(["t1", "t2"])
    assert history.current() is None and held == fingerprint(["t2", "t1"])
    history.append(Entry("promote", candidate="round-1", replaced=None, held_out=held))
    history.append(Entry("refuse", candidate="round-2", replaced="round-1", held_out=held))
    history.append(Entry("promote", candidate="round-3", replaced="round-1", held_out=held))
    assert history.current() == "round-3" and history.uses(held) == 3
    assert history.rollback() == ("round-3", "round-1") and history.current() == "round-1"
    assert history.rollback() == ("round-1", None) and history.current() is None
    with pytest.raises(FlowRLError, match="nothing to roll back"):
        history.rollback()
    lines = (tmp_path / "promotions.jsonl").read_text().splitlines()
    assert [json.loads(x)["action"] for x in lines] == ["promote", "refuse", "promote", "rollback", "rollback"]


def test_a_damaged_or_planted_history_is_refused_and_never_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "promotions.jsonl"
    path.write_text('{"action": "promote", "candidate": "a", "replaced": null}\nnot json\n')
    with pytest.raises(FlowRLError, match=r"promotions.jsonl:2 is not a promotion record"):
        History(path).append(Entry("refuse", candidate="b", replaced="a"))
    assert path.read_text().count("\n") == 2
    outside = tmp_path / "outside.jsonl"
    link = tmp_path / "linked" / "promotions.jsonl"
    link.parent.mkdir()
    os.symlink(outside, link)
    with pytest.raises(FlowRLError, match="symbolic link"):
        History(link).append(Entry("promote", candidate="a", replaced=None))
    assert not outside.exists()
