"""`RLTrainer` (one TRL run: build, train, save) and `TrainingPipeline` (dataset folder to adapter, card, merge).

Output folder (`--output-dir`, default `out/train-{method}`):
- `adapter_model.safetensors`, `adapter_config.json`, tokenizer files: the trained LoRA adapter (or the whole
  model with LoRA off);
- `checkpoint-N/`: every `save_steps` steps and at the end (a Ctrl-C saves one too); `--resume` continues the
  last one;
- `metrics.jsonl`: one line per logging step (see `flowrl.train.callbacks`);
- `README.md`: the training card; `flowrl_train.json`: the resolved config, hardware, settings and results;
- `merged/`: base + adapter as one model, with `--merge`.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, ModelError, TrainingError
from flowrl.methods import get_method
from flowrl.models import DEFAULT_MODEL, ResolvedModel, resolve_model
from flowrl.quiet import quiet_libraries
from flowrl.train.agent_grpo import resolve_adapter, tasks_data
from flowrl.train.card import render_training_card
from flowrl.train.config import TrainingConfig
from flowrl.train.data_io import LoadedData, check_for_method, load_dataset_dir
from flowrl.train.hardware import HardwareInfo, RunSettings, choose_profile, detect_hardware, resolve_settings
from flowrl.train.offline_grpo import COMPLETION_COLUMNS, find_column, group_size
from flowrl.train.trainers import build_trl_trainer
from flowrl.train.warm_start import load_adapter_weights, lora_shape
from flowrl.version import __version__

log = logging.getLogger(__name__)

RUN_FILE = "flowrl_train.json"
METRICS_FILE = "metrics.jsonl"
# what `overwrite` removes from an output folder (never anything else)
RUN_OUTPUTS = (
    "metrics.jsonl",
    "README.md",
    RUN_FILE,
    "adapter_model.safetensors",
    "adapter_config.json",
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "training_args.bin",
    "merged",
    "runs",
)
# a folder holding one of these has a saved model or run record: only --resume or --overwrite may touch it
SAVED_MARKERS = (RUN_FILE, "adapter_model.safetensors", "model.safetensors")


@dataclass
class TrainResult:
    output_dir: Path
    method: str
    model: str
    global_step: int
    start_step: int
    interrupted: bool
    train_seconds: float
    step_seconds: list[float] = field(default_factory=list)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    merged_dir: Path | None = None

    @property
    def seconds_per_step(self) -> float | None:
        """Median seconds per optimizer step, leaving out the first (warm-up) when there are more."""
        times = self.step_seconds[1:] if len(self.step_seconds) > 1 else self.step_seconds
        return statistics.median(times) if times else None

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_dir"] = str(self.output_dir)
        data["merged_dir"] = None if self.merged_dir is None else str(self.merged_dir)
        data["seconds_per_step"] = self.seconds_per_step
        return data


def last_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint: TRL writes `trainer_state.json` last, so a folder without it was cut off
    while being saved (Ctrl-C twice) and cannot be resumed from."""
    ckpts = [
        p
        for p in output_dir.glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").is_file()
    ]
    return max(ckpts, key=lambda p: int(p.name.split("-")[-1])) if ckpts else None


def _saved_run(out: Path) -> str | None:
    """The first file of a run that saved a model or its record, or None."""
    return next((name for name in SAVED_MARKERS if (out / name).exists()), None)


def _set_aside_interrupted(out: Path) -> None:
    """An interrupted run that saved nothing: keep its log as `metrics.interrupted-N.jsonl` and drop checkpoint
    folders cut off while being saved, so the same command starts again without --overwrite."""
    for partial in out.glob("checkpoint-*"):
        if partial.is_dir():
            shutil.rmtree(partial)
    metrics = out / METRICS_FILE
    if metrics.exists():
        n = 1
        while (out / f"metrics.interrupted-{n}.jsonl").exists():
            n += 1
        kept = metrics.rename(out / f"metrics.interrupted-{n}.jsonl")
        log.warning(
            "flowrl: %s holds an interrupted run that saved no checkpoint: starting again (its log: %s)", out, kept.name
        )


def prepare_output_dir(config: TrainingConfig, *, tidy: bool = True) -> tuple[Path, str | None]:  # noqa: C901  # each case of an output folder (resume, adapter, foreign files)
    """Check the output folder against --resume/--overwrite; returns it and the checkpoint to resume from.

    Every state a Ctrl-C can leave has one command that works: a complete checkpoint is resumed with
    --resume; a folder an interrupted run left with no checkpoint and no saved model (only its log) is started
    again by the same command, its log kept aside; a saved run without checkpoints needs --overwrite.

    `tidy=False` checks and answers the same but changes nothing on disk: the other processes of an
    `accelerate launch` run, after the main process has tidied the folder, so no file is removed or renamed
    twice."""
    out = config.resolved_output_dir
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output-dir {out} is a file: give a folder")
    found = last_checkpoint(out) if out.is_dir() else None
    saved = _saved_run(out) if out.is_dir() else None
    if config.resume:
        if isinstance(config.resume, Path):
            if not (config.resume / "trainer_state.json").is_file():
                raise ConfigError(f"--resume {config.resume} is not a checkpoint folder (no trainer_state.json)")
            return out, str(config.resume)
        if found is None and saved is not None:
            raise ConfigError(
                f"--resume: {out} holds a run ({saved}) but no complete checkpoint-N folder to "
                "continue: pass --overwrite instead of --resume to start over, or another --output-dir"
            )
        if found is None:
            raise ConfigError(
                f"--resume: {out} holds no checkpoint-N folder to continue: "
                "train without --resume (the same command) to start it"
            )
        return out, str(found)
    if found is not None or saved is not None:
        if not config.overwrite:
            if found is None:
                raise ConfigError(
                    f"{out} already holds a run ({saved}) and no checkpoint to continue: pass "
                    "--overwrite to start over, or another --output-dir"
                )
            raise ConfigError(
                f"{out} already holds a run ({found.name}): pass --resume to continue it, "
                "--overwrite to start over, or another --output-dir"
            )
    if not tidy:
        return out, None
    if config.overwrite and out.is_dir():
        for ckpt in out.glob("checkpoint-*"):
            shutil.rmtree(ckpt)
        for name in RUN_OUTPUTS:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        for kept in out.glob("metrics.interrupted-*.jsonl"):
            kept.unlink()
    elif out.is_dir():
        _set_aside_interrupted(out)
    out.mkdir(parents=True, exist_ok=True)
    return out, None


def _check_rows_left(trainer: Any, config: TrainingConfig, settings: Any) -> None:
    """TRL silently drops rows that do not fit `max_length` (KTO, DPO) and then trains 0 steps: refuse instead."""
    dataset = getattr(trainer, "train_dataset", None)
    try:
        n = len(dataset) if dataset is not None else None
    except TypeError:  # an iterable dataset has no length
        return
    if n == 0:
        raise TrainingError(
            f"every row of {config.dataset} is longer than max_length={getattr(settings, 'max_length', '?')} tokens "
            f"(TRL dropped them all): pass a larger --max-length, or build the dataset with a smaller --max-chars"
        )


class RLTrainer:
    """One training run on TRL. `train()` builds the TRL trainer, trains, and saves adapter and tokenizer."""

    def __init__(
        self,
        config: TrainingConfig,
        *,
        hardware: HardwareInfo | None = None,
        data: LoadedData | None = None,
        model: ResolvedModel | None = None,
        callbacks: list[Any] | None = None,
        reward_funcs: list[Any] | None = None,
        agent: Any = None,
    ):
        self.reward_funcs = reward_funcs
        self.hardware = hardware or detect_hardware()
        self.agent = None  # online GRPO through an agent: its AgentAdapter (flowrl.train.agent_rollout)
        if agent is not None or config.agent is not None:
            if agent is not None and config.agent is None:
                config = config.model_copy(update={"agent": getattr(agent, "name", "agent")})
            source: Any = agent if agent is not None else config.agent
            self.agent = resolve_adapter(source)
            if data is None and config.dataset is None:
                data = tasks_data(self.agent)
        if data is None:
            if config.dataset is None:
                raise ConfigError("no dataset to train on: pass --dataset DIR (or --agent for online GRPO)")
            data = load_dataset_dir(config.dataset)
        self.data = data
        check_for_method(self.data, config.method)
        self.config, shape_note = lora_shape(self._with_group_size(config))
        self.settings: RunSettings = resolve_settings(self.config, self.hardware)
        if shape_note:
            self.settings = replace(self.settings, notes=(*self.settings.notes, shape_note))
        self.model = model or resolve_model(config.base_model)
        if self.model.adapter:
            raise ConfigError(
                f"--base-model {config.base_model} is an adapter: pass its merged model or its base model"
            )
        self.extra_callbacks = list(callbacks or [])
        self.trainer: Any = None
        self.info: dict[str, Any] = {}

    def _with_group_size(self, config: TrainingConfig) -> TrainingConfig:
        """Offline GRPO: generations per prompt default to the logged group size (capped by the profile)."""
        if not get_method(config.method).encoding_spec.replays_groups or config.num_generations is not None:
            return config
        column = find_column(self.data.columns, COMPLETION_COLUMNS, "logged completions")
        size = group_size(self.data.train.select_columns([column]).to_list(), column)
        cap = choose_profile(self.hardware, lora=config.lora.enabled).num_generations
        return config.model_copy(update={"num_generations": max(2, min(size, cap))})

    def build(self, output_dir: Path, *, announce: bool = True) -> Any:
        """TRL's trainer with flowrl's callbacks; `announce=False` (processes other than the first) keeps the
        Ctrl-C message off the console."""
        from flowrl.train.callbacks import (  # lazy: imports accelerate, fsspec
            GracefulInterrupt,
            MetricsLogger,
            StepTimer,
        )

        self.metrics = MetricsLogger(output_dir / METRICS_FILE)
        self.interrupt = GracefulInterrupt(announce=announce)
        self.timer = StepTimer()
        callbacks = [self.metrics, self.interrupt, self.timer, *self.extra_callbacks]
        try:
            self.trainer, self.info = build_trl_trainer(
                self.config,
                self.settings,
                self.model.path,
                self.data,
                output_dir,
                callbacks,
                reward_funcs=self.reward_funcs,
                agent=self.agent,
            )
        except OSError as exc:  # transformers' "not a local folder and the Hub cannot be reached"
            raise ModelError(
                f"cannot load model {self.model.path}: {str(exc).splitlines()[0]} "
                f"(pass a local model folder, or the embedded default `{DEFAULT_MODEL}`)"
            ) from exc
        if self.config.init_adapter is not None:  # before train() creates the optimizer
            tensors = load_adapter_weights(self.trainer.model, self.config.init_adapter)
            self.info["init_adapter"] = {"path": str(self.config.init_adapter), "tensors": tensors}
        return self.trainer

    def train(self) -> TrainResult:
        from accelerate import PartialState

        state = PartialState()
        # under `accelerate launch` rank 0 checks and tidies the folder first; the others then only check it
        with state.main_process_first():
            output_dir, resume_from = prepare_output_dir(self.config, tidy=state.is_main_process)
        if state.is_main_process:
            for note in self.settings.notes:
                log.warning("flowrl: %s", note)
        trainer = self.build(output_dir, announce=state.is_main_process)
        if state.num_processes > 1:  # the record shows the run really had its processes (a group needs them all)
            self.info["distributed"] = {
                "processes": state.num_processes,
                "backend": state.backend,
                "type": str(state.distributed_type.value),
            }
        _check_rows_left(trainer, self.config, self.settings)
        start_step = 0
        if resume_from:
            start_step = int(json.loads((Path(resume_from) / "trainer_state.json").read_text()).get("global_step", 0))
        started = time.perf_counter()
        self.interrupt.install()
        try:
            output = trainer.train(resume_from_checkpoint=resume_from)
        except ValueError as exc:
            if resume_from and "checkpoint" in str(exc).lower():
                raise TrainingError(f"cannot resume from {resume_from}: {exc}") from exc
            raise
        finally:
            self.interrupt.uninstall()
            self.metrics.close()
            if self.agent is not None and self.agent.close is not None:
                self.agent.close()
            stats = self.info.get("rollouts")
            if stats is not None and hasattr(stats, "to_dict"):
                self.info["rollouts"] = stats.to_dict()
        seconds = time.perf_counter() - started
        # resuming a checkpoint already at max_steps (Ctrl-C after the last save) only writes the model and record
        finished = bool(resume_from) and start_step >= int(trainer.state.max_steps or 0) > 0
        if int(trainer.state.global_step) <= start_step and not self.interrupt.requested and not finished:
            raise TrainingError(
                f"no training step ran on {self.config.dataset}: the trainer found no batch to train on "
                f"(too few rows for the batch size, or every row longer than max_length); see the log above"
            )
        trainer.save_model(str(output_dir))
        rows = [r for r in self.metrics.rows if not r.get("summary")]
        summary: dict[str, Any] = next((r for r in reversed(self.metrics.rows) if r.get("summary")), {})
        return TrainResult(
            output_dir=output_dir,
            method=self.config.method,
            model=self.model.spec,
            global_step=int(trainer.state.global_step),
            start_step=start_step,
            interrupted=self.interrupt.requested,
            train_seconds=round(seconds, 3),
            step_seconds=[round(s, 4) for s in self.timer.durations],
            last_metrics={k: v for k, v in (rows[-1] if rows else {}).items() if k != "trl"},
            summary=dict(summary.get("trl") or {}) or dict(getattr(output, "metrics", {}) or {}),
            settings=self.settings.to_dict(),
            hardware=self.hardware.to_dict(),
            info=self.info,
        )


class TrainingPipeline:
    """Dataset folder -> trained adapter (+ merged model on request) + training card + run record."""

    def __init__(
        self,
        config: TrainingConfig,
        *,
        hardware: HardwareInfo | None = None,
        callbacks: list[Any] | None = None,
        reward_funcs: list[Any] | None = None,
        agent: Any = None,
    ):
        self.config = config
        self.hardware = hardware
        self.callbacks = callbacks
        self.reward_funcs = reward_funcs
        self.agent = agent  # an AgentAdapter (or `config.agent`): GRPO rollouts through the agent's own loop

    def run(self) -> TrainResult:
        with quiet_libraries():  # transformers' own renames, read by TRL and PEFT: nothing to act on
            trainer = RLTrainer(
                self.config,
                hardware=self.hardware,
                callbacks=self.callbacks,
                reward_funcs=self.reward_funcs,
                agent=self.agent,
            )
            result = trainer.train()
        if not trainer.trainer.is_world_process_zero():  # other ranks of `accelerate launch`: rank 0 writes
            return result
        out = result.output_dir
        if self.config.merge and not result.interrupted:
            if self.config.lora.enabled:
                from flowrl.export.merge import merge_adapter  # the one merge: `flowrl export` uses it too

                result.merged_dir = merge_adapter(out, out / "merged").path
            else:
                log.warning("flowrl: --merge has nothing to do without LoRA: %s already holds the whole model", out)
        record = {
            "flowrl_version": __version__,
            "config": trainer.config.to_json_dict(),
            "base_model": {"spec": trainer.model.spec, "path": trainer.model.path},
            "dataset": {"source": trainer.data.source, "rows": len(trainer.data.train), "meta": trainer.data.meta},
            "result": result.to_json_dict(),
        }
        (out / RUN_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        (out / "README.md").write_text(render_training_card(record, trainer.metrics.rows), encoding="utf-8")
        return result
