"""Each method trains for two steps on a tiny random model; the adapter saves, loads and changes the outputs;
resume continues the step count; Ctrl-C saves; the metrics log and the card are written."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from helpers_tiny_train import build_tiny_model, write_tiny_dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

from flowrl.errors import ConfigError  # noqa: E402
from flowrl.models import ResolvedModel, load_for_inference  # noqa: E402
from flowrl.train import TrainingConfig, TrainingPipeline  # noqa: E402
from flowrl.train.hardware import HardwareInfo  # noqa: E402

CPU = HardwareInfo(accelerator="cpu", cpu_count=2)
METHODS = ["grpo", "grpo-offline", "kto", "sft", "dpo"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def length_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """A reward with spread inside every group, so GRPO has advantages to learn from."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [min(1.0, len(t) / 40) for t in texts]


def config(method: str, tiny: Path, tmp_path: Path, **kw: Any) -> TrainingConfig:
    data = tmp_path / f"data-{method}"
    if not data.exists():
        write_tiny_dataset(data, method)
    base = dict(
        method=method,
        dataset=data,
        base_model=str(tiny),
        output_dir=tmp_path / f"out-{method}",
        max_steps=2,
        learning_rate=5e-3,
        max_completion_length=12,
        max_length=128,
        progress_bar=False,
        save_steps=50,
    )
    if method == "grpo-offline":  # replays whole logged trajectories: the completion length comes from the data
        base.pop("max_completion_length")
    if method == "grpo":  # a random model never writes its end-of-turn token: keep its truncated completions
        base["trl_args"] = {"mask_truncated_completions": False}
    base.update(kw)
    return TrainingConfig(**base)


def run(cfg: TrainingConfig, **kw: Any):
    funcs = [length_reward] if cfg.method == "grpo" else None
    return TrainingPipeline(cfg, hardware=CPU, reward_funcs=funcs, **kw).run()


def logits(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer("What is the capital of France?", return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


@pytest.mark.parametrize("method", METHODS)
def test_each_method_trains_two_steps_and_the_adapter_changes_outputs(method: str, tiny: Path, tmp_path: Path) -> None:
    result = run(config(method, tiny, tmp_path))
    out = result.output_dir
    assert result.global_step == 2 and not result.interrupted
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert (out / "tokenizer_config.json").is_file()
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()

    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    trained, _ = load_for_inference(ResolvedModel(spec=str(out), path=str(tiny), adapter=str(out)), device="cpu")
    assert not torch.allclose(logits(base, tokenizer), logits(trained, tokenizer), atol=1e-6)
    if method in ("kto", "sft", "dpo", "grpo-offline"):  # conversational rows: tokenized by flowrl, masks included
        assert result.info["encoding"]["sequence_sources"] == {
            "template": 8 if method != "grpo-offline" else 16
        }  # 4 groups of 4 there

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if not r.get("summary")]
    assert [r["step"] for r in steps] == [1, 2]
    assert rows[-1].get("summary") is True
    for r in steps:
        assert {"loss", "learning_rate", "grad_norm", "trl"} <= set(r)
    if method.startswith("grpo"):
        assert {"reward_mean", "reward_std", "tokens_per_s"} <= set(steps[-1])
        assert "kl" not in steps[-1]  # beta 0 by default: no reference pass, so no KL to log

    card = (out / "README.md").read_text()
    assert method.upper() in card and "flowrl 0." in card and "| step |" in card
    record = json.loads((out / "flowrl_train.json").read_text())
    assert record["config"]["method"] == method and record["result"]["global_step"] == 2


def test_resume_continues_the_step_count(tiny: Path, tmp_path: Path) -> None:
    first = run(config("sft", tiny, tmp_path, max_steps=2))
    assert first.global_step == 2
    with pytest.raises(ConfigError, match="--resume"):
        run(config("sft", tiny, tmp_path, max_steps=4))
    second = run(config("sft", tiny, tmp_path, max_steps=4, resume=True))
    assert (second.start_step, second.global_step) == (2, 4)
    rows = [json.loads(line) for line in (second.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if not r.get("summary")] == [1, 2, 3, 4]
    assert "resumed from step 2" in (second.output_dir / "README.md").read_text()


def test_resume_without_a_checkpoint_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint"):
        run(config("sft", tiny, tmp_path, resume=True))


def test_overwrite_starts_over(tiny: Path, tmp_path: Path) -> None:
    run(config("sft", tiny, tmp_path, max_steps=2))
    again = run(config("sft", tiny, tmp_path, max_steps=1, overwrite=True))
    assert again.global_step == 1 and not (again.output_dir / "checkpoint-2").exists()


class _CtrlCAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_saves_a_checkpoint_and_resume_goes_on(tiny: Path, tmp_path: Path) -> None:
    cfg = config("sft", tiny, tmp_path, max_steps=6)
    before = signal.getsignal(signal.SIGINT)
    result = TrainingPipeline(cfg, hardware=CPU, callbacks=[_CtrlCAtStep(1)]).run()
    assert result.interrupted and result.global_step < 6
    assert (result.output_dir / f"checkpoint-{result.global_step}").is_dir()
    assert (result.output_dir / "adapter_model.safetensors").is_file()
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    resumed = run(config("sft", tiny, tmp_path, max_steps=6, resume=True))
    assert (resumed.start_step, resumed.global_step) == (result.global_step, 6)


def test_merge_writes_one_model_equal_to_base_plus_adapter(tiny: Path, tmp_path: Path) -> None:
    result = run(config("sft", tiny, tmp_path, merge=True))
    assert result.merged_dir is not None and (result.merged_dir / "config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(result.merged_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(result.merged_dir)
    out = result.output_dir
    with_adapter, _ = load_for_inference(ResolvedModel(spec=str(out), path=str(tiny), adapter=str(out)), device="cpu")
    assert torch.allclose(logits(merged, tokenizer), logits(with_adapter, tokenizer), atol=1e-4)


def test_trl_args_reach_trl_and_unknown_ones_are_refused(tiny: Path, tmp_path: Path) -> None:
    from flowrl.train.hardware import resolve_settings
    from flowrl.train.trainers import trl_config

    cfg = config("dpo", tiny, tmp_path, trl_args={"loss_type": ["ipo"]})
    args = trl_config(cfg, resolve_settings(cfg, CPU), tmp_path / "o")
    assert args.loss_type == ["ipo"] and args.use_cpu and not args.bf16 and not args.fp16
    assert args.per_device_train_batch_size == 4 and args.max_length == 128
    bad = config("dpo", tiny, tmp_path, trl_args={"no_such_knob": 1})
    with pytest.raises(ConfigError, match="no_such_knob"):
        trl_config(bad, resolve_settings(bad, CPU), tmp_path / "o")


def test_grpo_config_uses_the_generation_settings(tiny: Path, tmp_path: Path) -> None:
    from flowrl.train.hardware import resolve_settings
    from flowrl.train.trainers import trl_config

    cfg = config("grpo", tiny, tmp_path, num_generations=2, beta=0.0)
    args = trl_config(cfg, resolve_settings(cfg, CPU), tmp_path / "o", reward_weights=[1.0])
    assert args.num_generations == 2 and args.max_completion_length == 12 and args.beta == 0.0
    assert args.generation_batch_size % 2 == 0 and not args.use_vllm


def test_dataset_built_for_another_method_is_refused(tiny: Path, tmp_path: Path) -> None:
    data = write_tiny_dataset(tmp_path / "kto-data", "kto")
    cfg = TrainingConfig(method="dpo", dataset=data, base_model=str(tiny), output_dir=tmp_path / "o")
    with pytest.raises(ConfigError, match="built for kto"):
        TrainingPipeline(cfg, hardware=CPU).run()


def test_gpu_settings_reach_trl_as_bf16_checkpointing_and_qlora(tmp_path: Path) -> None:
    """The GPU path, checked without a GPU: what TRL's config and the 4-bit loader would get."""
    from flowrl.train.hardware import resolve_settings
    from flowrl.train.trainers import lora_config, quantization_config, trl_config_kwargs

    gpu = HardwareInfo(accelerator="cuda", gpu_count=1, gpu_memory_gb=(80.0,), bf16=True, fp16=True, bitsandbytes=True)
    cfg = TrainingConfig(method="grpo", dataset=tmp_path)
    settings = resolve_settings(cfg, gpu)
    kw = trl_config_kwargs(cfg, settings, tmp_path)
    assert kw["bf16"] and not kw["fp16"] and not kw["use_cpu"]
    assert kw["activation_checkpointing"] and kw["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    assert kw["model_init_kwargs"] == {"dtype": "bfloat16"}
    assert (kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"]) % kw["num_generations"] == 0
    q = quantization_config(settings)
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant
    assert q.bnb_4bit_compute_dtype == torch.bfloat16
    lora = lora_config(cfg)
    assert (lora.r, lora.lora_alpha, lora.target_modules, lora.task_type) == (16, 32, "all-linear", "CAUSAL_LM")

    old = HardwareInfo(accelerator="cuda", gpu_count=1, gpu_memory_gb=(15.0,), fp16=True)
    kw = trl_config_kwargs(cfg, resolve_settings(cfg, old), tmp_path)
    assert (
        kw["fp16"] and not kw["bf16"] and kw["model_init_kwargs"] == {"dtype": "float32"}
    )  # fp32 weights, fp16 autocast
