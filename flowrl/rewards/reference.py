"""ReferenceAnswerReward: is the agent's answer the task's known answer, and only that answer?

The reference is `flowrl.trace.facts.reference`: the first of `flowrl.trace.facts.REFERENCE_KEYS` (`reference_answer`,
`expected_answer`, `reference`, `expected`, `answer`) set in the trace's metadata, else, for a fresh GRPO
completion, in the dataset's columns. A reference the dataset builder took from another run's answer
(`reference_source == "best_trace"`) is only a guess, so it is not used. No reference: None.

1.0 when `answer_matches(reference, answer)`, else 0.0. The rule is written here once; the task suite's
`grade` and eval call it:

1. the reference appears in the answer as a whole word or number (case-insensitive; numbers compared after
   removing thousands separators; an integer also as its ".0" spelling: "84.0" is 84, "84.5" and "841" are not);
2. and the answer commits to it (`hedge`). It is wrong when it
   - offers candidates: the reference and another value joined by "or" or "/" ("84 or 85", "Lima or Quito"),
     a range ("between 84 and 86", "84 to 86"), or a list of bare numbers ("84, 85, 86");
   - contradicts itself: two bare numbers set equal ("10240 = 2142"), answer lines that disagree ("The answer
     is 84. ... The answer is 85."), or a correction ("84. Actually, 85.") when another bare number stands
     beside the reference.

A bare number is one that is no operand of arithmetic: in "56 * 72 + 122 = 3108 + 122 = 3318" only 3318 is
bare, so working shown step by step is fine, and so is a looked-up value beside the result ("The atomic number
of carbon is 6, and 6 * 17 = 102").
"""

from __future__ import annotations

import re

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.views import answer_text
from flowrl.trace.facts import REFERENCE_KEYS, reference
from flowrl.trace.schema import ExecutionTrace

__all__ = ["REFERENCE_KEYS", "THOUSANDS", "ReferenceAnswerReward", "answer_matches", "hedge", "reference_of"]


def reference_of(trace: ExecutionTrace) -> str | None:
    """The trace's reference answer (`flowrl.trace.facts.reference`), None when it has none."""
    return reference(trace).answer


THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")  # "1,024": a thousands separator, dropped before numbers compare

_NUM = r"-?\d+(?:\.\d+)?"
_NUMBER = re.compile(r"(?<![\w.])" + _NUM + r"(?![\w]|\.\d)")
_OPERATORS = frozenset("+-*/×÷^%()")  # a number beside one of these is an operand, not a value the answer states
_CORRECTION = re.compile(r"\b(?:actually|sorry|correction|i mean|oops|wait|rather)\b")
_ANSWER_LINE = re.compile(r"\b(?:answer|result)\s*(?:is|:|=)\s*(" + _NUM + ")")


def _normal(text: str) -> str:
    return THOUSANDS.sub("", (text or "").strip().lower())


def _pattern(expected: str) -> str:
    # an integer reference also matches its ".0" spelling ("84.0"), never another number ("84.5", "841")
    zeros = r"(?:\.0+)?" if re.fullmatch(r"-?\d+", expected) else ""
    return r"(?<![\w.])" + re.escape(expected) + zeros + r"(?![\w]|\.\d)"


def _bare_numbers(text: str) -> set[float]:
    """The values of the numbers in `text` that are no operand of arithmetic."""
    found = set()
    for m in _NUMBER.finditer(text):
        before, after = text[: m.start()].rstrip()[-1:], text[m.end() :].lstrip()[:1]
        if before not in _OPERATORS and after not in _OPERATORS:
            found.add(float(m.group()))
    return found


def hedge(expected: str, answer: str) -> str | None:
    """Why `answer` does not commit to `expected` (see the module doc), None when it does."""
    text, want = _normal(answer), _normal(expected)
    exact = _pattern(want)
    if re.search(r"(?:\bor\b|/)\s*" + exact + "|" + exact + r"\s*(?:/|\bor\b)\s*\S", text):
        return "offers candidates"
    if re.fullmatch(_NUM, want) is None:
        return None  # a word or a name: only "or" / "/" alternatives are judged
    target = float(want)
    if re.search(rf"between\s+{_NUM}\s+and\s+{exact}|between\s+{exact}\s+and\s+{_NUM}", text) or re.search(
        rf"{exact}\s+to\s+{_NUM}|{_NUM}\s+to\s+{exact}", text
    ):
        return "offers a range"
    for listed in re.finditer(rf"{_NUM}(?:\s*,\s*{_NUM})+(?![\w.]|\s*[-+*/×÷^%])", text):
        values = _bare_numbers(listed.group())
        if target in values and len(values) > 1:
            return "lists candidates"
    for line in text.splitlines():
        for chain in re.split(r"[.;:](?:\s|$)", line):
            sides = {float(s.strip()) for s in chain.split("=") if re.fullmatch(_NUM, s.strip())}
            if len(sides) > 1:
                return "contradicts itself"
    stated = {float(n) for n in _ANSWER_LINE.findall(text)}
    if stated - {target}:
        return "contradicts itself"
    if _CORRECTION.search(text) and _bare_numbers(text) - {target}:
        return "corrects itself"
    return None


def answer_matches(expected: str, answer: str) -> bool:
    """`expected` appears in `answer` as a whole word or number (case-insensitive), and the answer commits to it
    (no candidates, no contradiction: `hedge`)."""
    want = _normal(expected)
    if not want or re.search(_pattern(want), _normal(answer)) is None:
        return False
    return hedge(expected, answer) is None


class ReferenceAnswerReward(Reward):
    name = "reference_answer"

    def score(self, trace: ExecutionTrace) -> RewardResult:
        expected = reference_of(trace)
        if expected is None:
            return RewardResult(None, {"reason": "no reference answer"})
        answer = answer_text(trace)
        ok = answer_matches(expected, answer)
        details = {"expected": expected, "answer": answer[:500], "match": ok}
        if not ok and (why := hedge(expected, answer)):
            details["hedged"] = why
        return RewardResult(1.0 if ok else 0.0, details)
