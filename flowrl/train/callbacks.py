"""Trainer callbacks: the metrics log and a Ctrl-C that saves.

`MetricsLogger` appends one JSON object per logging step to `{output_dir}/metrics.jsonl`:

    {"step": 3, "epoch": 0.75, "time": "2026-...Z", "elapsed_s": 41.2, "loss": 0.012, "learning_rate": 9e-06,
     "grad_norm": 0.31, "reward_mean": 0.45, "reward_std": 0.21, "kl": 0.0004, "tokens_per_s": 212.5,
     "trl": {... every value TRL logged, under its own name ...}}

The flowrl names are present when TRL logged the matching value (`reward_*` for GRPO; for DPO and KTO the
implicit reward of the chosen/desirable side: `rewards/chosen`); `tokens_per_s` comes from the running token
count TRL logs (`num_tokens`: prompt and completion tokens) or the trainer state's. The last line, written
when training ends, has `"summary": true` and TRL's run totals. Only the main process writes. A resumed run
appends to the same file.

`GracefulInterrupt` turns the first Ctrl-C (SIGINT) into "finish this step, save a checkpoint, stop";
a second Ctrl-C interrupts at once. Under `accelerate launch` the launcher passes one SIGINT on to every
process, each at its own moment: the processes agree after every step (one all-reduce of a flag), so all stop
after the same step and save one checkpoint together instead of one waiting forever for the other.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from transformers import TrainerCallback

log = logging.getLogger(__name__)

# flowrl name -> the TRL log keys that carry it, first found wins
ALIASES: dict[str, tuple[str, ...]] = {
    "loss": ("loss",),
    "learning_rate": ("learning_rate",),
    "grad_norm": ("grad_norm",),
    "reward_mean": ("reward", "rewards/chosen", "rewards/chosen_sum"),
    "reward_std": ("reward_std",),
    "kl": ("kl", "objective/kl"),
}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "item"):
        try:
            return _clean(value.item())
        except (ValueError, RuntimeError):
            return str(value)
    return value


class MetricsLogger(TrainerCallback):
    def __init__(self, path: Path):
        self.path = Path(path)
        self._last_time: float | None = None
        self._last_tokens: int | None = None
        self._start = time.perf_counter()
        self._fh: Any = None
        self.rows: list[dict[str, Any]] = []

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - TrainerCallback signature
        self._start = self._last_time = time.perf_counter()
        self._last_tokens = int(state.num_input_tokens_seen or 0)  # restored on resume

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if not state.is_world_process_zero or not logs:
            return
        now = time.perf_counter()
        logs = {k: _clean(v) for k, v in logs.items()}
        summary = "train_runtime" in logs
        row: dict[str, Any] = {
            "step": int(state.global_step),
            "epoch": None if state.epoch is None else round(float(state.epoch), 4),
            "time": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "elapsed_s": round(now - self._start, 3),
        }
        if summary:
            row["summary"] = True
        for name, keys in ALIASES.items():
            for key in keys:
                if logs.get(key) is not None:
                    row[name] = logs[key]
                    break
        # TRL's GRPO/SFT/DPO log a running token count (`num_tokens`); other trainers fill the trainer state's
        tokens = int(logs.get("num_tokens") or state.num_input_tokens_seen or 0)
        if not summary and self._last_time is not None and self._last_tokens is not None and tokens > self._last_tokens:
            dt = now - self._last_time
            if dt > 0:
                row["tokens_per_s"] = round((tokens - self._last_tokens) / dt, 2)
        if not summary:
            self._last_time, self._last_tokens = now, tokens
        row["trl"] = logs
        self.rows.append(row)
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("ab")
        self._fh.write(orjson.dumps(row, default=str, option=orjson.OPT_APPEND_NEWLINE))
        self._fh.flush()  # a crash or a kill leaves every finished line on disk

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _any_process(flag: bool) -> bool:
    """`flag` or-ed over every process of the run (an all-reduce); `flag` itself when there is one process."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    from accelerate import PartialState

    # on the process's own device: NCCL reduces GPU tensors only, gloo CPU ones
    value = torch.tensor([1 if flag else 0], dtype=torch.int64, device=PartialState().device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class GracefulInterrupt(TrainerCallback):
    """First SIGINT: save at the end of the current step and stop. Second: KeyboardInterrupt right away.

    With several processes the decision is shared after every step (`_any_process`): a Ctrl-C seen by one
    process stops them all after the same step."""

    def __init__(self, *, announce: bool = True) -> None:
        self.requested = False
        self.announce = announce  # only the main process says so on the console
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be handled in the main thread; Ctrl-C then stops without saving
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
            self._installed = False

    def _handle(self, signum, frame):  # noqa: ANN001
        if self.requested:
            self.uninstall()
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:
            log.warning("flowrl: interrupted: saving a checkpoint after this step (Ctrl-C again to stop at once)")

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if getattr(args, "world_size", 1) > 1:
            self.requested = _any_process(self.requested)
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class StepTimer(TrainerCallback):
    """Seconds per optimizer step (from one step's end to the next; the first from the start of training):
    wall time in `durations`, this process's CPU time in `cpu_durations` (steadier on a shared machine)."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.cpu_durations: list[float] = []
        self._last: tuple[float, float] | None = None

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        self._last = (time.perf_counter(), time.process_time())

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        now = (time.perf_counter(), time.process_time())
        if self._last is not None:
            self.durations.append(now[0] - self._last[0])
            self.cpu_durations.append(now[1] - self._last[1])
        self._last = now
