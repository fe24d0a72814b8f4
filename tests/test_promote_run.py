"""A promotion end to end with an evaluator whose outcomes the test decides (issue 38): a significantly better
adapter is promoted and becomes what the next one is judged against, an insignificant one is refused and changes
nothing, rollback restores the previous one, and a leak or too few tasks stop it before its test."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowrl.promote import History
from flowrl.promote.run import CANDIDATE, CURRENT, PromotionError, promote


@dataclass(frozen=True)
class Task:
    task_id: str
    query: str


TASKS = [Task(f"t{i}", f"What is {i} * 3?") for i in range(400)]


def _adapter(folder: Path, trained_on: list[str]) -> Path:
    data = folder / "data"
    (data / "data").mkdir(parents=True)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "x"}]} for q in trained_on]
    (data / "data" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    adapter = folder / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "flowrl_train.json").write_text(json.dumps({"config": {"dataset": str(data)}}))
    return adapter


class Evaluator:
    """Each model's success rate is given: model folder (None: the base) -> the first k tasks right."""

    def __init__(self, right: dict[str | None, int], tasks: list[Task] = TASKS) -> None:
        self.right, self.tasks, self.calls = right, tasks, []

    def __call__(self, arms: dict[str, Path | None]) -> dict[str, dict[str, bool]]:
        self.calls.append(arms)
        ((arm, model),) = arms.items()
        k = self.right[None if model is None else str(model)]
        return {t.task_id: {arm: i < k} for i, t in enumerate(self.tasks)}


def test_promote_refuse_then_roll_back(tmp_path: Path) -> None:
    history = History(tmp_path / "promotions.jsonl")
    one = _adapter(tmp_path / "r1", ["What is 1000 * 3?"])
    two = _adapter(tmp_path / "r2", ["What is 2000 * 3?"])
    evaluate = Evaluator({None: 8, str(one): 40, str(two): 44})

    first = promote(one, evaluate=evaluate, tasks=TASKS, history=history, out=tmp_path / "p1")
    assert first.decision.promote and history.current() == str(one)
    assert evaluate.calls[0] == {CURRENT: None} and evaluate.calls[1] == {CANDIDATE: one}
    assert first.uses_before == 0 and first.entry.eval_sha256

    second = promote(two, evaluate=evaluate, tasks=TASKS, history=history, out=tmp_path / "p2")
    assert evaluate.calls[2] == {CURRENT: one}  # judged against what is promoted now, not the base
    assert not second.decision.promote and history.current() == str(one)  # 40 -> 44 of 400: not significant
    assert "not promoted" in second.lines()[0] and "served 1 earlier decision" in second.lines()[1]

    assert history.rollback() == (str(one), None) and history.current() is None


def test_a_leak_or_too_few_tasks_stops_before_the_candidate_runs(tmp_path: Path) -> None:
    history = History(tmp_path / "promotions.jsonl")
    leaky = _adapter(tmp_path / "leaky", [TASKS[5].query])
    evaluate = Evaluator({None: 8, str(leaky): 100})
    with pytest.raises(PromotionError, match="trained on 1 of the held-out tasks"):
        promote(leaky, evaluate=evaluate, tasks=TASKS, history=history, out=tmp_path / "p")
    fine = _adapter(tmp_path / "fine", ["something else"])
    few = TASKS[:40]
    with pytest.raises(PromotionError, match="power 0.8 needs"):
        promote(fine, evaluate=Evaluator({None: 2, str(fine): 30}, few), tasks=few, history=history, out=tmp_path / "q")
    assert evaluate.calls == [] and history.entries() == []  # nothing ran, nothing recorded


def test_the_command_promotes_lists_and_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import flowrl.cli.promote as cli_promote
    from flowrl.cli import main

    def fake(make_agent: Any, grade: Any, candidate: Path, tasks: list, out: Path, engine: str, arms: dict) -> dict:
        ((arm, model),) = arms.items()
        k = 3 if model is None else 40  # the base model 2%, the candidate 27% of 150 tasks
        return {t.task_id: {arm: i < k} for i, t in enumerate(tasks)}

    monkeypatch.setattr(cli_promote, "_evaluate", fake)
    adapter = _adapter(tmp_path / "r1", ["a question no held-out task asks"])
    history = tmp_path / "promotions.jsonl"
    args = ["--history", str(history)]
    assert main(["promote", str(adapter), "--out", str(tmp_path / "p"), *args]) == 0
    assert "promoted: better than current" in capsys.readouterr().out
    assert main(["promote", "--list", *args]) == 0
    listed = capsys.readouterr().out
    assert "promote" in listed and f"promoted now: {adapter}" in listed and "p = " in listed
    assert main(["promote", "--rollback", *args]) == 0
    assert "promoted now: the base model" in capsys.readouterr().out
    assert main(["promote", "--rollback", *args]) != 0  # nothing left to undo: one line
    assert "nothing to roll back" in capsys.readouterr().err


def test_export_writes_the_promoted_model_whole_or_leaves_the_deployed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`flowrl promote --export DIR`: the model promoted now as GGUF with its Modelfile, for those who deploy with
    Ollama; an export that fails leaves the folder deployed before as it was."""
    from flowrl.cli import main
    from flowrl.promote.history import Entry
    from tests.helpers_export import save_tiny_adapter, save_tiny_model

    base = save_tiny_model(tmp_path / "base")
    adapter = save_tiny_adapter(base, tmp_path / "round-1")
    history = History(tmp_path / "promotions.jsonl")
    deployed = tmp_path / "deployed"
    args = ["--history", str(history.path), "--export", str(deployed)]
    assert main(["promote", *args]) != 0  # nothing promoted yet: one line naming the fix
    assert "nothing is promoted" in capsys.readouterr().err and not deployed.exists()

    history.append(Entry("promote", candidate=str(adapter), replaced=None))
    assert main(["promote", *args]) == 0
    assert f"exported {adapter}" in capsys.readouterr().out
    (gguf,) = deployed.glob("*.gguf")
    assert "FROM ./" in (deployed / "Modelfile").read_text()
    before = {p.relative_to(deployed): p.read_bytes() for p in deployed.rglob("*") if p.is_file()}

    broken = tmp_path / "round-2"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{}")  # no weights: the export fails
    history.append(Entry("promote", candidate=str(broken), replaced=str(adapter)))
    assert main(["promote", *args]) != 0
    capsys.readouterr()
    assert {p.relative_to(deployed): p.read_bytes() for p in deployed.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".deployed")] == []

    assert main(["promote", "--rollback", *args]) == 0  # back to round 1: exported again
    assert f"exported {adapter}" in capsys.readouterr().out and gguf.is_file()


def test_the_command_runs_your_agent_on_your_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`flowrl promote CANDIDATE --agent FILE:FACTORY --tasks FILE [--grade]`: every task of the file is held out,
    the agent is built by its factory on each arm's policy and graded by the grade given (or the strict default)."""
    import types

    import flowrl.cli.promote as cli_promote
    from flowrl.cli import main

    (tmp_path / "promote_agent.py").write_text(
        "class Agent:\n"
        "    def __init__(self, policy):\n"
        "        self.policy = policy\n"
        "    def run(self, query):\n"
        "        return query.split()[-1] if self.policy.adapter else 'no idea'\n"
        "def make(policy):\n"
        "    return Agent(policy)\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"task_id": f"u{i}", "query": f"say {i}", "answer": str(i)}) + "\n" for i in range(100))
    )
    seen: dict[str, Any] = {}

    def served(make_agent: Any, grade: Any, held_out: list, arms: dict, **_: Any) -> dict:
        """The policy server's part, faked: each arm's agent made on a policy with its adapter, run and graded."""
        seen.setdefault("arms", []).extend(arms)
        out: dict[str, dict[str, bool]] = {}
        for arm, (_base, adapter) in arms.items():
            for t in held_out:
                agent = make_agent(types.SimpleNamespace(adapter=adapter))
                out.setdefault(t.task_id, {})[arm] = grade(t, agent.run(t.query))
        return out

    monkeypatch.setattr(cli_promote, "agent_outcomes", served)
    monkeypatch.setattr("flowrl.models.resolve_model", lambda spec: types.SimpleNamespace(path="base"))
    adapter = _adapter(tmp_path / "r1", ["a question no held-out task asks"])
    history = tmp_path / "promotions.jsonl"
    agent = f"{tmp_path / 'promote_agent.py'}:make"
    args = [
        str(adapter),
        "--agent",
        agent,
        "--tasks",
        str(tasks),
        "--history",
        str(history),
        "--out",
        str(tmp_path / "p"),
    ]
    assert main(["promote", *args]) == 0, capsys.readouterr()
    assert "promoted" in capsys.readouterr().out and seen["arms"] == ["current", "candidate"]
    data = json.loads((tmp_path / "p" / "eval.json").read_text())
    assert data["arms"]["current"]["successes"] == 0 and data["arms"]["candidate"]["successes"] == 100
    assert main(["promote", str(adapter), "--tasks", str(tasks), "--history", str(history)]) != 0
    assert "go with --agent" in capsys.readouterr().err


def test_the_record_names_models_by_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flowrl promote improve-out/round-1/adapter` recorded the relative path, which a server following the record
    from another folder (`flowrl serve BASE --promotions ...`) could not load."""
    monkeypatch.chdir(tmp_path)
    _adapter(tmp_path / "r1", ["a question no held-out task asks"])
    history = History(tmp_path / "promotions.jsonl")
    evaluate = Evaluator({None: 3, str(Path("r1/adapter")): 40})
    result = promote(Path("r1/adapter"), evaluate=evaluate, tasks=TASKS[:150], history=history, out=tmp_path / "p")
    assert result.entry.action == "promote" and history.current() == str(tmp_path / "r1" / "adapter")
