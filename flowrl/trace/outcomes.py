"""Outcomes from the host: what the application knows about a run that flowrl cannot see.

An outcome is one statement about one run, made during the run (`flowrl.current_run().record_outcome`) or any
time later (`Hook.record_outcome`, `TraceStore.record_outcome`, `flowrl traces annotate`):

    HostOutcome(reference="84", success=False, rewards={"tests_passed": 0.0}, feedback="wrong sum",
                source="user")

Every field is optional. A run may get several; they are kept in the order they came and never rewritten (the
store keeps them as append-only side records beside the trace, so re-scoring, which rewrites the trace file,
cannot lose them). `merge` reads them as one verdict: the last value of each field wins, reward by reward, and
every feedback text is kept.

What a verdict means for the rest of flowrl is decided in `flowrl.trace.facts`: a host reference is the task's
reference answer, a host success is the run's outcome and outranks every engine reward (only a manual label
outranks it), and the host's verdict is scored by the `host_outcome` reward.

This module sits at the bottom beside `flowrl.trace.schema` (which embeds `HostOutcome` in a trace): it imports only
pydantic and `flowrl.errors`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flowrl.errors import ConfigError

SOURCES_SUGGESTED = ("user", "test", "app")  # what said it; any short name is accepted
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
MAX_TEXT = 20_000  # characters of a reference or feedback kept (a longer one is cut, and says so)


def _now() -> str:
    return datetime.now().isoformat()


class HostOutcome(BaseModel):
    """One statement of the host about one run. `rewards` are named values on a 0..1 scale (1 best); `source`
    says who said it (user, test, app, or any short name); `at` when (local ISO time, set when recorded)."""

    model_config = ConfigDict(extra="allow")  # keys written by newer tools survive a round trip

    reference: str | None = None
    success: bool | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    feedback: str | None = None
    source: str = "app"
    at: str = Field(default_factory=_now)

    @field_validator("rewards")
    @classmethod
    def _check_rewards(cls, value: dict[str, float]) -> dict[str, float]:
        for name, number in value.items():
            if not _NAME.match(name):
                raise ValueError(f"reward name {name!r}: use letters, digits, '_', '-' and '.'")
            if not math.isfinite(number) or not 0.0 <= number <= 1.0:
                raise ValueError(f"reward {name}={number}: a host reward is a number from 0 to 1")
        return value

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"source {value!r}: a short name such as user, test or app")
        return value

    @property
    def empty(self) -> bool:
        return self.reference is None and self.success is None and not self.rewards and self.feedback is None


def make_outcome(
    *,
    reference: Any = None,
    success: Any = None,
    rewards: Mapping[str, Any] | None = None,
    feedback: Any = None,
    source: str = "app",
) -> HostOutcome:
    """A checked `HostOutcome` from a host's values. ConfigError names the value that cannot be one: a success
    that is not True/False, a reward outside 0..1, a source that is not a short name, or nothing at all."""
    if success is not None and not isinstance(success, bool):
        raise ConfigError(f"success={success!r}: use True or False (or leave it out)")
    if reference is not None and not isinstance(reference, str):
        reference = str(reference)  # a number the host knows ("84" and 84 are one answer)
    if feedback is not None and not isinstance(feedback, str):
        raise ConfigError(f"feedback={type(feedback).__name__}: give the feedback as text")
    numbers: dict[str, float] = {}
    for name, value in dict(rewards or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"reward {name}={value!r}: a host reward is a number from 0 to 1")
        numbers[str(name)] = float(value)
    try:
        outcome = HostOutcome(
            reference=_cut(reference), success=success, rewards=numbers, feedback=_cut(feedback), source=source
        )
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from exc
    if outcome.empty:
        raise ConfigError("an outcome needs at least one of reference, success, rewards or feedback")
    return outcome


def parse_reward(text: str) -> tuple[str, float]:
    """`name=value` (the CLI's `--reward`) as a pair; ConfigError names the text when it is not one."""
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not name.strip() or not math.isfinite(number):
        raise ConfigError(f"--reward {text!r}: use name=value with a number from 0 to 1, e.g. tests_passed=1")
    return name.strip(), number


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f" [... {len(text) - MAX_TEXT} more characters not kept]"


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    message = str(first.get("msg", "")).removeprefix("Value error, ")
    return message or str(exc)


# -- one verdict from several statements ---------------------------------------------------------


@dataclass(slots=True)
class Feedback:
    text: str
    source: str
    at: str


@dataclass(slots=True)
class HostVerdict:
    """The host's outcomes of one run read as one: the last `reference` and `success` given (and who gave
    them), each reward's last value, every feedback text in order. `outcomes` counts the statements."""

    reference: str | None = None
    reference_by: str | None = None
    success: bool | None = None
    success_by: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    feedback: list[Feedback] = field(default_factory=list)
    outcomes: int = 0

    @property
    def judges(self) -> bool:
        """Did the host say how the run went (a success or a reward), not only what the answer is?"""
        return self.success is not None or bool(self.rewards)


def merge(outcomes: Iterable[HostOutcome]) -> HostVerdict:
    """The verdict of a run's outcomes, in the order they were recorded: the last value of a field wins."""
    verdict = HostVerdict()
    for outcome in outcomes:
        verdict.outcomes += 1
        if outcome.reference is not None:
            verdict.reference, verdict.reference_by = outcome.reference, outcome.source
        if outcome.success is not None:
            verdict.success, verdict.success_by = outcome.success, outcome.source
        verdict.rewards.update(outcome.rewards)
        if outcome.feedback is not None:
            verdict.feedback.append(Feedback(outcome.feedback, outcome.source, outcome.at))
    return verdict


__all__ = ["HostOutcome", "HostVerdict", "Feedback", "make_outcome", "merge", "parse_reward"]
