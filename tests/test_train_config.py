"""TrainingConfig, hardware profiles and settings: pure logic, no torch needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.errors import ConfigError
from flowrl.train.config import TrainingConfig, load_config_file
from flowrl.train.hardware import HardwareInfo, choose_profile, resolve_settings

CPU = HardwareInfo(accelerator="cpu", cpu_count=2)
ONE_GPU = HardwareInfo(
    accelerator="cuda", gpu_count=1, gpu_names=("H100",), gpu_memory_gb=(80.0,), bf16=True, fp16=True, bitsandbytes=True
)
OLD_GPU = HardwareInfo(
    accelerator="cuda", gpu_count=1, gpu_names=("T4",), gpu_memory_gb=(15.0,), bf16=False, fp16=True, bitsandbytes=False
)
FOUR_GPUS = HardwareInfo(
    accelerator="cuda",
    gpu_count=4,
    gpu_names=("A100",) * 4,
    gpu_memory_gb=(40.0,) * 4,
    bf16=True,
    fp16=True,
    bitsandbytes=False,
    world_size=4,
)


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_config_file_is_read_and_flags_win(tmp_path: Path, suffix: str) -> None:
    data = {"method": "kto", "dataset": "ds", "max_steps": 7, "lora": {"r": 8}, "trl_args": {"loss_type": "kto"}}
    path = tmp_path / f"train{suffix}"
    if suffix == ".yaml":
        path.write_text("method: kto\ndataset: ds\nmax-steps: 7\nlora: {r: 8}\ntrl_args: {loss_type: kto}\n")
    elif suffix == ".toml":
        path.write_text('method = "kto"\ndataset = "ds"\nmax_steps = 7\n[lora]\nr = 8\n[trl_args]\nloss_type = "kto"\n')
    else:
        path.write_text(json.dumps(data))
    cfg = TrainingConfig.from_file(path, max_steps=3, lora={"alpha": 64}, learning_rate=None)
    assert cfg.method == "kto" and cfg.dataset == Path("ds")
    assert cfg.max_steps == 3  # the flag wins
    assert (cfg.lora.r, cfg.lora.alpha) == (8, 64)  # nested options merge
    assert cfg.trl_args == {"loss_type": "kto"}


def test_config_defaults_follow_the_issue() -> None:
    cfg = TrainingConfig(method="grpo", dataset=Path("d"))
    assert cfg.base_model == "smollm2-135m"
    assert (cfg.lora.enabled, cfg.lora.r, cfg.lora.alpha, cfg.lora.target_modules) == (True, 16, 32, "all-linear")
    assert cfg.resolved_output_dir == Path("out/train-grpo")
    assert cfg.resolved_learning_rate == 1e-4
    assert TrainingConfig(
        method="sft", dataset=Path("d"), lora={"enabled": False}
    ).resolved_learning_rate == pytest.approx(2e-5)


def test_unknown_option_is_one_clear_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("method: grpo\ndataset: d\nlearnin_rate: 1\n")
    with pytest.raises(ConfigError, match="learnin_rate"):
        TrainingConfig.from_file(path)
    with pytest.raises(ConfigError, match="method"):
        TrainingConfig.from_dict({"method": "ppo", "dataset": "d"})


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "missing.yaml")
    bad = tmp_path / "c.ini"
    bad.write_text("x=1")
    with pytest.raises(ConfigError, match="unknown format"):
        load_config_file(bad)


def test_method_aliases_and_report_to_string() -> None:
    cfg = TrainingConfig.from_dict({"method": "offline_grpo", "dataset": "d", "report_to": "tensorboard, wandb"})
    assert cfg.method == "grpo-offline"
    assert cfg.report_to == ["tensorboard", "wandb"]


def test_cpu_profile_is_small_fp32_and_uses_cpu() -> None:
    p = choose_profile(CPU)
    assert p.name == "cpu" and p.precision == "fp32" and p.use_cpu and not p.load_in_4bit
    assert not p.gradient_checkpointing
    assert (p.per_device_train_batch_size * p.gradient_accumulation_steps) % p.num_generations == 0


def test_gpu_profiles_pick_precision_qlora_and_generations() -> None:
    one = choose_profile(ONE_GPU)
    assert one.name == "single-gpu" and one.precision == "bf16" and one.load_in_4bit and one.gradient_checkpointing
    old = choose_profile(OLD_GPU)
    assert old.precision == "fp16" and not old.load_in_4bit and old.per_device_train_batch_size == 2
    many = choose_profile(FOUR_GPUS)
    assert many.name == "multi-gpu" and many.world_size == 4
    assert (many.per_device_train_batch_size * 4 * many.gradient_accumulation_steps) % many.num_generations == 0
    assert not choose_profile(ONE_GPU, lora=False).load_in_4bit
    fp16_only_with_bnb = HardwareInfo(
        accelerator="cuda", gpu_count=1, gpu_memory_gb=(15.0,), fp16=True, bitsandbytes=True
    )
    assert not choose_profile(fp16_only_with_bnb).load_in_4bit  # TRL keeps QLoRA adapters in bf16


def test_several_cpu_processes_split_the_one_process_batch() -> None:
    """`accelerate launch --multi_gpu --num_processes 2` without GPUs: DDP over gloo, profile `multi-cpu`, the
    batch of 4 split in 2 x 2 so a step is the same update as in one process; KTO and GRPO still fit."""
    two = HardwareInfo(accelerator="cpu", cpu_count=2, world_size=2)
    assert two.describe() == "CPU only (2 cores, 2 processes)" and CPU.describe() == "CPU only (2 cores)"
    p = choose_profile(two)
    assert (p.name, p.per_device_train_batch_size, p.world_size, p.precision) == ("multi-cpu", 2, 2, "fp32")
    assert any("2 processes" in n for n in p.notes)
    s = resolve_settings(TrainingConfig(method="kto", dataset=Path("d")), two)
    assert (s.world_size, s.effective_batch_size) == (2, 4) and s.to_dict()["effective_batch_size"] == 4
    g = resolve_settings(TrainingConfig(method="grpo", dataset=Path("d")), two)
    assert g.effective_batch_size % g.num_generations == 0
    eight = choose_profile(HardwareInfo(accelerator="cpu", cpu_count=16, world_size=8))
    assert eight.per_device_train_batch_size == 2  # never fewer than 2 rows per process
    assert resolve_settings(TrainingConfig(method="sft", dataset=Path("d")), CPU).effective_batch_size == 4


def test_several_visible_gpus_in_one_process_suggest_accelerate() -> None:
    hw = HardwareInfo(accelerator="cuda", gpu_count=2, gpu_memory_gb=(24.0, 24.0), bf16=True, fp16=True)
    assert any("accelerate launch" in n for n in choose_profile(hw).notes)


def test_settings_take_config_values_over_the_profile() -> None:
    cfg = TrainingConfig(
        method="sft",
        dataset=Path("d"),
        per_device_train_batch_size=3,
        precision="fp32",
        gradient_checkpointing=True,
        max_length=128,
    )
    s = resolve_settings(cfg, ONE_GPU)
    assert (s.per_device_train_batch_size, s.precision, s.gradient_checkpointing, s.max_length) == (
        3,
        "fp32",
        True,
        128,
    )


def test_generations_must_divide_the_generation_batch() -> None:
    # only generations given: the batch is raised to fit
    s = resolve_settings(TrainingConfig(method="grpo", dataset=Path("d"), num_generations=3), CPU)
    assert (s.per_device_train_batch_size * s.gradient_accumulation_steps) % 3 == 0
    assert any("raised" in n for n in s.notes)
    # both given and incompatible: refused with the fix
    with pytest.raises(ConfigError, match="must divide"):
        resolve_settings(
            TrainingConfig(method="grpo", dataset=Path("d"), num_generations=3, per_device_train_batch_size=4), CPU
        )
    # the profile's own value adapts to a user batch size
    s = resolve_settings(TrainingConfig(method="grpo", dataset=Path("d"), per_device_train_batch_size=6), CPU)
    assert 6 % s.num_generations == 0 and s.num_generations >= 2


def test_hardware_the_run_cannot_use_is_refused() -> None:
    with pytest.raises(ConfigError, match="GPU"):
        resolve_settings(TrainingConfig(method="sft", dataset=Path("d"), precision="fp16"), CPU)
    with pytest.raises(ConfigError, match="bf16"):
        resolve_settings(TrainingConfig(method="sft", dataset=Path("d"), precision="bf16"), OLD_GPU)
    with pytest.raises(ConfigError, match="QLoRA"):
        resolve_settings(TrainingConfig(method="sft", dataset=Path("d"), load_in_4bit=True), CPU)
    with pytest.raises(ConfigError, match="LoRA"):
        resolve_settings(
            TrainingConfig(method="sft", dataset=Path("d"), load_in_4bit=True, lora={"enabled": False}), ONE_GPU
        )
    with pytest.raises(ConfigError, match="KTO"):
        resolve_settings(TrainingConfig(method="kto", dataset=Path("d"), per_device_train_batch_size=1), CPU)


def test_train_command_needs_method_and_dataset() -> None:
    from flowrl.cli import main

    assert main(["train", "--dataset", "x"]) == 2


def test_long_rows_keep_the_profiles_tokens_per_step_not_its_row_count() -> None:
    """A FlowAgent's rows are about 2,500 tokens; `flowrl improve --context 8192` trained them 4 at a time with
    activations kept (the profile's batch for 1,024-token rows) and was killed for memory at 22 GiB."""
    s = resolve_settings(TrainingConfig(method="sft", dataset=Path("d"), max_length=8192), CPU)
    assert (s.per_device_train_batch_size, s.gradient_accumulation_steps) == (1, 4)
    assert s.effective_batch_size == 4 and s.gradient_checkpointing is True
    assert any("max_length 8192" in n for n in s.notes)
    kto = resolve_settings(TrainingConfig(method="kto", dataset=Path("d"), max_length=8192), CPU)
    assert kto.per_device_train_batch_size == 2 and kto.effective_batch_size == 4  # KTO's KL needs 2 rows
    mid = resolve_settings(TrainingConfig(method="sft", dataset=Path("d"), max_length=2048), CPU)
    assert (mid.per_device_train_batch_size, mid.gradient_accumulation_steps) == (2, 2)
    asked = resolve_settings(
        TrainingConfig(method="sft", dataset=Path("d"), max_length=8192, per_device_train_batch_size=4), CPU
    )
    assert asked.per_device_train_batch_size == 4  # what the user set stays
    short = resolve_settings(TrainingConfig(method="sft", dataset=Path("d"), max_length=512), CPU)
    assert (short.per_device_train_batch_size, short.gradient_checkpointing) == (4, False)
