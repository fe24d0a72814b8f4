"""Training that starts from a LoRA adapter of the base model (`--init-adapter`), not from a fresh one.

A deployment's model is often already the base model plus an adapter. Improving it means training that adapter
further: a fresh adapter trained on a few hundred new runs starts from the base model and throws away what the
deployed adapter had learned. TRL builds the model and its LoRA from a `LoraConfig` as it always does;
`lora_shape` gives that config the adapter's own rank, alpha and modules, and `load_adapter_weights` then copies
the adapter's weights into the trainer's model before the first step (the optimizer is created by `train()`,
after this, so it sees the loaded values).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, require
from flowrl.train.config import LoraSettings, TrainingConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def lora_shape(config: TrainingConfig) -> tuple[TrainingConfig, str | None]:
    """`config` with the LoRA rank, alpha and target modules of `config.init_adapter`, and a note when they differ
    from what the config asked for (None when they match, or when there is no adapter to start from)."""
    folder = config.init_adapter
    if folder is None:
        return config, None
    path = Path(folder) / ADAPTER_CONFIG
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--init-adapter {folder}: cannot read {ADAPTER_CONFIG} ({exc}); pass a LoRA adapter's folder"
        ) from exc
    if not isinstance(saved, dict) or saved.get("peft_type") != "LORA":
        raise ConfigError(f"--init-adapter {folder}: {path} is not a LoRA adapter's config (peft_type LORA)")
    modules = saved.get("target_modules")
    shape = LoraSettings(
        r=int(saved.get("r", config.lora.r)),
        alpha=int(saved.get("lora_alpha", config.lora.alpha)),
        dropout=config.lora.dropout,
        target_modules=sorted(modules) if isinstance(modules, list) else (modules or config.lora.target_modules),
    )
    if (shape.r, shape.alpha) == (config.lora.r, config.lora.alpha):
        note = None
    else:
        note = (
            f"--init-adapter {folder}: rank {shape.r}, alpha {shape.alpha} (the adapter's own), "
            f"not the config's {config.lora.r}, {config.lora.alpha}"
        )
    return config.model_copy(update={"lora": shape}), note


def load_adapter_weights(model: Any, folder: Path) -> int:
    """Copy the LoRA weights saved in `folder` into `model` (a PEFT model with an adapter of the same shape);
    returns how many tensors were loaded. Refuses, naming the first one, an adapter whose tensors do not all
    find their place, or that leaves one of the model's LoRA tensors unloaded."""
    peft = require("peft")
    safetensors = require("safetensors.torch", extra="train")
    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ConfigError(f"--init-adapter {folder}: no {ADAPTER_WEIGHTS} there; pass a trained LoRA adapter's folder")
    weights = safetensors.load_file(str(path))
    result = peft.set_peft_model_state_dict(model, weights)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
    if unexpected or missing:
        first = (unexpected or missing)[0]
        raise ConfigError(
            f"--init-adapter {folder}: its weights do not fit this base model's LoRA "
            f"({len(unexpected)} unexpected, {len(missing)} missing, e.g. {first}); "
            "pass an adapter trained on this --base-model"
        )
    return len(weights)
