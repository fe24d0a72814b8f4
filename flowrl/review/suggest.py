"""Suggested labels: the learned reward (`flowrl.rewards.learned.LearnedReward`) fitted to your manual labels.

Two agreement figures, both shown on the page with what they mean:

- **as shown**: of your last 50 labels given on this page (this process), in how many the suggestion that was on
  the screen when you pressed the key (made before your label was known) said the same. This is the honest one:
  the model never saw the label it is judged on.
- **current model**: of the last 50 manually labelled traces in the store (by trace time), how many the model
  as fitted now agrees with. It was fitted on those labels, so it flatters the model; the held-out accuracy of
  the last fit (about a fifth of the labels left out, `LearnedReward.fit`) sits beside it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from flowrl.rewards.learned import FitReport, LearnedReward
from flowrl.trace.facts import is_manual_label
from flowrl.trace.schema import ExecutionTrace

WINDOW = 50  # labels the agreement figures look back over


@dataclass(slots=True)
class Suggestion:
    """The learned reward's verdict on one trace: `good` None when the model is not trained yet."""

    good: bool | None
    probability: float | None = None

    @property
    def confidence(self) -> float | None:
        """The probability of the suggested verdict (0.5 to 1)."""
        if self.probability is None:
            return None
        return max(self.probability, 1.0 - self.probability)

    @property
    def text(self) -> str:
        if self.good is None:
            return "no suggestion"
        return f"{'good' if self.good else 'bad'} ({self.confidence:.0%})"


@dataclass(slots=True)
class Agreement:
    shown_agreed: int = 0
    shown_n: int = 0
    model_agreed: int = 0
    model_n: int = 0

    @staticmethod
    def rate(agreed: int, n: int) -> str:
        return f"{agreed} of {n} ({agreed / n:.0%})" if n else "none yet"


class Suggester:
    """Keeps one `LearnedReward`, its predictions (cached per trace until the next refit) and the suggestions
    that were shown when labels were given. Thread-safe: the app's handlers run in a thread pool."""

    def __init__(self, *, min_labels: int = 20, min_per_class: int = 3) -> None:
        self.reward = LearnedReward(min_labels=min_labels, min_per_class=min_per_class)
        self.report: FitReport | None = None
        self._cache: dict[str, float] = {}
        self._shown: deque[tuple[bool, bool]] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()

    def refit(self, traces: Iterable[ExecutionTrace]) -> FitReport:
        """Fit on every manual label among `traces`; keeps the previous model when there are too few."""
        report = self.reward.fit(traces)
        with self._lock:
            self.report = report
            self._cache.clear()
        return report

    @property
    def status(self) -> str:
        r = self.report
        if r is None:
            return "not fitted yet: press r"
        if not self.reward.trained:
            return (
                f"not enough labels yet ({r.n_labels} of {self.reward.min_labels}, {r.n_good} good, {r.n_bad} bad; "
                f"at least {self.reward.min_per_class} of each needed)"
            )
        held = "" if r.heldout_accuracy is None else f"; held-out accuracy {r.heldout_accuracy:.0%} of {r.heldout_n}"
        if r.trained:
            return f"fitted on {r.n_labels} labels ({r.n_good} good, {r.n_bad} bad){held}"
        return f"kept the previous model: {r.reason}"

    def suggest(self, trace: ExecutionTrace) -> Suggestion:
        if not self.reward.trained:
            return Suggestion(None)
        with self._lock:
            p = self._cache.get(trace.trace_id)
        if p is None:
            p = self.reward.probability(trace)
            with self._lock:
                self._cache[trace.trace_id] = p
        return Suggestion(p >= 0.5, p)

    def record(self, shown: bool | None, given: bool) -> None:
        """A label was given while `shown` was the suggestion on the screen (None: there was none)."""
        if shown is not None:
            with self._lock:
                self._shown.append((shown, given))

    def agreement(self, labelled: Iterable[ExecutionTrace]) -> Agreement:
        """The two figures of the module docstring; `labelled` is the store's traces (manual ones are picked)."""
        with self._lock:
            shown = list(self._shown)
        out = Agreement(shown_agreed=sum(s == g for s, g in shown), shown_n=len(shown))
        if self.reward.trained:
            manual = sorted((t for t in labelled if is_manual_label(t)), key=lambda t: (t.timestamp, t.trace_id))
            for trace in manual[-WINDOW:]:
                out.model_n += 1
                out.model_agreed += self.suggest(trace).good == bool(trace.label)
        return out
