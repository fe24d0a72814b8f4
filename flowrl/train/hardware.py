"""What the machine has, and the training profile that fits it.

`detect_hardware()` looks at torch (CUDA, MPS), bitsandbytes and the process count set by
`accelerate launch` / `torchrun` (`WORLD_SIZE`). `choose_profile()` turns that into batch size,
gradient accumulation, generations per prompt, precision, lengths, gradient checkpointing and QLoRA:

| profile | when | batch/device | accumulation | generations | precision | checkpointing |
|---|---|---|---|---|---|---|
| `cpu` | no GPU | 4 | 1 | 4 | fp32 | off |
| `multi-cpu` | no GPU, several processes (DDP over gloo) | 4 / processes, 2 at least | 1 | 4 | fp32 | off |
| `single-gpu` | one process on a GPU | 2 to 8 by memory | 4 | 8 | bf16, else fp16 | on |
| `multi-gpu` | several processes (`accelerate launch`) | 2 to 8 by memory | 2 | 8 | bf16, else fp16 | on |

QLoRA (4-bit base) is on by default on GPUs with bf16 when bitsandbytes is installed.

Any value set in `TrainingConfig` wins over the profile. `effective_batch_size` fixes the rows per optimizer step on
every machine: the profile's batch (or a smaller divisor) per device, accumulation making up the rest.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

from flowrl.errors import ConfigError, require
from flowrl.methods import get_method

log = logging.getLogger(__name__)

ProfileName = Literal["cpu", "multi-cpu", "single-gpu", "multi-gpu"]


@dataclass(frozen=True)
class HardwareInfo:
    accelerator: Literal["cpu", "cuda", "mps"]
    gpu_count: int = 0
    gpu_names: tuple[str, ...] = ()
    gpu_memory_gb: tuple[float, ...] = ()
    bf16: bool = False
    fp16: bool = False
    bitsandbytes: bool = False
    cpu_count: int = 1
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        procs = f", {self.world_size} processes" if self.world_size > 1 else ""
        if self.accelerator == "cpu":
            return f"CPU only ({self.cpu_count} cores{procs})"
        if self.accelerator == "mps":
            return f"Apple MPS{procs}"
        names = ", ".join(sorted(set(self.gpu_names))) or "GPU"
        mem = f", {min(self.gpu_memory_gb):.0f} GiB each" if self.gpu_memory_gb else ""
        return f"{self.gpu_count} x {names}{mem}{procs}"


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """The training defaults for a kind of machine (`choose_profile`)."""

    name: ProfileName
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    num_generations: int
    precision: Literal["fp32", "bf16", "fp16"]
    gradient_checkpointing: bool
    use_cpu: bool
    load_in_4bit: bool
    max_length: int
    max_completion_length: int
    world_size: int = 1
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def process_rank() -> int:
    """This process's rank under `accelerate launch` / `torchrun` (their `RANK`), 0 when launched alone.

    Read from the environment, so the CLI can keep its console output to the first process before any
    process group exists (the trainer creates it later)."""
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """True in the one process that prints and writes the run's files (rank 0, or a run without a launcher)."""
    return process_rank() == 0


def detect_hardware() -> HardwareInfo:
    """Look at the machine this process runs on. Needs torch (the `train` extra)."""
    torch = require("torch")
    cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    bnb = importlib.util.find_spec("bitsandbytes") is not None
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names, mems = [], []
        for i in range(count):
            props = torch.cuda.get_device_properties(i)
            names.append(props.name)
            mems.append(round(props.total_memory / 2**30, 1))
        return HardwareInfo(
            accelerator="cuda",
            gpu_count=count,
            gpu_names=tuple(names),
            gpu_memory_gb=tuple(mems),
            bf16=bool(torch.cuda.is_bf16_supported()),
            fp16=True,
            bitsandbytes=bnb,
            cpu_count=cpu_count,
            world_size=world_size,
        )
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return HardwareInfo(accelerator="mps", cpu_count=cpu_count, world_size=world_size)
    return HardwareInfo(accelerator="cpu", cpu_count=cpu_count, world_size=world_size)


def _largest_divisor(total: int, at_most: int) -> int:
    """The largest d <= at_most with total % d == 0 and d >= 2 (GRPO needs two completions per group)."""
    for d in range(min(at_most, total), 1, -1):
        if total % d == 0:
            return d
    return 2


def choose_profile(hw: HardwareInfo, *, lora: bool = True) -> HardwareProfile:
    """The defaults for this machine. `lora` matters for QLoRA (4-bit loading is for adapters only)."""
    if hw.accelerator != "cuda":
        # CPU (and MPS, where mixed precision is unreliable): small and fp32. GRPO generates 4 completions of one
        # prompt per step; KTO gets the batch of more than one it needs for its KL estimate. Several processes
        # (DDP over gloo) split the one-process batch of 4 between them, so a step is the same update as in one
        # process (2 x 2 for two), with at least 2 rows per process.
        world = max(1, hw.world_size)
        cpu_notes: tuple[str, ...] = ()
        if world > 1:
            cpu_notes = (
                f"{world} processes on the CPU (DDP over gloo): batch {max(2, 4 // world)} per process, "
                f"{max(2, 4 // world) * world} per step",
            )
        return HardwareProfile(
            name="multi-cpu" if world > 1 else "cpu",
            per_device_train_batch_size=max(2, 4 // world),
            gradient_accumulation_steps=1,
            num_generations=4,
            precision="fp32",
            gradient_checkpointing=False,
            use_cpu=hw.accelerator == "cpu",
            load_in_4bit=False,
            max_length=1024,  # agent rows with tool schemas and a system prompt pass 512 tokens
            max_completion_length=96,
            world_size=world,
            notes=cpu_notes,
        )
    memory = min(hw.gpu_memory_gb) if hw.gpu_memory_gb else 16.0
    batch = 8 if memory >= 40 else 4 if memory >= 16 else 2
    multi = hw.world_size > 1
    accumulation = 2 if multi else 4
    notes = []
    if not multi and hw.gpu_count > 1:
        notes.append(
            f"{hw.gpu_count} GPUs are visible but this is one process: use `accelerate launch` to use them all"
        )
    return HardwareProfile(
        name="multi-gpu" if multi else "single-gpu",
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        num_generations=_largest_divisor(batch * hw.world_size * accumulation, 8),
        precision="bf16" if hw.bf16 else "fp16",
        gradient_checkpointing=True,
        use_cpu=False,
        # QLoRA by default only where bf16 works: TRL keeps QLoRA adapters in bf16 (QLoRA paper, §3)
        load_in_4bit=lora and hw.bitsandbytes and hw.bf16,
        max_length=2048 if memory >= 40 else 1024,
        max_completion_length=512 if memory >= 40 else 256,
        world_size=hw.world_size,
        notes=tuple(notes),
    )


@dataclass(frozen=True, kw_only=True)
class RunSettings(HardwareProfile):
    """The profile with the config's own values laid over it: what the run really uses. `name` is the profile's
    (`profile` in `to_dict`, as flowrl_train.json writes it)."""

    @property
    def profile(self) -> ProfileName:
        return self.name

    @property
    def effective_batch_size(self) -> int:
        """Rows per optimizer step over every process: batch per device x processes x accumulation."""
        return self.per_device_train_batch_size * self.world_size * self.gradient_accumulation_steps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"profile": data.pop("name"), **data, "effective_batch_size": self.effective_batch_size}


def _fit_long_rows(
    config: Any, prof: HardwareProfile, max_length: int, chosen: tuple[int, int, bool], smallest: int, notes: list[str]
) -> tuple[int, int, bool]:
    """(batch, accumulation, checkpointing) for rows longer than the profile's. The profile's batch was sized for
    rows of `prof.max_length` tokens: keep its tokens per micro-batch (and its update: accumulation makes up the
    rows) and recompute activations, or long agent rows (a FlowAgent's are about 2,500 tokens) take the machine's
    memory (4 x 2,500 tokens on SmolLM2 in fp32: over 22 GiB)."""
    batch, accumulation, checkpointing = chosen
    micro = max(smallest, batch * prof.max_length // max_length)
    if micro < batch:
        steps = -(-batch // micro)
        if config.effective_batch_size is None:  # else the split of the effective batch says what it chose
            notes.append(
                f"max_length {max_length} > {prof.max_length}: batch {batch} -> {micro} per step with "
                f"{accumulation * steps} accumulation steps (about the same update, less memory)"
            )
        batch, accumulation = micro, accumulation * steps
    if config.gradient_checkpointing is None and not checkpointing:
        checkpointing = True
        notes.append(f"max_length {max_length} > {prof.max_length}: activation checkpointing on (memory)")
    return batch, accumulation, checkpointing


def resolve_settings(config: Any, hw: HardwareInfo, profile: HardwareProfile | None = None) -> RunSettings:
    """Lay a `TrainingConfig` over the profile for `hw`, checking what TRL would refuse later."""
    prof = profile or choose_profile(hw, lora=config.lora.enabled)
    notes = list(prof.notes)
    batch = config.per_device_train_batch_size or prof.per_device_train_batch_size
    accumulation = config.gradient_accumulation_steps or prof.gradient_accumulation_steps
    world = max(1, hw.world_size)

    precision = prof.precision if config.precision == "auto" else config.precision
    if hw.accelerator == "cpu" and precision == "fp16":
        raise ConfigError("precision fp16 needs a GPU: use fp32 (or bf16) on CPU")
    if hw.accelerator == "cuda" and precision == "bf16" and not hw.bf16:
        raise ConfigError(f"this GPU ({hw.describe()}) has no bf16: use --precision fp16 or fp32")

    load_in_4bit = prof.load_in_4bit if config.load_in_4bit is None else config.load_in_4bit
    if load_in_4bit and not config.lora.enabled:
        raise ConfigError("4-bit loading (QLoRA) trains an adapter: it needs LoRA enabled")
    if load_in_4bit and not (hw.accelerator == "cuda" and hw.bitsandbytes):
        raise ConfigError(
            "4-bit loading (QLoRA) needs a CUDA GPU and bitsandbytes: `pip install bitsandbytes`, or drop it"
        )

    generations = config.num_generations or prof.num_generations
    spec = get_method(config.method)
    checkpointing = (
        prof.gradient_checkpointing if config.gradient_checkpointing is None else config.gradient_checkpointing
    )
    max_length = config.max_length or prof.max_length
    if max_length > prof.max_length and config.per_device_train_batch_size is None:
        batch, accumulation, checkpointing = _fit_long_rows(
            config, prof, max_length, (batch, accumulation, checkpointing), spec.encoding_spec.min_batch_rows, notes
        )
    if config.effective_batch_size is not None:
        batch, accumulation = _split_batch(config, batch, world, spec.encoding_spec.min_batch_rows)
        if batch < prof.per_device_train_batch_size and max_length > prof.max_length:
            notes.append(
                f"max_length {max_length} > {prof.max_length}: {batch} rows a device x {accumulation} accumulation "
                f"(effective batch {config.effective_batch_size}, less memory)"
            )
    if spec.is_grpo:
        if config.num_generations is None:
            generations = _largest_divisor(batch * world * accumulation, prof.num_generations)
        elif (batch * world * accumulation) % generations:
            if config.per_device_train_batch_size is not None:
                raise ConfigError(
                    f"num_generations {generations} must divide the generation batch "
                    f"(batch {batch} x {world} processes x accumulation {accumulation} = "
                    f"{batch * world * accumulation}): "
                    "change --batch-size or --num-generations"
                )
            batch = next(
                b for b in range(batch, batch * generations + 1) if (b * world * accumulation) % generations == 0
            )
            notes.append(f"batch size raised to {batch} so that groups of {generations} completions fit")
    if batch * world < spec.encoding_spec.min_batch_rows:
        raise ConfigError(
            f"{spec.name.upper()} needs a batch of at least {spec.encoding_spec.min_batch_rows} (its KL estimate "
            "uses the other rows): raise --batch-size"
        )

    return RunSettings(
        name=prof.name,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        num_generations=generations,
        precision=precision,
        gradient_checkpointing=checkpointing,
        use_cpu=prof.use_cpu,
        load_in_4bit=load_in_4bit,
        max_length=max_length,
        max_completion_length=config.max_completion_length or prof.max_completion_length,
        world_size=world,
        notes=tuple(notes),
    )


def _split_batch(config: Any, batch: int, world: int, smallest: int) -> tuple[int, int]:
    """(batch per device, accumulation) whose product with the processes is exactly `config.effective_batch_size`:
    the largest per-device batch up to `batch` (the profile's, or the config's own) that divides it, so a CPU and
    a GPU take the same optimizer steps over the same set and only the micro-batches differ."""
    total = config.effective_batch_size
    fix = "use a multiple of 4 (or of the process count x --batch-size)"
    if total % world:
        raise ConfigError(f"--effective-batch {total} does not split over {world} processes: {fix}")
    per_process = total // world
    if config.per_device_train_batch_size is not None:
        if per_process % batch:
            raise ConfigError(f"--effective-batch {total} is no multiple of --batch-size {batch} x {world}: {fix}")
        pairs = [(batch, per_process // batch)]
    else:
        pairs = [
            (d, per_process // d) for d in range(min(batch, per_process), smallest - 1, -1) if per_process % d == 0
        ]
    if not pairs:
        raise ConfigError(f"--effective-batch {total} has no batch of {smallest} to {batch} rows a device: {fix}")
    micro, accumulation = pairs[0]
    if config.gradient_accumulation_steps not in (None, accumulation):
        raise ConfigError(
            f"--effective-batch {total} with --grad-accum {config.gradient_accumulation_steps}: they disagree "
            f"({micro} rows x {world} processes x {config.gradient_accumulation_steps}); set one of them"
        )
    return micro, accumulation


ACCELERATE_CONFIGS = {"ddp": "ddp.yaml", "fsdp": "fsdp.yaml", "deepspeed-zero2": "deepspeed_zero2.yaml"}


def accelerate_config(kind: str = "ddp") -> str:
    """Path of an `accelerate launch --config_file` shipped with flowrl: `ddp`, `fsdp` or `deepspeed-zero2`."""
    from pathlib import Path

    name = ACCELERATE_CONFIGS.get(kind.lower().replace("_", "-"))
    if name is None:
        raise ConfigError(f"no accelerate config {kind!r}: use one of {', '.join(ACCELERATE_CONFIGS)}")
    return str(Path(__file__).parent / "accelerate_configs" / name)
