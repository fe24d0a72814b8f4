"""`--init-adapter`: training goes on from a LoRA adapter's weights (the deployed model improved), not from a fresh
adapter beside the base model, which would throw away what the deployed adapter had learned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from helpers_tiny_train import build_tiny_model, write_tiny_dataset  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from flowrl.errors import ConfigError  # noqa: E402
from flowrl.train import TrainingConfig, TrainingPipeline  # noqa: E402
from flowrl.train.hardware import HardwareInfo  # noqa: E402
from flowrl.train.warm_start import lora_shape  # noqa: E402

CPU = HardwareInfo(accelerator="cpu", cpu_count=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def train(tiny: Path, tmp_path: Path, name: str, **kw: object) -> Path:
    data = tmp_path / "data"
    if not data.exists():
        write_tiny_dataset(data, "sft")
    cfg = dict(method="sft", dataset=data, base_model=str(tiny), output_dir=tmp_path / name, max_steps=2,
               learning_rate=5e-3, max_length=128, progress_bar=False)  # fmt: skip
    cfg.update(kw)
    return TrainingPipeline(TrainingConfig(**cfg), hardware=CPU).run().output_dir


def lora_b(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(folder / "adapter_model.safetensors")).items() if "lora_B" in k}


def test_training_goes_on_from_the_adapter_weights(tiny: Path, tmp_path: Path) -> None:
    deployed = train(tiny, tmp_path, "deployed", lora={"r": 8, "alpha": 16})
    assert any(v.abs().sum() > 0 for v in lora_b(deployed).values())  # it learned something
    # a learning rate too small to move anything: what comes out is what went in
    went_on = train(tiny, tmp_path, "went-on", init_adapter=deployed, learning_rate=1e-12)
    fresh = train(tiny, tmp_path, "fresh", learning_rate=1e-12)
    before, after = lora_b(deployed), lora_b(went_on)
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.allclose(value, after[key], atol=1e-6), key
    # without --init-adapter a new adapter starts at zero (LoRA's B), i.e. at the base model
    assert all(v.abs().max() < 1e-6 for v in lora_b(fresh).values())
    # the adapter's own shape was used (rank 8, alpha 16), and the run record says where it started
    saved = json.loads((went_on / "adapter_config.json").read_text())
    assert (saved["r"], saved["lora_alpha"]) == (8, 16)
    record = json.loads((went_on / "flowrl_train.json").read_text())
    loaded = record["result"]["info"]["init_adapter"]["tensors"]
    assert loaded == len(load_file(str(deployed / "adapter_model.safetensors")))


def test_a_folder_that_is_no_adapter_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    cfg = TrainingConfig(method="sft", dataset=tmp_path / "data", init_adapter=tmp_path / "nothing-here")
    with pytest.raises(ConfigError, match="--init-adapter .*nothing-here.*adapter_config.json"):
        lora_shape(cfg)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "adapter_config.json").write_text('{"peft_type": "PREFIX_TUNING"}')
    with pytest.raises(ConfigError, match="not a LoRA adapter"):
        lora_shape(cfg.model_copy(update={"init_adapter": tmp_path / "other"}))
