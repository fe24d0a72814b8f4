"""The eval's statistics and its JSON: known values, determinism, a verifiable round trip, the report's error bars."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from flowrl.errors import ConfigError, FlowRLError
from flowrl.evaluate.results import format_table, read_eval_json, summarize, verify, write_eval_json
from flowrl.evaluate.stats import mcnemar_exact, paired_bootstrap_diff, wilson_interval
from flowrl.report import make_report
from flowrl.store.files import TraceStore


def _outcomes(n: int = 150, rates: dict[str, float] | None = None, seed: int = 1) -> dict[str, dict[str, bool]]:
    rng = random.Random(seed)
    rates = rates or {"base": 0.12, "round-1": 0.45}
    return {f"task-{i:03d}": {arm: rng.random() < p for arm, p in rates.items()} for i in range(n)}


def test_wilson_interval_known_values() -> None:
    assert wilson_interval(0, 4) == pytest.approx((0.0, 0.4899), abs=1e-4)
    assert wilson_interval(1, 4) == pytest.approx((0.0456, 0.6994), abs=1e-4)
    assert wilson_interval(18, 150) == pytest.approx((0.07727, 0.18171), abs=1e-5)
    assert wilson_interval(4, 4) == pytest.approx((0.5101, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


def test_mcnemar_exact_known_values() -> None:
    assert mcnemar_exact(0, 1) == 1.0
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 10) == 0.001953125
    assert mcnemar_exact(10, 0) == 0.001953125
    assert mcnemar_exact(2, 10) == pytest.approx(0.0386, abs=1e-4)  # 2 * 79 / 4096
    assert mcnemar_exact(5, 5) == 1.0  # capped
    assert 0 < mcnemar_exact(3000, 3100) < 1  # big counts stay exact integers until the last division


def test_paired_bootstrap_is_deterministic_and_sees_a_clear_improvement() -> None:
    out = _outcomes()
    a = [o["base"] for o in out.values()]
    b = [o["round-1"] for o in out.values()]
    first = paired_bootstrap_diff(a, b, seed=0)
    assert paired_bootstrap_diff(a, b, seed=0) == first
    diff, lo, hi = first
    assert diff == pytest.approx(sum(b) / len(b) - sum(a) / len(a))
    assert 0 < lo < diff < hi
    none_diff, none_lo, none_hi = paired_bootstrap_diff(a, a)
    assert none_diff == none_lo == none_hi == 0.0
    with pytest.raises(ValueError, match="pair them"):
        paired_bootstrap_diff(a, b[:-1])


def test_summarize_writes_the_schema_and_verifies_after_a_round_trip(tmp_path: Path) -> None:
    data = summarize(_outcomes(rates={"base": 0.12, "round-1": 0.45, "control-1": 0.15}))
    assert set(data) == {"tasks", "arms", "comparisons"}
    assert list(data["arms"]) == ["base", "round-1", "control-1"]
    assert set(data["arms"]["base"]) == {"n", "successes", "rate", "ci95"}
    assert [(c["a"], c["b"]) for c in data["comparisons"]] == [("base", "round-1"), ("base", "control-1")]
    c = data["comparisons"][0]
    assert c["both"] + c["only_a"] + c["only_b"] + c["neither"] == 150
    assert c["mcnemar_p"] < 0.01 and c["diff_ci95"][0] > 0
    path = tmp_path / "round-1" / "eval.json"
    write_eval_json(path, data)
    again = read_eval_json(path)
    assert again == data and verify(again) == []
    lines = format_table(again)
    assert lines[1].startswith("base") and "McNemar exact p" in lines[-1]


def test_verify_catches_a_tampered_figure() -> None:
    data = json.loads(json.dumps(summarize(_outcomes())))
    data["arms"]["round-1"]["rate"] += 0.01
    data["comparisons"][0]["only_b"] += 1
    problems = verify(data)
    assert any(p.startswith("arms.round-1.rate") for p in problems)
    assert any("only_b" in p for p in problems)
    data = summarize(_outcomes())
    data["tasks"][0]["outcomes"]["base"] = not data["tasks"][0]["outcomes"]["base"]  # the outcomes no longer fit
    assert any("successes" in p for p in verify(data))
    assert verify({**data, "extra": 1})[0].startswith("not an eval JSON")


def test_a_missing_arm_is_a_clear_error() -> None:
    out = _outcomes(n=5)
    del out["task-003"]["round-1"]
    with pytest.raises(ConfigError, match=r"task 'task-003' has no outcome for arm 'round-1'"):
        summarize(out)
    with pytest.raises(ConfigError, match="no base arm"):
        summarize(_outcomes(n=3, rates={"a": 0.5}))


def test_read_eval_json_names_the_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "eval.json"
    bad.write_text("{not json")
    with pytest.raises(FlowRLError, match="eval.json is not valid JSON"):
        read_eval_json(bad)
    bad.write_text(json.dumps({"tasks": [], "arms": {}}))
    with pytest.raises(FlowRLError, match="is not an eval JSON") as err:
        read_eval_json(bad)
    assert "\n" not in str(err.value)


def test_report_draws_rates_with_error_bars_per_round(tmp_path: Path) -> None:
    improve = tmp_path / "improve"
    for r, rate in ((1, 0.3), (2, 0.45)):
        out = _outcomes(rates={"base": 0.12, f"round-{r}": rate, f"control-{r}": 0.15}, seed=r)
        write_eval_json(improve / f"round-{r}" / "eval.json", summarize(out))
    single = tmp_path / "eval-cli.json"
    write_eval_json(single, summarize(_outcomes()))
    result = make_report(TraceStore(tmp_path / "store"), tmp_path / "out", [improve, single])
    page = result.html.read_text()
    assert "<h2>Held-out success</h2>" in page and "McNemar exact p" in page
    assert "Every figure recomputes from the per-task outcomes." in page
    assert "run `flowrl eval`" not in page  # the placeholder goes once there is an eval
    names = {p.name for p in result.pngs}
    assert {"success_rounds_0.png", "success_1.png"} <= names
    assert (tmp_path / "out" / "success_rounds_0.png").stat().st_size > 5_000


def test_report_flags_an_eval_json_that_does_not_recompute(tmp_path: Path) -> None:
    data = summarize(_outcomes())
    data["arms"]["round-1"]["successes"] += 5
    write_eval_json(tmp_path / "run" / "eval.json", data)
    page = make_report(TraceStore(tmp_path / "store"), tmp_path / "out", [tmp_path / "run"]).html.read_text()
    assert "do not recompute" in page and "arms.round-1.successes" in page


@pytest.mark.parametrize("round_", [1, 2])
def test_the_published_benchmark_eval_json_recomputes_to_its_own_figures(round_: int) -> None:
    """The eval.json files README and docs/benchmarks.md quote: every figure follows from the per-task outcomes."""
    path = (
        Path(__file__).resolve().parents[1]
        / "docs"
        / "results"
        / "improve-2026-11-24"
        / f"round-{round_}"
        / "eval.json"
    )
    data = read_eval_json(path)
    assert verify(data) == []
    arm = data["arms"][f"round-{round_}"]
    assert arm["n"] == 150 and arm["successes"] == {1: 17, 2: 76}[round_]


@pytest.mark.parametrize(
    ("name", "arms"), [("eval.json", {"base": 5, "sft": 11, "grpo": 7}), ("grpo-vs-sft.json", {"sft": 11, "grpo": 7})]
)
def test_the_published_grpo_vs_sft_figures_recompute(name: str, arms: dict[str, int]) -> None:
    """docs/results/grpo-vs-sft-2026-11-24 (issue 14): the README's rates and McNemar p recompute from the outcomes."""
    path = Path(__file__).resolve().parents[1] / "docs" / "results" / "grpo-vs-sft-2026-11-24" / name
    data = read_eval_json(path)
    assert verify(data) == []
    assert {arm: v["successes"] for arm, v in data["arms"].items()} == arms
    assert all(v["n"] == 150 for v in data["arms"].values())


@pytest.mark.parametrize(
    ("cell", "arms", "p_labelled"),
    [
        ("00", {"production": 25, "labelled": 93, "control": 15}, 1.2e-19),
        ("05", {"production": 25, "labelled": 95, "control": 21, "proposals": 94}, 3.1e-20),
        ("10", {"production": 25, "labelled": 66, "control": 27}, 1.0e-11),
    ],
)
def test_the_published_production_figures_recompute(cell: str, arms: dict[str, int], p_labelled: float) -> None:
    """docs/results/production-2026-12-07 (issue 36): each noise level's arms and the labelled arm's McNemar p, as
    the README and docs/benchmarks.md give them, recompute from the per-task outcomes."""
    path = Path(__file__).resolve().parents[1] / "docs" / "results" / "production-2026-12-07" / f"eval-flip{cell}.json"
    data = read_eval_json(path)
    assert verify(data) == []
    assert {arm: v["successes"] for arm, v in data["arms"].items()} == arms
    (labelled,) = [c for c in data["comparisons"] if c["b"] == "labelled"]
    assert labelled["mcnemar_p"] == pytest.approx(p_labelled, rel=0.05)


def test_the_published_check_ablation_recomputes() -> None:
    """docs/results/production-2026-12-07: the 5% cell trained with and without `--check-outcomes`, paired."""
    path = Path(__file__).resolve().parents[1] / "docs/results/production-2026-12-07/eval-flip05-check-off.json"
    data = read_eval_json(path)
    assert verify(data) == []
    successes = {arm: v["successes"] for arm, v in data["arms"].items()}
    assert successes == {"unchecked": 64, "checked": 95, "production": 25}
    (checked,) = [c for c in data["comparisons"] if c["b"] == "checked"]
    assert checked["mcnemar_p"] == pytest.approx(9.3e-10, rel=0.05) and checked["only_a"] == 0


def test_the_published_base_scenario_recomputes() -> None:
    """docs/results/production-2026-12-07: the base model in production, 5% flipped."""
    path = Path(__file__).resolve().parents[1] / "docs/results/production-2026-12-07/eval-base-flip05.json"
    data = read_eval_json(path)
    assert verify(data) == []
    assert {arm: v["successes"] for arm, v in data["arms"].items()} == {"production": 4, "labelled": 21, "control": 7}
    (labelled,) = [c for c in data["comparisons"] if c["b"] == "labelled"]
    assert labelled["mcnemar_p"] == pytest.approx(7.6e-5, rel=0.05)


SEEDS = Path(__file__).resolve().parents[1] / "docs" / "results" / "improve-seeds-2026-12-07"


@pytest.mark.parametrize(
    ("seed", "right", "p_round"),
    [(0, {"base": 4, "round-2": 13, "control-2": 7}, 0.022), (1, {"base": 4, "round-2": 13, "control-2": 13}, 0.035),
     (2, {"base": 10, "round-2": 16, "control-2": 14}, 0.11)],
)  # fmt: skip
def test_the_published_seed_figures_recompute(seed: int, right: dict[str, int], p_round: float) -> None:
    """docs/results/improve-seeds-2026-12-07 (issue 37): each seed's round-2 eval recomputes from its outcomes, the
    published runs are the graded ones, and the bench's spread agrees with the eval files."""
    from flowrl.evaluate.runs import read_runs

    folder = SEEDS / f"seed-{seed}"
    data = read_eval_json(folder / "round-2" / "eval.json")
    assert verify(data) == []
    assert {arm: v["successes"] for arm, v in data["arms"].items()} == right
    (c,) = [c for c in data["comparisons"] if (c["a"], c["b"]) == ("base", "round-2")]
    assert c["mcnemar_p"] == pytest.approx(p_round, rel=0.05)
    assert set(data["subsets"]) == {"seen", "unseen"}
    for arm in right:
        graded = {r["task_id"]: r["right"] for r in read_runs(folder / "eval-runs" / f"{arm}.jsonl.gz")}
        assert graded == {t["task_id"]: t["outcomes"][arm] for t in data["tasks"]}
    bench = json.loads((SEEDS / "bench.json").read_text())
    row = next(r for r in bench["spread"]["rows"] if r["seed"] == seed and r["subset"] == "all")
    assert row["round"] == data["arms"]["round-2"]["rate"] and row["base"] == data["arms"]["base"]["rate"]


def test_the_published_seed_0_repeat_recomputes() -> None:
    """docs/results/improve-seed0-repeat-2026-12-08 (issue 37): seed 0 run again with the same command and no
    control reached 106 of 210 (50.5%) where the first run reached 13 (6.2%): its figures recompute, and its
    graded runs are the published ones."""
    from flowrl.evaluate.runs import read_runs

    folder = Path(__file__).resolve().parents[1] / "docs" / "results" / "improve-seed0-repeat-2026-12-08"
    data = read_eval_json(folder / "round-2" / "eval.json")
    assert verify(data) == []
    assert {arm: v["successes"] for arm, v in data["arms"].items()} == {"base": 5, "round-2": 106}
    unseen = data["subsets"]["unseen"]["arms"]
    assert (unseen["base"]["successes"], unseen["round-2"]["successes"], unseen["round-2"]["n"]) == (0, 35, 77)
    for arm in ("base", "round-2"):
        graded = {r["task_id"]: r["right"] for r in read_runs(folder / "eval-runs" / f"{arm}.jsonl.gz")}
        assert graded == {t["task_id"]: t["outcomes"][arm] for t in data["tasks"]}


def test_the_published_grpo_round_recomputes() -> None:
    """docs/results/grpo-seed0-2026-12-08 (issue 37): GRPO (2 steps on 4 of 59 kept groups) from the 50.5% SFT adapter
    of seed 0: 151 of 310 against the adapter's 158, McNemar p = 0.21; the target families 0 and 0."""
    from flowrl.evaluate.runs import read_runs

    folder = Path(__file__).resolve().parents[1] / "docs" / "results" / "grpo-seed0-2026-12-08"
    data = read_eval_json(folder / "round-1" / "eval.json")
    assert verify(data) == []
    assert {arm: v["successes"] for arm, v in data["arms"].items()} == {"base": 158, "round-1": 151}
    (c,) = [c for c in data["comparisons"] if (c["a"], c["b"]) == ("base", "round-1")]
    assert (c["only_a"], c["only_b"]) == (15, 8) and c["mcnemar_p"] == pytest.approx(0.21, abs=0.01)
    target = ("multi-mul", "multi-add", "multi-muladd", "multi-subfrom", "summul")
    rows = [t for t in data["tasks"] if t.get("family") in target]
    assert len(rows) == 69 and not any(any(t["outcomes"].values()) for t in rows)
    for arm in ("base", "round-1"):
        graded = {r["task_id"]: r["right"] for r in read_runs(folder / "eval-runs" / f"{arm}.jsonl.gz")}
        assert graded == {t["task_id"]: t["outcomes"][arm] for t in data["tasks"]}
