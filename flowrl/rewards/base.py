"""The reward contract every reward implements.

A reward scores one trace (`score`) or many (`score_batch`) and returns `RewardResult(value, details)`
with `value` in [0, 1], or None for "cannot judge here" (never 0 for that). A reward that crashes is not
"cannot judge": `safe_score` and `score_safely` turn its exception into `RewardResult(None, error=...)`, which
the engine and `flowrl score` count as an error (see engine.py and scoring.py).

Any reward can also be handed to TRL's GRPOTrainer as a reward function through `as_reward_func()`:
`(prompts, completions, **kwargs) -> list[float | None]`. TRL reads None as "not applicable" and drops it
from that completion's weighted sum, which scores it as 0 against its siblings. So when the reward crashes on
a completion, the function returns None for every completion of that prompt in the call: the reward then
drops out of the whole group alike, and the group's advantages compare like with like. Crashes are logged
(the first with its traceback), counted in the function's `stats` and sent to TRL's `log_metric` as
`flowrl/<name>/errors`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flowrl.errors import FlowRLError
from flowrl.trace.schema import ExecutionTrace
from flowrl.trace.transcript import completion_text

log = logging.getLogger(__name__)

EXECUTED_TRACE = "flowrl_trace"  # the rollout's extra key holding each completion's executed trace


def executed_trace(traces: Any, i: int, n: int) -> ExecutionTrace | None:
    """The i-th of `n` executed traces a rollout returned (an ExecutionTrace or its dict; None: the run was not
    captured, so no reward can judge it)."""
    if not isinstance(traces, list) or len(traces) != n:
        raise FlowRLError(
            f"the rollout's {EXECUTED_TRACE!r} must hold one trace per completion ({n}), got "
            f"{type(traces).__name__} of {len(traces) if isinstance(traces, list) else '?'}: fix the rollout"
        )
    trace = traces[i]
    if trace is None or isinstance(trace, ExecutionTrace):
        return trace
    if isinstance(trace, dict):
        return ExecutionTrace.model_validate(trace)
    raise FlowRLError(
        f"the rollout's {EXECUTED_TRACE!r}[{i}] is a {type(trace).__name__}, not a trace: fix the rollout"
    )


@dataclass
class RewardResult:
    """`value` None and `error` None: the reward cannot judge this trace. `error` set: the reward crashed on it
    (the value is then None, and the message is also kept in `details["error"]`, which the store keeps)."""

    value: float | None
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None:
            self.value = None
            if "error" not in self.details:
                self.details = {**self.details, "error": self.error}
        elif self.value is not None:
            v = float(self.value)
            if v != v:  # NaN is "cannot judge"
                self.value = None
            else:
                self.value = min(1.0, max(0.0, v))


def crash_message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_crash_lock = threading.Lock()


def note_crash(reward: Any, exc: BaseException, where: str, count: int = 1) -> str:
    """Count `count` results lost to a reward's own exception on `reward.crashes`, log it (the first crash of
    a reward with its traceback, later ones at debug level) and return the error message."""
    name = getattr(reward, "name", type(reward).__name__)
    with _crash_lock:
        first = not getattr(reward, "crashes", 0)
        try:
            reward.crashes = getattr(reward, "crashes", 0) + count
        except AttributeError:  # a reward with __slots__: logged, not counted
            pass
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "flowrl: reward %s crashed on %s: %s",
        name,
        where,
        crash_message(exc),
        exc_info=first,
    )
    return crash_message(exc)


def score_safely(reward: Any, traces: list[ExecutionTrace]) -> list[RewardResult]:
    """`reward.score_batch(traces)`, one result per trace, with the reward's own failures as errored results:
    an exception, a wrong number of results, or a result that is not a RewardResult."""
    try:
        results = list(reward.score_batch(traces))
        if len(results) != len(traces):
            raise ValueError(f"score_batch returned {len(results)} results for {len(traces)} traces")
    except Exception as exc:  # one broken reward must not sink the others: counted as errors instead
        message = note_crash(reward, exc, f"a batch of {len(traces)}", len(traces))
        return [RewardResult(None, error=message) for _ in traces]
    out = []
    for result in results:
        if not isinstance(result, RewardResult):
            wrong = TypeError(f"score_batch returned {result!r}, not a RewardResult")
            result = RewardResult(None, error=note_crash(reward, wrong, "one trace"))
        out.append(result)
    return out


def prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") or "" for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def completion_tool_calls(completion: Any) -> list[dict[str, Any]]:
    """OpenAI-format tool calls in a conversational completion (empty for plain text)."""
    calls: list[dict[str, Any]] = []
    if isinstance(completion, list):
        for m in completion:
            if isinstance(m, dict) and m.get("role") == "assistant":
                calls.extend(m.get("tool_calls") or [])
    return calls


class Reward:
    """Base class. Subclasses set `name` and implement `score`; `score_batch` may be overridden
    when batching is cheaper (the sandbox, the judge)."""

    name: str = "reward"
    crashes: int = 0  # results this reward lost to its own exceptions (see note_crash)

    def score(self, trace: ExecutionTrace) -> RewardResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def score_batch(self, traces: Iterable[ExecutionTrace]) -> list[RewardResult]:
        return [self.safe_score(t) for t in traces]

    def safe_score(self, trace: ExecutionTrace) -> RewardResult:
        """`score`, with a failure of the reward itself turned into an errored result, counted and logged."""
        try:
            return self.score(trace)
        except Exception as exc:  # a broken reward must not sink a whole scoring run; it is an error, not None
            return RewardResult(None, error=note_crash(self, exc, f"trace {trace.trace_id}"))

    def trace_from_completion(self, prompt: Any, completion: Any, **columns: Any) -> ExecutionTrace:
        """Build the trace a fresh GRPO completion stands for, so `score` can judge it."""
        messages: list[dict[str, Any]] = []
        if isinstance(prompt, list):
            messages.extend(m for m in prompt if isinstance(m, dict))
        else:
            messages.append({"role": "user", "content": prompt_text(prompt)})
        if isinstance(completion, list):
            messages.extend(m for m in completion if isinstance(m, dict))
        else:
            messages.append({"role": "assistant", "content": completion_text(completion)})
        metadata = {
            k: v for k, v in columns.items() if k not in ("trainer_state", "log_extra", "log_metric", "completion_ids")
        }
        return ExecutionTrace(
            user_query=prompt_text(prompt),
            final_response=completion_text(completion),
            messages=messages,
            source="live",
            metadata={"grpo_columns": metadata},
        )

    def as_reward_func(self) -> Callable[..., list[float | None]]:
        """This reward as a TRL GRPOTrainer reward function. When the reward crashes on a completion, it returns
        None for every completion of the same prompt in the call (see the module docstring); its `stats` count
        calls, completions, errors and the completions voided that way.

        When the rollout passes the executed trajectories (TRL gives a rollout's extra key `flowrl_trace` to reward
        functions as a keyword, one per completion), the reward judges those traces, tool results and all, instead
        of a trace rebuilt from the completion's decoded text."""
        stats = {"calls": 0, "completions": 0, "errors": 0, "voided": 0}

        def reward_func(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
            n = len(completions)
            traces, groups = [], []
            executed = kwargs.pop(EXECUTED_TRACE, None)
            for i in range(n):
                prompt = prompts[i] if i < len(prompts) else ""
                cols = {k: (v[i] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
                if executed is not None:  # a rollout ran the agent: judge what it did, not the decoded text
                    traces.append(executed_trace(executed, i, n))
                else:
                    traces.append(self.trace_from_completion(prompt, completions[i], **cols))
                groups.append(json.dumps(prompt, sort_keys=True, default=str))
            judged = [t for t in traces if t is not None]
            scored = iter(score_safely(self, judged) if judged else [])
            results = [
                next(scored) if t is not None else RewardResult(None, {"reason": "run not captured"}) for t in traces
            ]
            crashed = {g for g, r in zip(groups, results) if r.error is not None}
            values = [None if g in crashed else r.value for g, r in zip(groups, results)]
            errors = sum(r.error is not None for r in results)
            voided = sum(g in crashed for g in groups)
            stats["calls"] += 1
            stats["completions"] += n
            stats["errors"] += errors
            stats["voided"] += voided
            if errors:  # the first time as a warning, then at debug level: `stats` and log_metric count them
                log.log(
                    logging.WARNING if stats["errors"] == errors else logging.DEBUG,
                    "flowrl: reward %s crashed on %d of %d completions; None for the %d completions of their "
                    "prompts (%d errors so far, see reward_func.stats)",
                    self.name,
                    errors,
                    n,
                    voided,
                    stats["errors"],
                )
            log_metric = kwargs.get("log_metric")
            if callable(log_metric):
                log_metric(f"flowrl/{self.name}/errors", float(errors))
            return values

        reward_func.__name__ = f"flowrl_{self.name}"
        reward_func.stats = stats  # type: ignore[attr-defined]
        return reward_func
