"""The method table: a new training method is one file (its builder) plus one registration line."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model  # noqa: E402

from flowrl.data.synthetic import synthetic_trace  # noqa: E402
from flowrl.errors import ConfigError  # noqa: E402
from flowrl.methods import METHODS, MethodSpec, get_method, register_method  # noqa: E402


def test_every_builtin_method_is_one_spec_read_everywhere() -> None:
    from flowrl.methods import method_names
    from flowrl.train.config import TrainingConfig

    assert set(method_names()) >= {"grpo", "grpo-offline", "kto", "sft", "dpo"}
    assert TrainingConfig(method="GRPO_online", dataset=Path(".")).method == "grpo"
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        TrainingConfig(method="nope", dataset=Path("."))
    with pytest.raises(ConfigError, match="use one of"):
        get_method("nope")


def test_a_new_method_is_one_file_and_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.cli import main

    monkeypatch.setitem(METHODS, "first-good-sft", METHODS["sft"])  # restored after the test
    register_method(
        MethodSpec(  # the one line
            "first-good-sft",
            "plugins.first_answer_sft:FirstGoodSFTBuilder",
            "SFTConfig",
            "SFTTrainer",
            (("messages",),),
            2e-4,
            "SFT on each task's earliest good run",
            encoding="sft",
        )
    )

    from flowrl.data import DatasetPipeline
    from flowrl.methods import make_builder

    traces = [synthetic_trace(i, n_tasks=4) for i in range(16)]
    for t in traces:
        t.label = t.reward_score is not None and t.reward_score >= 0.5
    result = DatasetPipeline(make_builder("first-good-sft"), val_fraction=0.0).build(traces, tmp_path / "ds")
    assert result.method == "first-good-sft" and 0 < result.counts["train"] <= 4
    model = build_tiny_model(tmp_path / "tiny")
    assert (
        main(
            [
                "train",
                "--method",
                "first-good-sft",
                "--dataset",
                str(tmp_path / "ds"),
                "--base-model",
                str(model),
                "--output-dir",
                str(tmp_path / "out"),
                "--max-steps",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
