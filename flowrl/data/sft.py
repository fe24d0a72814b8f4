"""SFT: `messages` (+ `tools`) of the best runs, for rejection-sampling fine-tuning (TRL's SFTTrainer).

Which runs count as best, by `select`:
- `top` (default): the top `top_share` of all runs by `reward_score` (ties at the cut-off are kept);
- `label`: runs whose label is true (manual, else the engine's or the reward threshold's);
- `best`: the best-rewarded run of each task (group).
(The `min_reward` filter drops runs before any of this.) A manual label always wins: a run labelled good by hand
is kept, one labelled bad is never kept. A row is the whole conversation (prompt, then the run's
assistant turns and tool results); train it with `assistant_only_loss=True` so only assistant turns
are learned. A conversation over `max_chars` is cut after the last assistant turn that fits (counted
as truncated); one whose prompt alone does not fit is dropped and counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

from flowrl.data.base import BuildStats, DatasetBuilder, Loader, TraceInfo, reward_order
from flowrl.data.tokens import kept_calls
from flowrl.errors import ConfigError
from flowrl.trace.conversation import fit_trajectory, message_chars


@dataclass(kw_only=True)
class SFTDatasetBuilder(DatasetBuilder):
    method: ClassVar[str] = "sft"
    grouped: ClassVar[bool] = True

    select: Literal["top", "label", "best"] = "top"
    top_share: float = 0.25
    _cutoff: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.select not in ("top", "label", "best"):
            raise ConfigError(f"SFT select {self.select!r}: use top, label or best")
        if not 0.0 < self.top_share <= 1.0:
            raise ConfigError(f"top_share {self.top_share}: use a fraction in (0, 1]")

    def options(self) -> dict[str, Any]:
        out = super().options()
        out.pop("_cutoff", None)
        if self.select == "top":
            out["reward_cutoff"] = self._cutoff
        return out

    def features(self) -> Any:
        from datasets import Features, Json, List, Value

        return Features(
            {
                "messages": List(Json()),
                "tools": Json(),
                "trace_id": Value("string"),
                "group_id": Value("string"),
                "reward": Value("float64"),
                "prompt_end": Value("int32"),
                "captured": Json(),
            }
        )

    def prepare(self, infos: list[TraceInfo], stats: BuildStats) -> None:
        if self.select != "top":
            return
        rewards = sorted(
            (i.reward for i in infos if i.reward is not None and not (i.manual and i.label is False)), reverse=True
        )
        self._cutoff = rewards[max(1, math.ceil(self.top_share * len(rewards))) - 1] if rewards else None

    def _keep(self, info: TraceInfo) -> bool:
        if info.manual:
            return bool(info.label)
        if self.select == "label":
            return bool(info.label)
        if self.select == "top":
            return info.reward is not None and self._cutoff is not None and info.reward >= self._cutoff
        return True  # best: decided per group

    def group_rows(self, members: list[TraceInfo], load: Loader, stats: BuildStats) -> Iterator[dict[str, Any]]:
        kept = [m for m in members if self._keep(m)]
        if self.select == "best":  # the best-rewarded run, plus any run approved by hand
            ranked = sorted((m for m in kept if m.reward is not None and not m.manual), key=reward_order)
            kept = ranked[:1] + [m for m in kept if m.manual]
        stats.skip("not selected", len(members) - len(kept))
        if kept:
            stats.groups["used"] += 1
        for info in kept:
            trace, conv = load(info)
            prompt_chars = message_chars(conv.prompt)
            trajectory = conv.trajectory
            if not self.fits(prompt_chars + message_chars(trajectory)):
                limit = cast(int, self.max_chars)  # set: without a limit everything fits
                trajectory = fit_trajectory(trajectory, limit - prompt_chars) if self.fits(prompt_chars) else []
                if not trajectory:
                    stats.dropped_too_long += 1
                    continue
                stats.truncated += 1
            calls = kept_calls(trace, len(conv.assistant_indices()), trajectory)
            captured = {"calls": calls} if calls is not None else None
            yield {
                "messages": conv.prompt + trajectory,
                "tools": conv.tools,
                "trace_id": trace.trace_id,
                "group_id": info.group_id,
                "reward": trace.reward_score,
                "prompt_end": len(conv.prompt),
                "captured": captured,
            }
