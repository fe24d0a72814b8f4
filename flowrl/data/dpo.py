"""DPO: `prompt` / `chosen` / `rejected` from the best and worst run of each task (TRL's DPOTrainer).

Per group: the best-rewarded run that is not labelled bad by hand, and the worst-rewarded run that is
not labelled good by hand; their reward margin must be above `min_margin`. When a person labelled runs of
the group both good and bad (`flowrl review`'s best/worst of a group), their choice wins: the best-rewarded
manual good run against the worst-rewarded manual bad one, whatever their rewards. The two transcripts are
compared message by message (system messages aside, user turns compared after `normalize_query`);
the pair is taken where they first differ, at an assistant turn:
`prompt` = the best run's messages before that point, `chosen` = the best run's assistant message
there, `rejected` = the worst run's. So both completions answer the same context and only assistant
output is trained on. Groups without two scored runs, with too small a margin, or whose runs never
differ at an assistant turn (identical transcripts, say) are dropped and counted by reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from flowrl.data.base import BuildStats, DatasetBuilder, Loader, TraceInfo, reward_order
from flowrl.data.tokens import aligned_calls
from flowrl.errors import ConfigError
from flowrl.trace.conversation import message_chars, normalize_query


def _comparable(m: dict[str, Any]) -> Any:
    """A message without what differs between runs that did the same: call ids, user-text spacing."""
    if m["role"] == "user":
        return ("user", normalize_query(m["content"]))
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or ()]
    return (m["role"], m["content"], orjson.dumps(calls, option=orjson.OPT_SORT_KEYS, default=str), m.get("name"))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _comparable(a) == _comparable(b)


def divergence(best: list[dict[str, Any]], worst: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(index in best, index in worst) of the first non-system message where they differ, when both are
    assistant messages; else None."""
    ib = [i for i, m in enumerate(best) if m["role"] != "system"]
    iw = [i for i, m in enumerate(worst) if m["role"] != "system"]
    k = 0
    while k < len(ib) and k < len(iw) and _same(best[ib[k]], worst[iw[k]]):
        k += 1
    if k >= len(ib) or k >= len(iw):
        return None
    b, w = ib[k], iw[k]
    if best[b]["role"] != "assistant" or worst[w]["role"] != "assistant":
        return None
    return b, w


def _step(conv: Any, index: int) -> int | None:
    steps = conv.assistant_indices()
    return steps.index(index) if index in steps else None


def _captured_pair(best_trace: Any, best: Any, b: int, worst_trace: Any, worst: Any, w: int) -> dict[str, Any] | None:
    """The ids of the two calls that wrote the chosen and the rejected turn, when both runs captured them."""
    good, bad = (
        aligned_calls(best_trace, len(best.assistant_indices())),
        aligned_calls(worst_trace, len(worst.assistant_indices())),
    )
    kb, kw = _step(best, b), _step(worst, w)
    if not good or not bad or kb is None or kw is None:
        return None
    return {"chosen": good[kb].to_dict(), "rejected": bad[kw].to_dict()}


@dataclass(kw_only=True)
class DPODatasetBuilder(DatasetBuilder):
    method: ClassVar[str] = "dpo"
    grouped: ClassVar[bool] = True

    min_margin: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.min_margin < 1.0:
            raise ConfigError(f"min_margin {self.min_margin}: use a reward difference in [0, 1)")

    def features(self) -> Any:
        from datasets import Features, Json, List, Value

        return Features(
            {
                "prompt": List(Json()),
                "chosen": List(Json()),
                "rejected": List(Json()),
                "tools": Json(),
                "group_id": Value("string"),
                "chosen_trace_id": Value("string"),
                "rejected_trace_id": Value("string"),
                "chosen_reward": Value("float64"),
                "rejected_reward": Value("float64"),
                "margin": Value("float64"),
                "captured": Json(),
            }
        )

    def group_rows(self, members: list[TraceInfo], load: Loader, stats: BuildStats) -> Iterator[dict[str, Any]]:
        ranked = sorted((m for m in members if m.reward is not None), key=reward_order)
        chosen = next((m for m in ranked if not (m.manual and m.label is False)), None)
        rejected = next((m for m in reversed(ranked) if not (m.manual and m.label is True)), None)
        by_hand = sorted(members, key=reward_order)  # a person's best and worst win over the rewards
        picked = next((m for m in by_hand if m.manual and m.label is True), None)
        dropped = next((m for m in reversed(by_hand) if m.manual and m.label is False), None)
        if picked is not None and dropped is not None:
            chosen, rejected = picked, dropped
        if chosen is None or rejected is None or chosen is rejected:
            stats.groups["dropped: fewer than 2 scored runs"] += 1
            return
        margin = (chosen.reward or 0.0) - (rejected.reward or 0.0)
        if margin <= self.min_margin and chosen is not picked:
            stats.groups[f"dropped: reward margin <= {self.min_margin}"] += 1
            return
        best_trace, best = load(chosen)
        worst_trace, worst = load(rejected)
        where = divergence(best.messages, worst.messages)
        if where is None:
            stats.groups["dropped: runs never differ at an assistant turn"] += 1
            return
        b, w = where
        prompt, good, bad = best.messages[:b], best.messages[b], worst.messages[w]
        if not self.fits(message_chars(prompt) + max(message_chars([good]), message_chars([bad]))):
            stats.dropped_too_long += 1
            return
        stats.groups["used"] += 1
        yield {
            "prompt": prompt,
            "chosen": [good],
            "rejected": [bad],
            "tools": best.tools,
            "group_id": chosen.group_id,
            "captured": _captured_pair(best_trace, best, b, worst_trace, worst, w),
            "chosen_trace_id": chosen.trace_id,
            "rejected_trace_id": rejected.trace_id,
            "chosen_reward": chosen.reward,
            "rejected_reward": rejected.reward,
            "margin": margin,
        }
