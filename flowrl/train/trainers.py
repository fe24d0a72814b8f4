"""Thin adapters onto TRL: a `TrainingConfig` plus the machine's profile become TRL's own config and trainer.

flowrl writes no training loop. For each method it fills TRL's config class (`GRPOConfig`, `KTOConfig`,
`DPOConfig`, `SFTConfig`), a PEFT `LoraConfig` (rank 16, alpha 32, all linear layers by default), a
bitsandbytes 4-bit config for QLoRA where chosen, and hands the model path to TRL's trainer, which loads
it. `trl_args` in the config is applied last, onto TRL's config, for anything flowrl does not name.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import warnings
from pathlib import Path
from typing import Any

from flowrl.data.tokens import ChatRenderer
from flowrl.errors import ConfigError, require
from flowrl.methods import Encoding, get_method
from flowrl.train.agent_grpo import agent_grpo, agent_grpo_trainer
from flowrl.train.config import TrainingConfig
from flowrl.train.data_io import LoadedData
from flowrl.train.hardware import RunSettings
from flowrl.train.offline_grpo import OfflineGroups
from flowrl.train.pretokenized import pretokenized_trainer
from flowrl.train.reward_funcs import online_reward_funcs

log = logging.getLogger(__name__)

# GRPO's KL coefficient when the config does not set one: 0, as TRL's own default (no reference pass, a forward
# pass a step saved, no KL in the logs). It was 0.04 (DeepSeekMath's), and the mean KL it held the policy to was
# 0.0014 (bench_grpo_vs_sft, 2026-11-24): --beta brings it back
DEFAULT_GRPO_BETA = 0.0
# DeepSeek-V3.2's off-policy sequence mask (TRL's suggested 0.5): used when logged sampling logprobs exist
OFF_POLICY_MASK_THRESHOLD = 0.5
REPORTERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}


def trl_classes(method: str) -> tuple[type, type]:
    """TRL's config and trainer classes of a method in the method table (`flowrl.methods`)."""
    return get_method(method).trl_classes()


def _is_grpo(method: str) -> bool:
    return get_method(method).is_grpo


def _encoding(method: str) -> Encoding:
    return get_method(method).encoding_spec


def lora_config(config: TrainingConfig) -> Any | None:
    if not config.lora.enabled:
        return None
    peft = require("peft")
    return peft.LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def quantization_config(settings: RunSettings) -> Any | None:
    """4-bit NF4 with double quantization, computing in the run's precision (QLoRA)."""
    if not settings.load_in_4bit:
        return None
    torch = require("torch")
    transformers = require("transformers")
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.precision, torch.float32)
    extra = {}
    if compute is not torch.float32:
        extra["bnb_4bit_quant_storage"] = compute  # what FSDP needs to shard 4-bit weights; harmless on one GPU
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
        **extra,
    )


def model_dtype(settings: RunSettings) -> str:
    """Weights load in bf16 for bf16 runs (and QLoRA's compute dtype); fp16 runs keep fp32 weights under autocast."""
    if settings.precision == "bf16":
        return "bfloat16"
    if settings.load_in_4bit and settings.precision == "fp16":
        return "float16"
    return "float32"


def check_reporters(report_to: list[str]) -> None:
    for name in report_to:
        module = REPORTERS.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError(f"--report-to {name} needs the {module} package: `pip install {module}`")


def check_vllm(config: TrainingConfig, settings: RunSettings) -> None:
    """`--use-vllm` needs a GPU and the vllm package: say so before TRL loads anything."""
    if not config.use_vllm:
        return
    if settings.use_cpu:
        raise ConfigError("--use-vllm needs a CUDA GPU: drop it on this machine (generation then runs in transformers)")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("--use-vllm needs the vllm package: `pip install vllm` (a version TRL supports)")


def trl_config(config: TrainingConfig, settings: RunSettings, output_dir: Path, **decided: Any) -> Any:
    """TRL's config object for `config.method`, filled from the config and the resolved settings."""
    config_cls, _ = trl_classes(config.method)
    check_reporters(config.report_to)
    check_vllm(config, settings)
    kwargs = trl_config_kwargs(config, settings, output_dir, **decided)
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(config.trl_args) - names)
    if unknown:
        raise ConfigError(f"trl_args: {config_cls.__name__} has no option {', '.join(unknown)}")
    kwargs.update(config.trl_args)
    try:
        return config_cls(**kwargs)
    except ValueError as exc:  # TRL's own checks (batch sizes, generations) explain themselves
        raise ConfigError(f"{config_cls.__name__}: {exc}") from exc


def trl_config_kwargs(
    config: TrainingConfig,
    settings: RunSettings,
    output_dir: Path,
    *,
    desirable_weight: float | None = None,
    undesirable_weight: float | None = None,
    assistant_only_loss: bool = False,
    reward_weights: list[float] | None = None,
    off_policy_mask_threshold: float | None = None,
) -> dict[str, Any]:
    """The keyword arguments of TRL's config class (before `trl_args`); no TRL import, so testable anywhere."""
    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=config.max_steps,
        num_train_epochs=config.num_train_epochs,
        per_device_train_batch_size=settings.per_device_train_batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=config.resolved_learning_rate,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type=config.lr_scheduler_type,
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        seed=config.seed,
        report_to=list(config.report_to) or "none",
        disable_tqdm=not config.progress_bar,
        bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16",
        use_cpu=settings.use_cpu,
        activation_checkpointing=settings.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if settings.gradient_checkpointing else None,
        dataloader_pin_memory=not settings.use_cpu,
        model_init_kwargs={"dtype": model_dtype(settings)},
    )
    if settings.world_size > 1:
        # Several processes (DDP). A LoRA or full fine-tune of a causal LM uses every trainable weight in each
        # forward pass, so DDP need not search the graph for unused ones; transformers asks it to whenever
        # gradient checkpointing is off (the CPU profile), which costs an extra traversal per step and prints a
        # warning from every process. The other processes log only errors (the first one logs for the run).
        kwargs.update(ddp_find_unused_parameters=False, log_level_replica="error")
    method = config.method
    encoding = _encoding(method)
    if _is_grpo(method):
        kwargs.update(
            num_generations=settings.num_generations,
            max_completion_length=settings.max_completion_length,
            temperature=config.resolved_temperature,
            beta=DEFAULT_GRPO_BETA if config.beta is None else config.beta,
            use_vllm=config.use_vllm,
            log_completions=False,
            mask_truncated_completions=True,  # a completion cut off before its end-of-turn token gets no loss
        )
        if config.use_vllm:
            kwargs["vllm_mode"] = config.vllm_mode
            if config.vllm_gpu_memory_utilization is not None:
                kwargs["vllm_gpu_memory_utilization"] = config.vllm_gpu_memory_utilization
        if off_policy_mask_threshold is not None:
            kwargs["off_policy_mask_threshold"] = off_policy_mask_threshold
        if reward_weights is not None:
            kwargs["reward_weights"] = reward_weights
    else:
        kwargs["max_length"] = settings.max_length
        if config.beta is not None and encoding.takes_beta:
            kwargs["beta"] = config.beta
    if encoding.class_weights:
        kwargs.update(desirable_weight=desirable_weight or 1.0, undesirable_weight=undesirable_weight or 1.0)
    if encoding.assistant_masks:
        kwargs.update(assistant_only_loss=assistant_only_loss, packing=False)
    return kwargs


def warn_unexecuted_tools(data: LoadedData) -> int:
    """Single-turn GRPO executes no tool: TRL samples one reply, and a tool call in it is only text that the rewards
    judge as an answer (an `exec_code` call scored below "The answer is 83."). Say so when the prompts offer tools;
    returns how many do."""
    if "tools" not in data.columns:
        return 0
    offered = sum(bool(tools) for tools in data.train["tools"])
    if offered:
        log.warning(
            "flowrl: %d of %d prompts in %s offer tools, but --method grpo without --agent executes none: "
            "TRL samples one reply per prompt and a tool call in it stays text. To train on executed tool "
            "calls, roll out through the agent: --agent example or --agent module:function "
            '(docs/training.md, "GRPO through the agent")',
            offered,
            len(data.train),
            data.source,
        )
    return offered


def is_conversational_data(data: LoadedData, encoding: Encoding) -> bool:
    column = encoding.conversation_column
    if column is None or column not in data.columns or not len(data.train):
        return False
    return isinstance(data.train[0][column], list)


def _datasets() -> Any:
    return require("datasets")


def chat_renderer(model_path: str, label: str | None = None) -> Any:
    """A `flowrl.data.tokens.ChatRenderer` of the tokenizer in `model_path` (named `label` in its messages)."""
    transformers = require("transformers")
    return ChatRenderer(transformers.AutoTokenizer.from_pretrained(model_path), model=label or model_path)


def _completion_length(config: TrainingConfig, settings: RunSettings, needed: int) -> RunSettings:
    """Offline GRPO replays whole trajectories: the completion length is the data's longest, never a cut."""
    if config.max_completion_length is not None and config.max_completion_length < needed:
        raise ConfigError(
            f"--max-completion-length {config.max_completion_length} would cut logged trajectories: "
            f"the longest is {needed} tokens; pass --max-completion-length {needed} or more"
        )
    return dataclasses.replace(settings, max_completion_length=max(needed, config.max_completion_length or 0))


def _kto_args(
    config: TrainingConfig, settings: RunSettings, output_dir: Path, data: LoadedData, info: dict[str, Any]
) -> Any:
    """KTOConfig with the class-balance weights: the config's, else the ones the dataset was built with."""
    dw = config.desirable_weight if config.desirable_weight is not None else data.meta.get("desirable_weight")
    uw = config.undesirable_weight if config.undesirable_weight is not None else data.meta.get("undesirable_weight")
    info.update(desirable_weight=dw or 1.0, undesirable_weight=uw or 1.0)
    return trl_config(config, settings, output_dir, desirable_weight=dw, undesirable_weight=uw)


def build_trl_trainer(  # noqa: C901, PLR0915  # one TRL trainer per method, each its own arguments
    config: TrainingConfig,
    settings: RunSettings,
    model_path: str,
    data: LoadedData,
    output_dir: Path,
    callbacks: list[Any],
    reward_funcs: list[Any] | None = None,
    agent: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """TRL's trainer for the method, ready to `.train()`; also returns what was decided on the way.

    `reward_funcs` (online GRPO) replaces flowrl's rewards with your own TRL reward functions; `agent` (an
    `AgentAdapter`) rolls every completion out through the agent's own loop (flowrl.train.agent_rollout)."""
    _, trainer_cls = trl_classes(config.method)
    info: dict[str, Any] = {}
    kwargs: dict[str, Any] = dict(model=model_path, callbacks=callbacks, peft_config=lora_config(config))
    quant = quantization_config(settings)
    if quant is not None:
        kwargs["quantization_config"] = quant
    train = data.train
    method = config.method
    encoding = _encoding(method)
    spec = get_method(method)
    if spec.online and agent is not None:  # online, through the agent's loop
        tasks = list(agent.tasks) if config.dataset is None else train.to_list()
        parts = agent_grpo(config, agent, tasks, config.resolved_store)
        if reward_funcs:
            parts.funcs, parts.weights = list(reward_funcs), config.reward_weights or [1.0] * len(reward_funcs)
        info.update(
            rewards=[getattr(f, "__name__", str(f)) for f in parts.funcs],
            reward_weights=parts.weights,
            rollout=parts.info,
            rollouts=parts.rollout.stats,
        )
        settings = dataclasses.replace(settings, max_completion_length=parts.info["episode_tokens"])
        args = trl_config(config, settings, output_dir, reward_weights=parts.weights)
        train = parts.rollout.train_dataset()
        kwargs.update(reward_funcs=parts.funcs, rollout_func=parts.rollout.rollout_func)
        trainer_cls = agent_grpo_trainer(
            trainer_cls, drop_zero_std=config.drop_zero_std_groups, store=parts.rollout.store
        )
    elif spec.online:  # online: TRL generates
        info["tools_not_executed"] = warn_unexecuted_tools(data)
        if reward_funcs:
            funcs, weights = list(reward_funcs), config.reward_weights or [1.0] * len(reward_funcs)
        else:
            funcs, weights = online_reward_funcs(config)
        info["rewards"] = [getattr(f, "__name__", str(f)) for f in funcs]
        info["reward_weights"] = weights
        args = trl_config(config, settings, output_dir, reward_weights=weights)
        kwargs["reward_funcs"] = funcs
    elif encoding.replays_groups:
        groups = OfflineGroups(train.to_list(), settings.num_generations)
        renderer = chat_renderer(model_path)
        groups.encode(renderer)
        info["offline_groups"] = groups.stats.to_dict()
        info["encoding"] = groups.encode_stats.to_dict()
        settings = _completion_length(config, settings, groups.longest_completion)
        threshold = None
        if groups.with_logprobs and "off_policy_mask_threshold" not in config.trl_args:
            threshold = OFF_POLICY_MASK_THRESHOLD
        info["off_policy"] = (
            "sampling logprobs logged: off-policy sequence mask at "
            f"{threshold or config.trl_args.get('off_policy_mask_threshold')}"
            if groups.with_logprobs
            else "no sampling logprobs: logged completions treated as on-policy (ratio 1)"
        )
        args = trl_config(config, settings, output_dir, off_policy_mask_threshold=threshold)
        train = groups.train_dataset()
        kwargs.update(reward_funcs=[OfflineGroups.logged_reward], rollout_func=groups.rollout_func)
    elif is_conversational_data(data, encoding):
        # Token-faithful rows: captured ids where the runs have them, else the chat template, masks by flowrl
        from flowrl.data.encode import encode_for_trl

        rows, stats = encode_for_trl(
            encoding.name, train.to_list(), chat_renderer(model_path), max_length=settings.max_length
        )
        info["encoding"] = stats.to_dict()
        if not rows:
            raise ConfigError(
                f"no row of {data.source} fits max_length={settings.max_length} tokens "
                f"({stats.rows_in} rows: {dict(stats.dropped)}): pass a larger --max-length"
            )
        if encoding.assistant_masks and config.assistant_only_loss is False:  # asked for: loss on the whole sequence
            rows = [{"input_ids": r["input_ids"], "assistant_masks": [1] * len(r["input_ids"])} for r in rows]
        train = _datasets().Dataset.from_list(rows)
        if encoding.class_weights:
            args = _kto_args(config, settings, output_dir, data, info)
        else:
            args = trl_config(config, settings, output_dir)  # SFT: loss from the rows' assistant_masks
        if encoding.assistant_masks:
            info["assistant_only_loss"] = (
                config.assistant_only_loss is not False
            )  # flowrl's masks: tokens generated in the run
        if encoding.pretokenized_trainer:
            trainer_cls = pretokenized_trainer(encoding.name, trainer_cls)
    elif encoding.class_weights:  # plain-text KTO rows: TRL tokenizes them
        args = _kto_args(config, settings, output_dir, data, info)
    else:  # plain-text SFT or DPO rows: TRL tokenizes them
        args = trl_config(config, settings, output_dir)
    if _is_grpo(method):
        check_grpo_batch_fits(args, train, settings, offline=encoding.replays_groups, source=data.source)
    given = len(train)
    kwargs.update(args=args, train_dataset=train)
    with warnings.catch_warnings():
        # rollout_func is documented as experimental; flowrl documents what its use assumes (offline_grpo.py)
        warnings.filterwarnings("ignore", message=".*rollout_func.*experimental.*")
        trainer = trainer_cls(**kwargs)
    info["rows_trained"] = _rows_after_trl(trainer, given, info)
    return trainer, info


def check_grpo_batch_fits(args: Any, train: Any, settings: RunSettings, *, offline: bool, source: Any) -> None:
    """Refuse, before TRL loads the model, a GRPO run whose data cannot fill one generation batch.

    TRL's sampler takes `generation_batch_size / num_generations` distinct prompts (offline: logged groups) per
    generation batch and drops an incomplete one, so with fewer prompts than that no step runs at all. The GPU
    profile's batch 8 x accumulation 4 with groups of 4 needs 8 of them: the 3 groups that the example agent's
    captured runs make trained nothing on one GPU, and said so only after loading the model, with a generic
    message (`flowrl train` on an H100)."""
    try:
        n = len(train)
    except TypeError:  # an iterable dataset: its length is not known ahead
        return
    per_generation = int(args.generation_batch_size)
    generations = int(args.num_generations)
    needed = per_generation // generations
    if n >= needed:
        return
    unit = "groups" if offline else "prompts"
    raise ConfigError(
        f"{source}: {n} {unit}, but one generation batch of {per_generation} completions (batch "
        f"{settings.per_device_train_batch_size} x {settings.world_size} processes x "
        f"{per_generation // (settings.per_device_train_batch_size * settings.world_size)} steps per generation) "
        f"takes {needed} {unit} of {generations} completions, so no step could run: lower --grad-accum or "
        f"--batch-size (at most {n * generations} completions per generation batch), or use more {unit}"
    )


def _rows_after_trl(trainer: Any, given: int, info: dict[str, Any]) -> int:
    """Rows TRL kept after its own preparation (it drops rows whose prompt alone fills max_length): counted."""
    try:
        kept = len(trainer.train_dataset)
    except TypeError:  # an iterable dataset has no length
        return given
    if kept < given:
        info["dropped_by_trl"] = given - kept
        log.warning(
            "flowrl: TRL dropped %d of %d rows while preparing them (prompt longer than max_length): "
            "pass a larger --max-length to keep them",
            given - kept,
            given,
        )
    return kept
