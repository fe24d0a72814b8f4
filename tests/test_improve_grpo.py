"""`flowrl improve --method grpo`: each round's groups (a task's runs), rewarded by the grade, replayed by offline
GRPO from the adapter that sampled them (issue 37). The agent is scripted and the model tiny: what is checked is
the bookkeeping (groups kept, start adapter, budget), not that the tiny model learns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model  # noqa: E402
from test_improve import HELD, TRAIN, FakePolicies, grade  # noqa: E402

from flowrl.engines.policy import Policy  # noqa: E402
from flowrl.improve.config import ImproveConfig, ImproveError  # noqa: E402
from flowrl.improve.loop import improve  # noqa: E402


class HalfRightAgent:
    """Right on even-numbered samples of tasks t0-t3, always wrong on t4-t7: four groups vary, four do not."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def a_run(self, query: str, session_id: str = "") -> str:
        n = int(query.split()[2])
        sample = int(session_id.rsplit("#", 1)[1]) if "#" in session_id else 0
        good = n < 4 and sample % 2 == 0
        return f"The answer is {n * 3 if good else n * 3 + 1}."


def _config(tmp_path: Path, **extra: Any) -> ImproveConfig:
    return ImproveConfig(
        out=tmp_path / "out",
        method="grpo",
        samples=4,
        base_model=str(build_tiny_model(tmp_path / "tiny")),
        max_steps=2,
        concurrency=4,
        hook_options={"run_methods": ["a_run"]},
        **extra,
    )


def test_a_grpo_round_trains_on_the_groups_whose_runs_disagree(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    policies = FakePolicies()
    (result,) = improve(lambda p: HalfRightAgent(p), TRAIN, HELD, grade, cfg, policies=policies)
    select = json.loads((tmp_path / "out" / "round-1" / "select.json").read_text())
    assert select["groups"] == 4 and select["groups_all_wrong"] == 4 and select["n_right"] == 8
    rows = [json.loads(x) for x in (tmp_path / "out" / "round-1" / "data-selected" / "data" / "train.jsonl").open()]
    assert sorted(sorted(r["logged_rewards"]) for r in rows) == [[0.0, 0.0, 1.0, 1.0]] * 4
    trained = json.loads((tmp_path / "out" / "round-1" / "train.json").read_text())["round-1/adapter"]
    assert trained["method"] == "grpo-offline" and trained["steps_taken"] == 2
    assert trained["effective_batch_size"] == 16  # 4 groups of 4 a step
    assert (result.adapter / "adapter_config.json").is_file()
    assert policies.served["collect-1"].adapter is None


def test_grpo_refuses_a_control_and_a_group_of_one(tmp_path: Path) -> None:
    with pytest.raises(ImproveError, match="--control unfiltered with --method grpo"):
        ImproveConfig(out=tmp_path, method="grpo", control="unfiltered")
    with pytest.raises(ImproveError, match="a group needs at least 2 runs"):
        ImproveConfig(out=tmp_path, method="grpo", samples=1)
    assert ImproveConfig(out=tmp_path, method="grpo").runs_per_task == 8
    assert ImproveConfig(out=tmp_path).runs_per_task == 4


def test_a_grpo_round_whose_groups_never_disagree_stops_with_one_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    later = [t for t in TRAIN if int(t.task_id[1:]) >= 4]  # always wrong: no group varies
    with pytest.raises(ImproveError, match="no task had both right and wrong runs"):
        improve(lambda p: HalfRightAgent(p), later, HELD, grade, cfg, policies=FakePolicies())
