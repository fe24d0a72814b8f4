"""A round's training budget depends on the size of its set, not on the machine (issue 37: 3 epochs over 9 runs
were 9 optimizer steps on a CPU and about 1 on a GPU; 175 runs trained about 130 steps)."""

from __future__ import annotations

import pytest

from flowrl.errors import ConfigError
from flowrl.improve.budget import MAX_STEPS, round_budget
from flowrl.train.config import TrainingConfig
from flowrl.train.hardware import HardwareInfo, resolve_settings

CPU = HardwareInfo("cpu", cpu_count=2)
GPU = HardwareInfo("cuda", gpu_count=1, gpu_names=("H100",), gpu_memory_gb=(80.0,), bf16=True, fp16=True)
SMALL_GPU = HardwareInfo("cuda", gpu_count=1, gpu_names=("T4",), gpu_memory_gb=(15.0,), fp16=True)


@pytest.mark.parametrize("rows", [1, 7, 9, 40, 64, 175, 300, 1000])
@pytest.mark.parametrize("method", ["sft", "kto"])
def test_a_cpu_and_a_gpu_take_the_same_steps_of_the_same_rows_for_the_same_set(rows: int, method: str) -> None:
    budget = round_budget(rows, epochs=2.0)
    config = TrainingConfig(method=method, dataset="set", effective_batch_size=budget.effective_batch)
    settings = [resolve_settings(config, hw) for hw in (CPU, GPU, SMALL_GPU)]
    assert {s.effective_batch_size for s in settings} == {budget.effective_batch}
    # the profiles still pick their own micro-batches
    assert settings[0].per_device_train_batch_size <= 4 < settings[1].per_device_train_batch_size or rows < 64


def test_the_profiles_batch_used_to_decide_the_steps() -> None:
    """Before: the same set gave 4 rows a step on the CPU and 32 on this GPU."""
    config = TrainingConfig(method="sft", dataset="set")
    assert resolve_settings(config, CPU).effective_batch_size == 4
    assert resolve_settings(config, GPU).effective_batch_size == 32


def test_a_large_set_trains_a_capped_number_of_steps_and_a_small_one_its_epochs() -> None:
    small, large, huge = round_budget(9, 2.0), round_budget(175, 2.0), round_budget(5000, 2.0)
    assert (small.effective_batch, small.steps, small.capped) == (4, 6, False)  # 3 steps an epoch
    assert (large.effective_batch, large.steps) == (20, 18)  # not 130
    assert huge.steps == MAX_STEPS and huge.capped and huge.effective_batch == 32
    assert round_budget(9, 2.0, max_steps=1).steps == 1 and round_budget(9, 2.0, max_steps=1).capped


def test_an_effective_batch_that_cannot_be_split_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="--effective-batch 6 is no multiple of --batch-size 4"):
        resolve_settings(
            TrainingConfig(method="sft", dataset="s", effective_batch_size=6, per_device_train_batch_size=4), CPU
        )
    with pytest.raises(ConfigError, match="disagree"):
        resolve_settings(
            TrainingConfig(method="sft", dataset="s", effective_batch_size=8, gradient_accumulation_steps=3), CPU
        )
    multi = HardwareInfo("cpu", cpu_count=4, world_size=3)
    with pytest.raises(ConfigError, match="does not split over 3 processes"):
        resolve_settings(TrainingConfig(method="sft", dataset="s", effective_batch_size=8), multi)


def test_a_grpo_round_of_long_agent_runs_trains_in_small_micro_batches_on_a_cpu() -> None:
    """A GRPO round of 4 groups of 8 agent runs of 1,500 tokens took 15 GB in micro-batches of 4 (killed for
    memory); the longest run now sizes the micro-batch, as for SFT, and the update stays 32 rows."""
    from flowrl.improve.budget import grpo_budget

    budget = grpo_budget(groups=12, group_size=8)
    assert (budget.effective_batch, budget.steps) == (32, 6)  # 3 batches of rollouts, 2 steps each
    config = TrainingConfig(
        method="grpo-offline", dataset="s", effective_batch_size=32, num_generations=8, max_length=1500
    )
    cpu = resolve_settings(config, CPU)
    assert (cpu.per_device_train_batch_size, cpu.gradient_accumulation_steps) == (2, 16)
    assert cpu.gradient_checkpointing and cpu.effective_batch_size == 32
    assert resolve_settings(config, GPU).effective_batch_size == 32


@pytest.mark.parametrize("groups", range(1, 101))
def test_a_grpo_round_trains_each_group_once_a_pass_without_filling_a_short_batch_with_repeats(groups: int) -> None:
    """5 kept groups were 2 batches of 4 (the second: 1 new group and 3 repeated), 4 steps of 32 rows: 128 runs
    trained for 40 sampled, 3.2 passes each, at about 14 s a run on 2 cores (issue 37's GRPO benchmark)."""
    from flowrl.improve.budget import GROUPS_PER_STEP, GRPO_ITERATIONS, grpo_budget

    budget = grpo_budget(groups=groups, group_size=8)
    per_step = budget.effective_batch // 8
    batches = budget.steps // GRPO_ITERATIONS
    assert budget.effective_batch % 8 == 0 and budget.steps % GRPO_ITERATIONS == 0
    assert budget.capped == (groups > 98)  # MAX_STEPS: 24 batches of rollouts
    if not budget.capped:
        assert batches * per_step >= groups  # every group is trained on
        assert batches * per_step - groups < batches  # at most one repeat a batch
    assert groups < GROUPS_PER_STEP or GROUPS_PER_STEP // 2 < per_step <= 2 * GROUPS_PER_STEP - 2
    if groups == 5:
        assert (budget.effective_batch, budget.steps) == (40, 2)  # one batch of 5 groups, 2 steps: 80 runs trained
