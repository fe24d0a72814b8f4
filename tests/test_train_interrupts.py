"""Issue 22: what `flowrl train` leaves and says after Ctrl-C, and `--no-progress` silencing every bar.

Ctrl-C is simulated by sending SIGINT to this process from a trainer callback at a given step (once: finish the
step, save, stop; twice: stop at once), as `tests/test_train_methods.py` does."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model, write_tiny_dataset  # noqa: E402

from flowrl.cli import main  # noqa: E402
from flowrl.errors import ConfigError  # noqa: E402
from flowrl.train import TrainingConfig  # noqa: E402
from flowrl.train.callbacks import StepTimer  # noqa: E402
from flowrl.train.pipeline import RUN_FILE, last_checkpoint, prepare_output_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "sft", "sft")


def train_args(tiny: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--method",
        "sft",
        "--dataset",
        str(data),
        "--base-model",
        str(tiny),
        "--output-dir",
        str(out),
        "--max-steps",
        "4",
        "--max-length",
        "128",
        "--lr",
        "5e-3",
        "--no-progress",
        *extra,
    ]


def ctrl_c_at(monkeypatch: pytest.MonkeyPatch, step: int, times: int) -> None:
    """Press Ctrl-C `times` times when step `step` ends (the CLI takes no callbacks: ride on the step timer)."""
    original = StepTimer.on_step_end

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        original(self, args, state, control, **kwargs)
        if state.global_step == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(StepTimer, "on_step_end", on_step_end)


def test_ctrl_c_once_saves_and_exits_130(
    tiny: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    ctrl_c_at(monkeypatch, 1, times=1)
    assert main(train_args(tiny, data, out)) == 130
    said = re.search(r"interrupted: saved at step (\d+)", capsys.readouterr().out)
    assert said is not None and int(said[1]) < 4
    assert (out / f"checkpoint-{said[1]}" / "trainer_state.json").is_file()
    assert (out / "adapter_model.safetensors").is_file()
    monkeypatch.undo()
    assert main(train_args(tiny, data, out, "--resume")) == 0  # a finished run still exits 0
    assert json.loads((out / RUN_FILE).read_text())["result"]["global_step"] == 4


def test_ctrl_c_twice_before_any_checkpoint_leaves_a_folder_the_same_command_restarts(
    tiny: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    ctrl_c_at(monkeypatch, 2, times=2)
    assert main(train_args(tiny, data, out)) == 130
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]  # step 1 logged, nothing saved
    old_log = (out / "metrics.jsonl").read_text()
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="without --resume"):  # nothing to resume: the message says what works
        prepare_output_dir(TrainingConfig(method="sft", dataset=data, output_dir=out, resume=True))
    assert main(train_args(tiny, data, out)) == 0  # no --overwrite needed
    kept = [p for p in out.iterdir() if p.name.startswith("metrics.interrupted")]
    assert [p.read_text() for p in kept] == [old_log]  # the interrupted run's log is kept aside
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[:4] == [1, 2, 3, 4]


def test_a_finished_run_without_checkpoints_asks_for_overwrite_not_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in (RUN_FILE, "metrics.jsonl", "adapter_model.safetensors"):
        (out / name).write_text("{}")
    cfg = TrainingConfig(method="sft", dataset=tmp_path, output_dir=out)
    with pytest.raises(ConfigError, match="--overwrite") as plain:
        prepare_output_dir(cfg)
    assert "--resume" not in str(plain.value)
    with pytest.raises(ConfigError, match="--overwrite") as resumed:
        prepare_output_dir(cfg.model_copy(update={"resume": True}))
    assert "without --resume" not in str(resumed.value)
    assert prepare_output_dir(cfg.model_copy(update={"overwrite": True})) == (out, None)
    assert list(out.iterdir()) == []


def test_a_checkpoint_cut_off_while_saving_is_not_resumed_from(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-3").mkdir()  # Ctrl-C twice while it was written: no trainer_state.json
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


def test_no_progress_silences_every_bar(
    tiny: Path, data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import datasets
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    before = (
        hf_logging.is_progress_bar_enabled(),
        datasets.is_progress_bar_enabled(),
        hub_utils.are_progress_bars_disabled(),
    )
    assert main(train_args(tiny, data, tmp_path / "out", "--max-steps", "1")) == 0
    err = capfd.readouterr().err
    assert "it/s]" not in err and "%|" not in err, err
    after = (
        hf_logging.is_progress_bar_enabled(),
        datasets.is_progress_bar_enabled(),
        hub_utils.are_progress_bars_disabled(),
    )
    assert after == before  # library users keep their own setting


def test_ctrl_c_after_the_last_checkpoint_is_finished_by_resume(tiny: Path, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(train_args(tiny, data, out, "--max-steps", "2")) == 0
    for name in (RUN_FILE, "README.md", "adapter_model.safetensors"):  # Ctrl-C while the adapter was written
        (out / name).unlink()
    assert main(train_args(tiny, data, out, "--max-steps", "2", "--resume")) == 0
    assert (out / "adapter_model.safetensors").is_file() and (out / RUN_FILE).is_file()
