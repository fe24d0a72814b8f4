"""`TrainingConfig`: what one training run should do, from a file (YAML, TOML, JSON) or from flags.

Every knob a hardware profile can choose (batch size, accumulation, generations per prompt, precision,
lengths, gradient checkpointing, QLoRA) is optional here: `None` means "let the profile pick" and any
value set in the file or on the command line wins. Anything TRL has that flowrl does not name goes
through `trl_args`, which is applied last onto TRL's own config class.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flowrl.errors import ConfigError
from flowrl.flags import flag
from flowrl.methods import METHODS, canonical_method, get_method

Precision = Literal["auto", "fp32", "bf16", "fp16"]
DEFAULT_BASE_MODEL = "smollm2-135m"
# a small model sampled at 1.0 rambles past its turn (SmolLM2: 3 of 4 replies cut at 64 tokens); flowrl improve uses 0.7
AGENT_TEMPERATURE = 0.7


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Strict):
    """PEFT LoRA. `enabled: false` trains every weight instead (full fine-tuning)."""

    enabled: bool = True
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: str | list[str] = "all-linear"


class TrainingConfig(_Strict):
    """One training run. Paths are kept as given; `None` fields are filled from the hardware profile."""

    method: str = flag(..., "--method -m", "grpo, grpo-offline, kto, sft or dpo.")  # a name in flowrl.methods
    dataset: Path | None = flag(None, "--dataset -d", "Dataset folder from `flowrl build-dataset` (or a JSONL file).")
    base_model: str = flag(
        DEFAULT_BASE_MODEL,
        "--base-model",
        "Model to start from: smollm2-135m (default, embedded), a local folder or a Hugging Face id.",
    )
    output_dir: Path | None = flag(
        None, "--output-dir -o", "Where adapter, checkpoints, metrics and card go (default out/train-METHOD)."
    )
    init_adapter: Path | None = flag(
        None,
        "--init-adapter",
        "A LoRA adapter of the base model to start from: training goes on from its weights (its rank, alpha and "
        "modules), so the result is that model improved, not a new adapter beside it.",
    )

    # length of the run and checkpoints
    max_steps: int = flag(-1, "--max-steps", "Stop after this many optimizer steps (default: one epoch).")
    num_train_epochs: float = flag(1.0, "--epochs", "Epochs over the dataset when --max-steps is not set.")
    save_steps: int = flag(50, "--save-steps", "Save a checkpoint every N steps (default 50).", ge=1)
    save_total_limit: int | None = 3
    logging_steps: int = Field(1, ge=1)
    resume: bool | Path = False
    overwrite: bool = flag(False, "--overwrite/--no-overwrite", "Start over in an --output-dir that holds a run.")
    seed: int = flag(42, "--seed", "Random seed (default 42).")

    # optimisation
    learning_rate: float | None = flag(None, "--lr", "Learning rate (default by method, for LoRA).")
    warmup_steps: int = 0
    lr_scheduler_type: str = "linear"
    beta: float | None = flag(None, "--beta", "KL coefficient (GRPO default 0, no reference pass; DPO/KTO 0.1).")

    # chosen by the hardware profile unless set
    per_device_train_batch_size: int | None = flag(
        None, "--batch-size", "Per-device batch size (default: hardware profile).", ge=1
    )
    gradient_accumulation_steps: int | None = flag(
        None, "--grad-accum", "Gradient accumulation steps (default: hardware profile).", ge=1
    )
    effective_batch_size: int | None = flag(
        None,
        "--effective-batch",
        "Rows per optimizer step on any machine: the profile splits it into batch x accumulation, so a CPU and a "
        "GPU take the same steps (default: the profile's batch x accumulation).",
        ge=1,
    )
    num_generations: int | None = flag(
        None, "--num-generations", "GRPO completions per prompt (default: hardware profile).", ge=2
    )
    precision: Precision = flag(
        "auto", "--precision", "auto, fp32, bf16 or fp16 (auto: bf16/fp16 on GPU, fp32 on CPU)."
    )
    gradient_checkpointing: bool | None = flag(
        None, "--gradient-checkpointing/--no-gradient-checkpointing", "Default: on for GPUs, off on CPU."
    )
    load_in_4bit: bool | None = flag(
        None, "--4bit/--no-4bit", "QLoRA: load the base in 4 bits (default: when a GPU and bitsandbytes are there)."
    )
    max_length: int | None = flag(
        None,
        "--max-length",
        "Max tokens per example for SFT, DPO and KTO; for GRPO the longest prompt and completion, which sizes the "
        "micro-batch (the profile's tokens a micro-batch kept).",
        ge=8,
    )
    max_completion_length: int | None = flag(None, "--max-completion-length", "Max tokens per GRPO completion.", ge=1)

    # GRPO online: flowrl's rewards (all of the engine's by default), from a reward config file if given
    reward_config: Path | None = flag(None, "--reward-config", "GRPO: the reward engine's TOML/YAML config.")
    rewards: list[str] | None = flag(
        None, "--rewards", "GRPO: comma-separated flowrl rewards to train on (default: the engine's)."
    )
    reward_weights: list[float] | None = None
    temperature: float | None = flag(
        None, "--temperature", "GRPO sampling temperature (default 1.0; 0.7 with --agent).", gt=0
    )

    # GRPO through the agent's own loop (flowrl.train.agent_rollout): `example` or `module:function`
    agent: str | None = flag(
        None,
        "--agent",
        "GRPO through an agent's own loop, tools executed: `example` or module:function returning an AgentAdapter.",
    )
    store: Path | None = flag(
        None,
        "--store",
        "With --agent: trace store every rollout is written to (source train; default OUTPUT/rollouts).",
    )
    turn_tokens: int | None = flag(None, "--turn-tokens", "With --agent: new tokens per model turn (default 96).", ge=1)
    max_turns: int | None = flag(
        6,
        "--max-turns",
        "With --agent: model turns per episode (default 6); --max-completion-length bounds its tokens (default 512).",
        ge=1,
    )
    drop_zero_std_groups: bool = flag(
        True,
        "--drop-zero-std/--keep-zero-std",
        "With --agent: groups whose rewards are all equal get no loss (default) or keep their KL term.",
    )

    # GRPO generation with vLLM on a GPU (TRL's options: use_vllm, vllm_mode, vllm_gpu_memory_utilization)
    use_vllm: bool = flag(
        False, "--use-vllm/--no-vllm", "GRPO: generate with vLLM on the GPU (TRL's use_vllm; needs `pip install vllm`)."
    )
    vllm_mode: Literal["colocate", "server"] = flag(
        "colocate",
        "--vllm-mode",
        "With --use-vllm: colocate (default; the only mode with --agent) or server (`trl vllm-serve`).",
    )
    vllm_gpu_memory_utilization: float | None = flag(
        None,
        "--vllm-gpu-memory-utilization",
        "With --use-vllm colocate: share of GPU memory vLLM takes (TRL's default 0.3).",
        gt=0,
        le=1,
    )

    # KTO: None reads the weights flowrl's dataset builder wrote into flowrl_dataset.json
    desirable_weight: float | None = None
    undesirable_weight: float | None = None

    # SFT: loss on assistant turns only (needs a template with generation markers; flowrl's default model has one)
    assistant_only_loss: bool | None = None

    lora: LoraSettings = Field(default_factory=LoraSettings)
    merge: bool = flag(False, "--merge/--no-merge", "Also save base + adapter merged into OUTPUT/merged.")
    report_to: list[str] = flag([], "--report-to", "tensorboard, wandb, trackio (comma-separated).")
    progress_bar: bool = flag(True, "--progress/--no-progress", "Show the progress bar.")
    trl_args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("report_to", mode="before")
    @classmethod
    def _split_report_to(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"]
        return value

    @field_validator("rewards", mode="before")
    @classmethod
    def _split_rewards(cls, value: Any) -> Any:
        if isinstance(value, str):  # `--rewards a,b`
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _method_alias(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = canonical_method(value)
            if value not in METHODS:
                raise ValueError(f"unknown method {value!r}: use one of {', '.join(METHODS)}")
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainingConfig:
        if (
            self.reward_weights is not None
            and self.rewards is not None
            and len(self.reward_weights) != len(self.rewards)
        ):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} values for {len(self.rewards)} rewards")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError("max_steps must be a positive number of steps (or -1: run num_train_epochs)")
        if self.agent is not None and not get_method(self.method).online:
            raise ValueError(f"agent: rollouts through an agent are for --method grpo, not {self.method}")
        if self.use_vllm and self.agent is not None and self.vllm_mode != "colocate":
            raise ValueError(
                "vllm_mode: rollouts through an agent generate with colocated vLLM only "
                "(--vllm-mode colocate); server mode gathers prompts across ranks per call"
            )
        if self.use_vllm and not get_method(self.method).is_grpo:
            raise ValueError(f"use_vllm: vLLM generates GRPO completions; {self.method} does not generate")
        if self.dataset is None and self.agent is None:
            raise ValueError("dataset: give a dataset (or, for --method grpo, an agent whose tasks to train on)")
        if self.init_adapter is not None and not self.lora.enabled:
            raise ValueError("init_adapter: a LoRA adapter to start from needs lora.enabled (full training has none)")
        return self

    @property
    def resolved_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return AGENT_TEMPERATURE if self.agent is not None else 1.0

    @property
    def resolved_store(self) -> Path:
        """Where online rollouts through the agent are written."""
        return self.store if self.store is not None else self.resolved_output_dir / "rollouts"

    # ------------------------------------------------------------------ derived values

    @property
    def resolved_output_dir(self) -> Path:
        return self.output_dir if self.output_dir is not None else Path("out") / f"train-{self.method}"

    @property
    def resolved_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        rate = get_method(self.method).learning_rate
        return rate if self.lora.enabled else rate / 10

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_file(cls, path: Path | str, **overrides: Any) -> TrainingConfig:
        """Read a YAML, TOML or JSON file; `overrides` (flags) that are not None win over the file."""
        return cls.from_dict(load_config_file(path), **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> TrainingConfig:
        merged = dict(data)
        for key, value in overrides.items():
            if value is None:
                continue
            if key == "lora" and isinstance(value, dict):
                merged["lora"] = {**(merged.get("lora") or {}), **value}
            elif key == "trl_args" and isinstance(value, dict):
                merged["trl_args"] = {**(merged.get("trl_args") or {}), **value}
            else:
                merged[key] = value
        try:
            return cls.model_validate(merged)
        except ValidationError as exc:
            raise ConfigError(f"invalid training config: {_one_line(exc)}") from exc

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load_config_file(path: Path | str) -> dict[str, Any]:
    """A training config file as a dict. The format is chosen by the suffix (.yaml/.yml, .toml, .json)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist: pass --config with a YAML, TOML or JSON file")
    text = p.read_text(encoding="utf-8")
    suffix = p.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {p}: unknown format {suffix!r}; use .yaml, .toml or .json")
    except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {p} cannot be parsed: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of option names to values")
    # `train:` as the top-level key is accepted too, so one file can hold several sections
    if set(data) == {"train"} and isinstance(data["train"], dict):
        data = data["train"]
    return {k.replace("-", "_"): v for k, v in data.items()}


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)
