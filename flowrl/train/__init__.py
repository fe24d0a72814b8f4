"""Training: config, hardware profiles, thin adapters onto TRL (models: `flowrl.models`; eval: `flowrl.evaluate`).

Importing this package is light (pydantic only); torch, transformers, TRL and PEFT load when a run starts.
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "TrainingConfig": "flowrl.train.config",
    "LoraSettings": "flowrl.train.config",
    "detect_hardware": "flowrl.train.hardware",
    "choose_profile": "flowrl.train.hardware",
    "resolve_settings": "flowrl.train.hardware",
    "HardwareInfo": "flowrl.train.hardware",
    "accelerate_config": "flowrl.train.hardware",
    "resolve_model": "flowrl.models",
    "ensure_default_model": "flowrl.models",
    "RLTrainer": "flowrl.train.pipeline",
    "TrainingPipeline": "flowrl.train.pipeline",
    "TrainResult": "flowrl.train.pipeline",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
