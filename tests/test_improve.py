"""`flowrl improve` for any agent: collect (hooked) -> score -> select -> train -> eval.json, resumable.

The agent is a fake whose answers are scripted (right for some tasks); the model is a tiny random one, so
training is real but fast. What is checked is the loop's bookkeeping, not that the tiny model learns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model  # noqa: E402

from flowrl.engines.policy import Policy  # noqa: E402
from flowrl.evaluate.results import verify  # noqa: E402
from flowrl.evaluate.runs import read_runs  # noqa: E402
from flowrl.improve.loop import ImproveConfig, ImproveError, improve  # noqa: E402


class FakePolicies:
    """Policies without an engine: the scripted agent never calls the endpoint, it reads `policy.adapter`."""

    def __init__(self) -> None:
        self.served: dict[str, Policy] = {}

    def policy(self, name: str, adapter: Path | None = None, *, temperature: float, seed: int = 0) -> Policy:
        self.served[name] = Policy("http://127.0.0.1:9/v1", name, temperature=temperature, seed=seed, adapter=adapter)
        return self.served[name]


@dataclass(frozen=True)
class Task:
    task_id: str
    query: str
    answer: str


class ScriptedAgent:
    """Answers right for even-numbered tasks; a trained adapter (any) also gets the odd ones right."""

    def __init__(self, policy: Policy, right_always: bool = False) -> None:
        self.policy = policy
        self.right_always = right_always

    async def a_run(self, query: str, session_id: str = "default") -> str:
        n = int(query.split()[2])
        good = n % 2 == 0 or self.policy.adapter is not None or self.right_always
        return f"The answer is {n * 3 if good else n * 3 + 1}."


def grade(task: Any, answer: str) -> bool:
    return task.answer in answer.replace(".", " ").split()


TRAIN = [Task(f"t{i}", f"What is {i} times 3?", str(i * 3)) for i in range(8)]
HELD = [Task(f"h{i}", f"What is {i} times 3?", str(i * 3)) for i in range(100, 106)]


def test_a_round_writes_a_verifiable_eval_json_and_resumes(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny")
    cfg = ImproveConfig(
        out=tmp_path / "out",
        rounds=1,
        samples=2,
        base_model=str(model),
        max_steps=1,
        control="unfiltered",
        concurrency=4,
        hook_options={"run_methods": ["a_run"]},
    )
    stages: list[tuple[str, str]] = []
    policies = FakePolicies()
    (result,) = improve(
        lambda p: ScriptedAgent(p),
        TRAIN,
        HELD,
        grade,
        cfg,
        on_stage=lambda s, m: stages.append((s, m)),
        policies=policies,
    )
    assert result.collected == 16 and result.right == 8
    data = json.loads(result.eval_path.read_text())
    assert verify(data) == []
    assert set(data["arms"]) == {"base", "round-1", "control-1"}
    assert data["arms"]["base"]["successes"] == 3 and data["arms"]["round-1"]["successes"] == 6
    traces = list((tmp_path / "out" / "traces").rglob("*.json"))
    assert len(traces) == 16  # every collected run is in the store
    assert policies.served["collect-1"].temperature == cfg.temperature and policies.served["collect-1"].adapter is None
    assert policies.served["eval-round-1"].adapter == result.adapter and policies.served["eval-base"].temperature == 0
    _check_secondary(tmp_path / "out", list(data["arms"]))
    trained = json.loads((result.eval_path.parent / "train.json").read_text())  # eval.json's neighbour: the budget
    assert set(trained) == {"round-1/adapter", "round-1/control-adapter"}
    assert trained["round-1/adapter"]["rows"] == 4 and trained["round-1/adapter"]["effective_batch_size"] == 4
    assert trained["round-1/adapter"]["steps"] == trained["round-1/adapter"]["steps_taken"] == 1  # --max-steps 1
    assert any(s == "train" and "1 steps of 4 rows" in m for s, m in stages), stages
    paired = {(c["a"], c["b"]) for c in data["comparisons"]}
    assert ("control-1", "round-1") in paired  # the round against its control, not only each arm against the base
    runs = {arm: list(read_runs(tmp_path / "out" / "eval-runs" / f"{arm}.jsonl.gz")) for arm in data["arms"]}
    for arm, lines in runs.items():  # what was graded, published: every held-out task's answer, and its outcome
        assert [line["task_id"] for line in lines] == [t.task_id for t in HELD]
        assert all(line["answer"].startswith("The answer is") for line in lines)
        assert [line["right"] for line in lines] == [t["outcomes"][arm] for t in data["tasks"]]
    stages.clear()
    improve(
        lambda p: ScriptedAgent(p),
        TRAIN,
        HELD,
        grade,
        cfg,
        on_stage=lambda s, m: stages.append((s, m)),
        policies=FakePolicies(),
    )
    assert all("reused" in m for s, m in stages), stages  # a second call redoes nothing


def _check_secondary(out: Path, arms: list[str]) -> None:
    """rewards.json: each reward's mean per arm over exactly the tasks where every arm's run has a value."""
    from flowrl.store.files import TraceStore

    secondary = json.loads((out / "round-1" / "rewards.json").read_text())["rewards"]
    runs = {
        arm: {t.session_id[len("eval-") :]: t.rewards for t in TraceStore(out / "eval-traces" / arm).iter_traces()}
        for arm in arms
    }
    assert secondary and any(entry["n"] == len(HELD) for entry in secondary.values())
    for name, entry in secondary.items():
        shared = [h.task_id for h in HELD if all(runs[arm].get(h.task_id, {}).get(name) is not None for arm in arms)]
        assert entry["n"] == len(shared), name
        for arm in arms:
            expected = sum(runs[arm][t][name] for t in shared) / len(shared) if shared else None
            assert entry["means"][arm] == (None if expected is None else pytest.approx(expected, abs=1e-6))


def test_a_round_with_nothing_right_stops_with_one_line(tmp_path: Path) -> None:
    cfg = ImproveConfig(
        out=tmp_path / "out",
        samples=1,
        base_model=str(tmp_path),
        concurrency=2,
        hook_options={"run_methods": ["a_run"]},
    )
    odd = [t for t in TRAIN if int(t.task_id[1:]) % 2]
    with pytest.raises(ImproveError, match="no run was graded right.*raise --samples"):
        improve(lambda p: ScriptedAgent(p), odd, HELD, grade, cfg, policies=FakePolicies())


def test_train_and_held_out_tasks_never_overlap(tmp_path: Path) -> None:
    with pytest.raises(ImproveError, match="both train and held-out"):
        improve(lambda p: ScriptedAgent(p), TRAIN, TRAIN[:2], grade, ImproveConfig(out=tmp_path))


def test_selection_uses_exactly_the_verdict_grade_gives(tmp_path: Path) -> None:
    """A grade that disagrees with `reference_answer` (it calls right what is one off, and wrong what matches):
    the SFT set holds exactly the runs the grade called right. On main, selection kept the runs whose
    `reference_answer` reward was 1.0, whatever the grade said."""
    model = build_tiny_model(tmp_path / "tiny")

    def one_off(task: Any, answer: str) -> bool:
        return str(int(task.answer) + 1) in answer.replace(".", " ").split()

    cfg = ImproveConfig(
        out=tmp_path / "out",
        samples=1,
        base_model=str(model),
        max_steps=1,
        concurrency=2,
        hook_options={"run_methods": ["a_run"]},
    )
    (result,) = improve(lambda p: ScriptedAgent(p), TRAIN, HELD, one_off, cfg, policies=FakePolicies())
    odd = {t.task_id for t in TRAIN if int(t.task_id[1:]) % 2}  # the scripted agent answers these one off
    assert result.right == len(odd) and result.selected == len(odd)
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "round-1" / "data-selected" / "data" / "train.jsonl").open()
    ]
    answers = {row["messages"][-1]["content"] for row in rows}
    assert answers == {f"The answer is {int(t.answer) + 1}." for t in TRAIN if t.task_id in odd}


def test_flowrl_eval_runs_the_agent_loop_and_writes_a_verifiable_eval_json(tmp_path: Path, capsys: Any) -> None:
    from flowrl.cli import main

    model = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--agent",
                "example",
                "--model",
                str(model),
                "--eval-tasks",
                "3",
                "--json",
                str(out),
                "--concurrency",
                "3",
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert verify(data) == [] and list(data["arms"]) == ["base"] and data["arms"]["base"]["n"] == 3
    secondary = json.loads((tmp_path / "eval.rewards.json").read_text())["rewards"]
    assert secondary and all(set(entry["means"]) == {"base"} for entry in secondary.values())
    assert len(list((tmp_path / "eval-traces" / "base").rglob("*.json"))) == 3  # the runs are kept
    assert "base: n=3" in capsys.readouterr().out or "base" in out.read_text()
    assert main(["eval", "--model", str(model)]) == 2
    assert "--agent example" in capsys.readouterr().err


def test_held_out_families_are_never_trained_on_and_reported_apart(tmp_path: Path) -> None:
    from flowrl.improve.user import Task as FamilyTask

    train = [FamilyTask(t.task_id, t.query, t.answer, "times") for t in TRAIN]
    held = [FamilyTask(t.task_id, t.query, t.answer, "times" if i < 3 else "thrice") for i, t in enumerate(HELD)]
    cfg = ImproveConfig(
        out=tmp_path / "out",
        samples=1,
        base_model=str(build_tiny_model(tmp_path / "tiny")),
        max_steps=1,
        concurrency=2,
        hook_options={"run_methods": ["a_run"]},
        hold_out_families="thrice",
    )
    (result,) = improve(lambda p: ScriptedAgent(p), train, held, grade, cfg, policies=FakePolicies())
    data = json.loads(result.eval_path.read_text())
    assert verify(data) == []
    assert {t["task_id"]: t["family"] for t in data["tasks"]} == {t.task_id: t.family for t in held}
    assert data["families"]["thrice"]["unseen"] and not data["families"]["times"]["unseen"]
    assert data["subsets"]["unseen"]["arms"]["round-1"]["n"] == 3 and data["subsets"]["seen"]["arms"]["base"]["n"] == 3
    with pytest.raises(ImproveError, match="train tasks are of a held-out family"):
        improve(lambda p: ScriptedAgent(p), held[3:], train[:2], grade, cfg, policies=FakePolicies())
