"""Code outside `flowrl.methods` asks a method's spec what it does, never its name (issue 35).

Each test registers a made-up method in one `register_method` line that reuses an existing builder and
encoding under a new name, and checks that the call sites treat it as the method it copies: improve's
selection, the train config's agent check, the dataset CLI's "score first" hint, the hardware batch check and
TRL's config arguments. On code that compared `method == "sft"` (or `!= "grpo"`), the copies were treated as
another method."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flowrl.data.synthetic import synthetic_trace
from flowrl.errors import ConfigError
from flowrl.methods import METHODS, get_method, register_method
from flowrl.train.config import TrainingConfig
from flowrl.train.hardware import HardwareInfo, resolve_settings

CPU = HardwareInfo(accelerator="cpu", cpu_count=2)


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rft` (rejection-sampled SFT), `agentic` (online GRPO) and `unpaired` (KTO), each one line."""
    for name in ("rft", "agentic", "unpaired"):
        monkeypatch.setitem(METHODS, name, METHODS["sft"])  # restored after the test
    register_method(dataclasses.replace(METHODS["sft"], name="rft", card_format="rejection-sampled SFT"))
    register_method(dataclasses.replace(METHODS["grpo"], name="agentic", aliases=()))
    register_method(dataclasses.replace(METHODS["kto"], name="unpaired"))


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "data" / "train.jsonl").open()]


def test_improve_trains_a_rejection_sampling_method_on_the_right_runs_only(tmp_path: Path, copies: None) -> None:
    from flowrl.improve.loop import Improve, ImproveConfig

    loop = object.__new__(Improve)  # `build` reads only the config
    loop.cfg = ImproveConfig(out=tmp_path / "out")
    traces = [synthetic_trace(i, n_tasks=2) for i in range(8)]
    for i, t in enumerate(traces):
        t.label = i % 4 != 0  # 6 right runs over 2 tasks
    right = [t for t in traces if t.label]
    loop.build(tmp_path / "rft", right, method="rft")
    loop.build(tmp_path / "sft", right, method="sft")
    rft, sft = _rows(tmp_path / "rft"), _rows(tmp_path / "sft")
    assert len(rft) == len(sft) == 6 and [r["messages"] for r in rft] == [r["messages"] for r in sft]
    meta = json.loads((tmp_path / "rft" / "flowrl_dataset.json").read_text())
    assert meta["method"] == "rft" and meta["options"]["select"] == "label"  # built as SFT's rejection sampling
    assert get_method("rft").trains_on_right_runs and not get_method("unpaired").trains_on_right_runs


def test_the_agent_check_asks_whether_the_method_generates(copies: None) -> None:
    cfg = TrainingConfig(method="agentic", agent="example")  # online GRPO under another name: an agent rolls out
    assert cfg.agent == "example" and get_method("agentic").online
    with pytest.raises(ValueError, match="rollouts through an agent"):
        TrainingConfig(method="unpaired", agent="example")
    with pytest.raises(ValueError, match="rollouts through an agent"):
        TrainingConfig(method="grpo-offline", agent="example")


def test_only_a_method_that_scores_while_training_needs_no_rewards(copies: None) -> None:
    assert not get_method("agentic").needs_rewards and not get_method("grpo").needs_rewards
    assert get_method("rft").needs_rewards and get_method("unpaired").needs_rewards
    assert get_method("grpo-offline").needs_rewards


def test_a_kto_encoded_method_gets_ktos_batch_floor_and_class_weights(tmp_path: Path, copies: None) -> None:
    from flowrl.train.trainers import trl_config_kwargs

    with pytest.raises(ConfigError, match="UNPAIRED needs a batch of at least 2"):
        resolve_settings(TrainingConfig(method="unpaired", dataset=Path("d"), per_device_train_batch_size=1), CPU)
    long = resolve_settings(TrainingConfig(method="unpaired", dataset=Path("d"), max_length=8192), CPU)
    assert long.per_device_train_batch_size == 2  # the KL estimate needs 2 rows, as for kto
    cfg = TrainingConfig(method="unpaired", dataset=tmp_path, beta=0.2)
    kw = trl_config_kwargs(cfg, resolve_settings(cfg, CPU), tmp_path)
    assert (kw["desirable_weight"], kw["undesirable_weight"], kw["beta"]) == (1.0, 1.0, 0.2)
    sft = TrainingConfig(method="rft", dataset=tmp_path, beta=0.2)
    kw = trl_config_kwargs(sft, resolve_settings(sft, CPU), tmp_path)
    assert "beta" not in kw and kw["packing"] is False and "desirable_weight" not in kw
