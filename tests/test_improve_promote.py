"""`flowrl improve --promote` over two rounds (issue 38): round 1's adapter is significantly better than the base
and is promoted; round 2's is no better than round 1's, is judged against it (not the base) and refused. The agent
is scripted by which adapter serves it; the model is tiny."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model  # noqa: E402
from test_improve import FakePolicies, Task, grade  # noqa: E402

from flowrl.engines.policy import Policy  # noqa: E402
from flowrl.evaluate.results import verify  # noqa: E402
from flowrl.improve.loop import ImproveConfig, improve  # noqa: E402
from flowrl.promote import History  # noqa: E402

TRAIN = [Task(f"t{i}", f"What is {i} times 3?", str(i * 3)) for i in range(10)]
HELD = [Task(f"h{i}", f"What is {i} times 3?", str(i * 3)) for i in range(1000, 1400)]


class ByAdapter:
    """Right on every 10th task with the base model, on every 2nd with any trained adapter."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def a_run(self, query: str, session_id: str = "") -> str:
        n = int(query.split()[2])
        good = n % (2 if self.policy.adapter is not None else 10) == 0
        return f"The answer is {n * 3 if good else n * 3 + 1}."


def test_two_rounds_promote_the_better_adapter_and_refuse_the_one_that_is_not(tmp_path: Path) -> None:
    cfg = ImproveConfig(
        out=tmp_path / "out",
        rounds=2,
        samples=1,
        base_model=str(build_tiny_model(tmp_path / "tiny")),
        max_steps=1,
        concurrency=8,
        hook_options={"run_methods": ["a_run"]},
        promote=True,
    )
    stages: list[tuple[str, str]] = []
    one, two = improve(
        lambda p: ByAdapter(p),
        TRAIN,
        HELD,
        grade,
        cfg,
        policies=FakePolicies(),
        on_stage=lambda s, m: stages.append((s, m)),
    )
    history = History(tmp_path / "out" / "promotions.jsonl")
    first, second = history.entries()
    assert (first.action, first.candidate, first.replaced) == ("promote", str(one.adapter), None)
    assert (second.action, second.candidate, second.replaced) == ("refuse", str(two.adapter), str(one.adapter))
    assert "not significant" in second.reason and history.current() == str(one.adapter)
    data = json.loads(two.eval_path.read_text())
    assert "promoted-2" in data["arms"] and verify(data) == []  # round 2 ran the promoted model on the same tasks
    assert ("promoted-2", "round-2") in {(c["a"], c["b"]) for c in data["comparisons"]}
    promote_lines = [m for s, m in stages if s == "promote"]
    assert promote_lines[0].startswith("round 1: promoted") and "served 1 before" in promote_lines[1]
