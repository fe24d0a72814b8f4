"""ReferenceAnswerReward: is the agent's answer the task's known answer?

The reference is `flowrl.trace.facts.reference`: the first of `flowrl.trace.facts.REFERENCE_KEYS` (`reference_answer`,
`expected_answer`, `reference`, `expected`, `answer`) set in the trace's metadata, else, for a fresh GRPO
completion, in the dataset's columns. A reference the dataset builder took from another run's answer
(`reference_source == "best_trace"`) is only a guess, so it is not used. No reference: None.

1.0 when the reference appears in the answer as a whole word or number (case-insensitive, numbers
compared after removing thousands separators), else 0.0.
"""

from __future__ import annotations

import re

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.views import answer_text
from flowrl.trace.facts import REFERENCE_KEYS, reference
from flowrl.trace.schema import ExecutionTrace

__all__ = ["REFERENCE_KEYS", "THOUSANDS", "ReferenceAnswerReward", "answer_matches", "reference_of"]


def reference_of(trace: ExecutionTrace) -> str | None:
    """The trace's reference answer (`flowrl.trace.facts.reference`), None when it has none."""
    return reference(trace).answer


THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")  # "1,024": a thousands separator, dropped before numbers compare


def answer_matches(expected: str, answer: str) -> bool:
    """`expected` appears in `answer` as a whole word or number (case-insensitive)."""
    norm_answer = THOUSANDS.sub("", (answer or "").lower())
    norm_expected = THOUSANDS.sub("", expected.strip().lower())
    if not norm_expected:
        return False
    # an integer reference also matches its ".0" spelling ("84.0"), never another number ("84.5", "841")
    zeros = r"(?:\.0+)?" if re.fullmatch(r"-?\d+", norm_expected) else ""
    pattern = r"(?<![\w.])" + re.escape(norm_expected) + zeros + r"(?![\w]|\.\d)"
    return re.search(pattern, norm_answer) is not None


class ReferenceAnswerReward(Reward):
    name = "reference_answer"

    def score(self, trace: ExecutionTrace) -> RewardResult:
        expected = reference_of(trace)
        if expected is None:
            return RewardResult(None, {"reason": "no reference answer"})
        answer = answer_text(trace)
        ok = answer_matches(expected, answer)
        return RewardResult(1.0 if ok else 0.0, {"expected": expected, "answer": answer[:500], "match": ok})
