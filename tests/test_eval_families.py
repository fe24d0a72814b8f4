"""eval.json with task families (issue 37): each family's rate per arm, the families never trained on apart, and a
round paired with its control, every figure recomputed by `verify`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from flowrl.errors import ConfigError
from flowrl.evaluate.results import format_table, read_eval_json, summarize, verify, write_eval_json
from flowrl.report import make_report
from flowrl.store.files import TraceStore

FAMILIES = ("mul", "mulsub", "summul")


def _data(round_: int = 1, seed: int = 0) -> dict:
    rng = random.Random(seed)
    outcomes, families = {}, {}
    for i in range(60):
        family = FAMILIES[i % 3]
        families[f"t{i}"] = family
        outcomes[f"t{i}"] = {
            "base": rng.random() < 0.1,
            f"round-{round_}": rng.random() < (0.7 if family == "mul" else 0.2),
            f"control-{round_}": rng.random() < 0.15,
        }
    return summarize(
        outcomes, pairs=[(f"control-{round_}", f"round-{round_}")], families=families, unseen={"mulsub", "summul"}
    )


def test_families_and_unseen_subsets_recompute_and_a_tampered_subset_is_caught(tmp_path: Path) -> None:
    data = _data()
    assert verify(data) == []
    write_eval_json(tmp_path / "eval.json", data)
    assert read_eval_json(tmp_path / "eval.json") == data
    assert set(data["families"]) == set(FAMILIES) and data["families"]["mulsub"]["unseen"]
    assert data["subsets"]["seen"]["arms"]["base"]["n"] == 20 and data["subsets"]["unseen"]["arms"]["base"]["n"] == 40
    pairs = [(c["a"], c["b"]) for c in data["subsets"]["unseen"]["comparisons"]]
    assert pairs == [("base", "round-1"), ("base", "control-1"), ("control-1", "round-1")]
    data["subsets"]["unseen"]["arms"]["round-1"]["successes"] += 1
    data["families"]["mul"]["unseen"] = True
    problems = verify(data)
    assert "subsets.unseen.arms.round-1.successes: stored" in " ".join(problems)
    assert any(p.startswith("subsets: stored ['seen', 'unseen']") for p in problems)  # every family unseen now


def test_a_round_is_paired_with_its_control() -> None:
    data = _data()
    line = next(line for line in format_table(data) if line.startswith("round-1 vs control-1"))
    assert "McNemar exact p" in line
    for part in (data, *data["subsets"].values()):
        part["comparisons"] = [c for c in part["comparisons"] if c["a"] == "base"]
    assert verify(data) == []  # the extra pair is asked for, not required
    data = _data()
    data["comparisons"][-1]["only_b"] += 1
    assert any("comparisons.control-1-vs-round-1.only_b" in p for p in verify(data))


def test_a_file_without_families_is_unchanged() -> None:
    data = summarize({"t1": {"base": True, "round-1": False}, "t2": {"base": False, "round-1": True}})
    assert set(data) == {"tasks", "arms", "comparisons"} and "family" not in data["tasks"][0]
    assert verify(data) == []


def test_bad_families_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="unseen families"):
        summarize({"t": {"base": True, "x": True}}, families={"t": "mul"}, unseen={"summul"})
    with pytest.raises(ConfigError, match="both must be arms"):
        summarize({"t": {"base": True, "x": True}}, pairs=[("control-1", "x")])


def test_the_report_shows_success_per_family_with_the_unseen_ones_marked(tmp_path: Path) -> None:
    for r in (1, 2):
        write_eval_json(tmp_path / "improve" / f"round-{r}" / "eval.json", _data(r, seed=r))
    page = make_report(TraceStore(tmp_path / "store"), tmp_path / "out", [tmp_path / "improve"]).html.read_text()
    assert "Success per task family" in page and "summul <b>(unseen)</b>" in page
    assert "<th>families</th>" in page and "unseen" in page
    assert "Every figure recomputes from the per-task outcomes." in page


def test_an_insignificant_difference_is_not_drawn_as_better(tmp_path: Path) -> None:
    """Issue 39: p = 0.625 and [-3.3, +10.0] was drawn in green with no word."""
    outcomes = {f"t{i}": {"base": i < 3, "round-1": i < 3 or 3 <= i < 6} for i in range(30)}  # 3 vs 6: p = 0.25
    write_eval_json(tmp_path / "run" / "eval.json", summarize(outcomes))
    page = make_report(TraceStore(tmp_path / "store"), tmp_path / "out", [tmp_path / "run"]).html.read_text()
    assert "(not significant)" in page and '<span class="better">+10.0 pts</span>' not in page
