"""LearnedReward: a small logistic model fitted to your own manual labels.

Reads the features of a trace: the other rewards' values (from `trace.rewards`, else computed here with the
cheap built-in rewards; a missing value is imputed as 0.5 with a "missing" flag), how many tool calls and
turns, how long the answer and the query are, tokens, duration, and whether the answer is an error.

Learns from traces labelled by hand (`flowrl traces label ID good|bad`, i.e. `label_source == "manual"`, or a
toolboxv2 file with `manual_review`). Fitting holds out about a fifth of the labels (chosen by trace id, so
it is repeatable) to report `heldout_accuracy`, then refits on all of them. The model is standardised
features + L2-regularised logistic regression solved by Newton's method (numpy; no sklearn). It saves to and
loads from a small JSON file.

Value: the model's probability that the trace is good. None until the model is trained on at least
`min_labels` manual labels with at least `min_per_class` of each kind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, require
from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.efficiency import EfficiencyReward
from flowrl.rewards.format import FormatComplianceReward
from flowrl.rewards.grounding import GroundingReward
from flowrl.rewards.syntax import SyntaxValidationReward
from flowrl.rewards.task_completion import TaskCompletionReward
from flowrl.rewards.tool_success import ToolSuccessReward
from flowrl.rewards.views import answer_text, assistant_turns, is_manual_label, tool_calls
from flowrl.store.files import atomic_write_bytes
from flowrl.trace.facts import error_answer
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

FORMAT_TAG = "flowrl-learned-reward"
FEATURE_REWARDS = ("code_execution", "syntax", "tool_success", "task_completion", "efficiency", "format", "grounding")
COUNT_FEATURES = (
    "log_tool_calls",
    "failed_call_share",
    "log_turns",
    "log_answer_chars",
    "log_query_chars",
    "log_tokens",
    "log_duration_s",
    "error_answer",
)
FEATURES: tuple[str, ...] = tuple(
    [f"r_{n}" for n in FEATURE_REWARDS] + [f"missing_{n}" for n in FEATURE_REWARDS] + list(COUNT_FEATURES)
)


@dataclass
class FitReport:
    n_labels: int
    n_good: int
    n_bad: int
    trained: bool
    heldout_accuracy: float | None = None
    heldout_n: int = 0
    reason: str = ""


class LearnedReward(Reward):
    name = "learned"

    def __init__(
        self,
        model: str | Path | None = None,
        min_labels: int = 20,
        min_per_class: int = 3,
        l2: float = 1.0,
        holdout: float = 0.2,
        retrain: bool = True,
        feature_rewards: dict[str, Reward] | None = None,
        balanced: bool = False,
    ) -> None:
        self.model_path = Path(model).expanduser() if model else None
        self.min_labels, self.min_per_class = min_labels, min_per_class
        self.l2, self.holdout, self.retrain = l2, holdout, retrain
        self._feature_rewards = feature_rewards
        self.balanced = balanced
        self.state: dict[str, Any] | None = None
        self.last_fit: FitReport | None = None
        if self.model_path is not None and self.model_path.is_file():
            self.load(self.model_path)

    # -- features ---------------------------------------------------------------------------------------
    def _cheap_rewards(self) -> dict[str, Reward]:
        if self._feature_rewards is None:
            self._feature_rewards = {
                "syntax": SyntaxValidationReward(),
                "tool_success": ToolSuccessReward(),
                "task_completion": TaskCompletionReward(),
                "efficiency": EfficiencyReward(),
                "format": FormatComplianceReward(),
                "grounding": GroundingReward(),
            }
        return self._feature_rewards

    def features(self, trace: ExecutionTrace) -> list[float]:
        values: dict[str, float | None] = {}
        for name in FEATURE_REWARDS:
            if name in trace.rewards:
                values[name] = trace.rewards[name]
            elif name in self._cheap_rewards():
                values[name] = self._cheap_rewards()[name].safe_score(trace).value
            else:
                values[name] = None
        calls = tool_calls(trace)
        judged = [c.failed for c in calls if c.failed is not None]
        tokens = (trace.total_tokens_in or 0) + (trace.total_tokens_out or 0)
        answer = answer_text(trace)
        counts = {
            "log_tool_calls": math.log1p(len(calls)),
            "failed_call_share": (sum(judged) / len(judged)) if judged else 0.0,
            "log_turns": math.log1p(assistant_turns(trace) or 0),
            "log_answer_chars": math.log1p(len(answer)),
            "log_query_chars": math.log1p(len(trace.user_query or "")),
            "log_tokens": math.log1p(tokens),
            "log_duration_s": math.log1p(max(0.0, (trace.execution_duration_ms or 0.0) / 1000.0)),
            "error_answer": 1.0 if error_answer(answer) else 0.0,
        }
        return (
            [0.5 if values[n] is None else float(values[n]) for n in FEATURE_REWARDS]  # type: ignore[arg-type]
            + [1.0 if values[n] is None else 0.0 for n in FEATURE_REWARDS]
            + [counts[n] for n in COUNT_FEATURES]
        )

    # -- fitting ----------------------------------------------------------------------------------------
    @property
    def trained(self) -> bool:
        return self.state is not None

    def _solve(self, x: Any, y: Any) -> tuple[Any, Any, Any, float]:
        np = require("numpy")
        # balanced: each class weighs as much as the other in the loss (n / (2 n_class) a label), so a rare class
        # gets probabilities near 1 where the features say so, instead of being outvoted by the common one
        s = np.ones(len(y))
        if self.balanced:
            n_good = float(y.sum())
            s = np.where(y >= 0.5, len(y) / (2 * max(n_good, 1.0)), len(y) / (2 * max(len(y) - n_good, 1.0)))
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        std[std < 1e-9] = 1.0
        z = np.hstack([(x - mean) / std, np.ones((len(x), 1))])
        w = np.zeros(z.shape[1])
        reg = np.full(z.shape[1], self.l2)
        reg[-1] = 0.0  # the bias is not shrunk
        for _ in range(50):
            p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -30, 30)))
            grad = z.T @ (s * (p - y)) + reg * w
            hess = (z * (s * p * (1 - p))[:, None]).T @ z + np.diag(reg) + 1e-9 * np.eye(z.shape[1])
            step = np.linalg.solve(hess, grad)
            w -= step
            if float(np.abs(step).max()) < 1e-8:
                break
        return mean, std, w[:-1], float(w[-1])

    def fit(self, traces: Iterable[ExecutionTrace]) -> FitReport:
        """Fit on the manually labelled traces among `traces`; keeps the old model when there are too few."""
        np = require("numpy")
        rows, ys, ids = [], [], []
        for t in traces:
            if is_manual_label(t):
                rows.append(self.features(t))
                ys.append(1.0 if t.label else 0.0)
                ids.append(t.trace_id)
        n_good, n = int(sum(ys)), len(ys)
        report = FitReport(n, n_good, n - n_good, False)
        if n < self.min_labels or min(n_good, n - n_good) < self.min_per_class:
            report.reason = (
                f"{n} manual labels ({n_good} good, {n - n_good} bad): need {self.min_labels}, "
                f"with at least {self.min_per_class} of each; label more with `flowrl traces label`"
            )
            self.last_fit = report
            return report
        x, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
        test = np.array([held_out_label(i, self.holdout) for i in ids])
        if test.sum() >= 1 and len(set(y[~test].tolist())) == 2:
            mean, std, w, b = self._solve(x[~test], y[~test])
            pred = (1.0 / (1.0 + np.exp(-(((x[test] - mean) / std) @ w + b)))) >= 0.5
            report.heldout_accuracy = float((pred == (y[test] >= 0.5)).mean())
            report.heldout_n = int(test.sum())
        mean, std, w, b = self._solve(x, y)
        self.state = {
            "format": FORMAT_TAG,
            "version": 1,
            "features": list(FEATURES),
            "mean": mean.tolist(),
            "std": std.tolist(),
            "weights": w.tolist(),
            "bias": b,
            "trained_at": datetime.now().isoformat(),
            **{k: v for k, v in asdict(report).items() if k not in ("trained", "reason")},
        }
        report.trained = True
        self.last_fit = report
        if self.model_path is not None:
            self.save(self.model_path)
        return report

    def prepare(self, traces: Iterable[ExecutionTrace]) -> FitReport | None:
        """Called by the engine before a scoring run: (re)fit on the store's manual labels."""
        if self.trained and not self.retrain:
            return None
        return self.fit(traces)

    # -- persistence ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        if self.state is None:
            raise ConfigError("the learned reward has no model to save: fit it on manual labels first")
        path = Path(path).expanduser()
        atomic_write_bytes(path, json.dumps(self.state, indent=2).encode())
        return path

    def load(self, path: str | Path) -> None:
        path = Path(path).expanduser()
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: cannot read the learned reward's model: {exc}") from exc
        if not isinstance(state, dict) or state.get("format") != FORMAT_TAG or state.get("features") != list(FEATURES):
            raise ConfigError(
                f"{path}: not a flowrl learned-reward model of this version: delete it and rescore to refit"
            )
        self.state = state

    # -- scoring ----------------------------------------------------------------------------------------
    def probability(self, trace: ExecutionTrace) -> float:
        assert self.state is not None
        s = self.state
        z = sum(w * (f - m) / sd for w, f, m, sd in zip(s["weights"], self.features(trace), s["mean"], s["std"]))
        z = max(-30.0, min(30.0, z + s["bias"]))
        return 1.0 / (1.0 + math.exp(-z))

    def score(self, trace: ExecutionTrace) -> RewardResult:
        if self.state is None:
            reason = self.last_fit.reason if self.last_fit and self.last_fit.reason else "not trained yet"
            return RewardResult(None, {"reason": reason})
        return RewardResult(
            self.probability(trace),
            {"n_labels": self.state.get("n_labels"), "heldout_accuracy": self.state.get("heldout_accuracy")},
        )


def held_out_label(trace_id: str, share: float = 0.2) -> bool:
    """Whether a label is one of the `share` that a fit holds out to measure itself (the same ones every time)."""
    return _bucket(trace_id) < share


def _bucket(trace_id: str) -> float:
    """A stable number in [0, 1) from the trace id: which labels are held out."""
    return int(hashlib.sha256(trace_id.encode()).hexdigest()[:8], 16) / 0x1_0000_0000
