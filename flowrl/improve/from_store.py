"""`flowrl improve --from-store STORE`: round 1 trains on the runs a deployment already recorded.

Nothing is collected. Each stored run gets its verdict from the one rule in `flowrl.trace.facts.label_at`: a
manual label, then the host's outcome, then what the reward engine judges. The engine scores the runs here, in
memory: the user's store is read, never written. A run whose query is one of the held-out tasks is left out of
training (the eval would measure memory), and counted.

A run with neither a manual label nor a host outcome is *unlabelled*; `unlabelled` says what it gets:
- `rewards` (the default): the reward engine's verdict, the third step of the one rule;
- `skip`: none; it is left out;
- `learned`: a proposal of the learned reward (`flowrl.rewards.learned`), fitted on the labelled runs (their
  verdicts as labels), where its probability is at least `confidence` or at most 1 - `confidence`; the rest are
  left out. Its agreement with the labels it was not fitted on (about a fifth, chosen by trace id) is measured
  first, at 0.5 and at the threshold, then it is refitted on every label.

A host's outcome is feedback from an app, and some of it is wrong. With `check_outcomes="engine"` (the default) a
host's "right" that the run itself contradicts is left out and counted (`contradiction`): the answer is an error,
every tool call failed, or the run is not grounded (`flowrl.rewards.grounding`: a number it used or stated came
from neither the query nor a tool, or the answer does not carry what its last tool returned). A manual label is
taken as it is, and a host's "wrong" too (no reference-free check can say a run was right).

The selection is the method's: SFT (rejection sampling) takes the runs judged right, KTO every run with a verdict.
The unfiltered control draws as many runs at random from all of them, verdict or not.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from flowrl.methods import get_method
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.grounding import GroundingReward
from flowrl.rewards.learned import LearnedReward, held_out_label
from flowrl.rewards.scoring import apply_results
from flowrl.rewards.tool_success import ToolSuccessReward
from flowrl.store.opener import open_store
from flowrl.trace.facts import answer_text, error_answer, label_at, query_key
from flowrl.trace.schema import ExecutionTrace

# where a verdict came from (`label_at`'s sources), as the round reports it
VERDICT_SOURCES = {"manual": "a manual label", "host": "the host's outcome", "threshold": "the rewards"}
VERDICT_SOURCES["engine"] = VERDICT_SOURCES["threshold"]
VERDICT_SOURCES["learned"] = "the learned reward's proposals"
LABELLED = ("manual", "host")  # the verdicts somebody gave; the rest are the engine's


@dataclass
class StoreSelection:
    """What round 1 takes from a store: every usable run (`traces`, each labelled by its verdict), the ones the
    method trains on (`chosen`), the control's draw, and the counts the round reports."""

    traces: list[ExecutionTrace] = field(default_factory=list)
    chosen: list[ExecutionTrace] = field(default_factory=list)
    control: list[ExecutionTrace] | None = None
    read: int = 0
    held_out: int = 0  # runs of a held-out task's query: not trained on
    verdicts: Counter[str] = field(default_factory=Counter)  # by where the verdict came from
    right: int = 0
    unlabelled: int = 0  # runs without a manual label or a host outcome
    contradicted: Counter[str] = field(default_factory=Counter)  # host "right"s left out, by the run's contradiction
    learned: dict[str, Any] | None = None  # the learned reward's fit, agreement and proposals (unlabelled="learned")

    @property
    def with_verdict(self) -> int:
        return sum(self.verdicts.values())

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "held_out_queries": self.held_out,
            "with_verdict": self.with_verdict,
            "verdicts": dict(self.verdicts),
            "right": self.right,
            "selected": len(self.chosen),
            "control": len(self.control) if self.control is not None else None,
            "unlabelled": self.unlabelled,
            "contradicted": dict(self.contradicted),
            "learned": self.learned,
        }

    def describe(self, store: str, method: str) -> str:
        """One line: how many runs had a verdict, from where, how many were selected and why the rest were not."""
        usable = len(self.traces)
        sources = Counter[str]()
        for name, n in self.verdicts.items():
            sources[VERDICT_SOURCES[name]] += n
        said = ", ".join(f"{n} from {where}" for where, n in sources.most_common()) or "none"
        line = f"{self.read} runs in {store}; {self.with_verdict} with a verdict ({said}), {self.right} judged right"
        if self.learned is not None:
            line += f"; {_learned_line(self.learned)}"
        line += f"; {len(self.chosen)} in the {method} set"
        doubted = sum(self.contradicted.values())
        without = usable - self.with_verdict - doubted
        reasons = [f"{without} without a verdict"] if without > 0 else []
        if doubted:
            why = ", ".join(f"{n} {CONTRADICTIONS[k]}" for k, n in self.contradicted.most_common())
            reasons.append(f"{doubted} the host said were right, contradicted by the run ({why})")
        if get_method(method).trains_on_right_runs and self.with_verdict > self.right:
            reasons.append(f"{self.with_verdict - self.right} judged wrong")
        if self.held_out:
            reasons.append(f"{self.held_out} asked a held-out task's query")
        if reasons:
            line += f"; left out: {', '.join(reasons)}"
        if self.control is not None:
            line += f"; {len(self.control)} drawn for the control"
        return line


def select_from_store(
    spec: str,
    eval_queries: list[str],
    method: str,
    *,
    control: bool = False,
    seed: int = 0,
    unlabelled: str = "rewards",
    confidence: float = 0.9,
    check_outcomes: str = "engine",
) -> StoreSelection:
    """The runs of the store at `spec` (a path or URL), verdicts decided, selected for `method`; `unlabelled`,
    `confidence` and `check_outcomes`: see the module docstring."""
    held = {query_key(q) for q in eval_queries}
    got = StoreSelection()
    for trace in open_store(spec).iter_traces():
        got.read += 1
        if query_key(trace.user_query) in held:
            got.held_out += 1
        else:
            got.traces.append(trace)
    if unlabelled == "rewards":  # the learned reward computes its own features, without the verdicts
        _score_in_memory(got.traces)
    verdicts: list[tuple[ExecutionTrace, bool, str]] = []
    pending: list[ExecutionTrace] = []
    for trace in got.traces:
        label, source = label_at(trace)
        got.unlabelled += source not in LABELLED
        if source not in LABELLED and unlabelled != "rewards":
            pending.append(trace)
        elif label and source == "host" and check_outcomes == "engine" and (doubt := contradiction(trace)):
            got.contradicted[doubt] += 1
        elif label is not None:
            verdicts.append((trace, label, source))
    if unlabelled == "learned":
        got.learned, proposed = _propose([(t, ok) for t, ok, _ in verdicts], pending, confidence)
        verdicts += [(t, ok, "learned") for t, ok in proposed]
    on_right = get_method(method).trains_on_right_runs
    for trace, label, source in verdicts:
        got.verdicts[source] += 1
        got.right += label
        if label or not on_right:
            # the verdict is the label the build uses (the pipeline takes a manual label as it is)
            got.chosen.append(trace.model_copy(update={"label": label, "label_source": "manual"}))
    if control:
        draw = random.Random(seed + 1).sample(got.traces, k=min(len(got.traces), len(got.chosen)))
        got.control = [t.model_copy(update={"label": True, "label_source": "manual"}) for t in draw]
    return got


def _propose(
    labelled: list[tuple[ExecutionTrace, bool]], pending: list[ExecutionTrace], confidence: float
) -> tuple[dict[str, Any], list[tuple[ExecutionTrace, bool]]]:
    """The learned reward fitted on the labelled runs: its agreement on the labels held out of a first fit, then,
    refitted on all of them, its confident proposals for `pending` ((trace, label) pairs)."""
    originals = pending
    as_labels = [_unjudged(t).model_copy(update={"label": ok, "label_source": "manual"}) for t, ok in labelled]
    pending = [_unjudged(t) for t in pending]
    fit_part = [t for t in as_labels if not held_out_label(t.trace_id)]
    test_part = [t for t in as_labels if held_out_label(t.trace_id)]
    info: dict[str, Any] = {"confidence": confidence, "labels": len(as_labels), "unlabelled": len(pending)}
    # balanced classes: right runs are rare in production, and an unweighted fit never becomes sure of one
    first = LearnedReward(holdout=0.0, balanced=True)
    if first.fit(fit_part).trained and test_part:
        scored = [(first.probability(t), t) for t in test_part]
        sure = [(pi, t) for pi, t in scored if max(pi, 1 - pi) >= confidence]
        sure_right = [t for pi, t in sure if pi >= 0.5]
        info.update(
            held_out=len(test_part),
            agreement=sum((pi >= 0.5) == t.label for pi, t in scored) / len(test_part),
            held_out_confident=len(sure),
            confident_agreement=(sum((pi >= 0.5) == t.label for pi, t in sure) / len(sure)) if sure else None,
            # of the held-out runs it was sure were right, how many the labels say were: the proposals' precision
            held_out_sure_right=len(sure_right),
            sure_right_precision=(sum(bool(t.label) for t in sure_right) / len(sure_right)) if sure_right else None,
        )
    model = LearnedReward(holdout=0.0, balanced=True)
    report = model.fit(as_labels)
    if not report.trained:
        info["reason"] = report.reason
        return info, []
    proposed = []
    for trace, bare in zip(originals, pending, strict=True):
        p = model.probability(bare)
        if max(p, 1 - p) >= confidence:
            proposed.append((trace, p >= 0.5))
    info.update(proposed_right=sum(ok for _, ok in proposed), proposed_wrong=sum(not ok for _, ok in proposed))
    return info, proposed


CONTRADICTIONS = {
    "error_answer": "an error answer",
    "tools_failed": "every tool call failed",
    # flowrl.rewards.grounding's failures
    "unfounded_input": "a tool given a number from neither the query nor a tool",
    "unfounded_answer": "an answer with a number from neither the query nor a tool",
    "ignores_tool": "an answer without what its last tool returned",
}


def contradiction(trace: ExecutionTrace) -> str | None:
    """Why the run itself says it did not succeed (a key of CONTRADICTIONS), None when nothing does; read from
    the run alone, without the host's outcome or any reference."""
    if error_answer(answer_text(trace)):
        return "error_answer"
    if ToolSuccessReward().safe_score(trace).value == 0.0:
        return "tools_failed"
    grounding = GroundingReward().safe_score(trace)
    if grounding.value == 0.0:
        return str(grounding.details["failed"])
    return None


def _unjudged(trace: ExecutionTrace) -> ExecutionTrace:
    """The run as the learned reward reads it: without the host's outcomes and the rewards scored with them (the
    task-completion reward takes the host's success as its verdict), so a labelled run shows it no more of its
    verdict than an unlabelled one; the cheap rewards are computed again on this copy."""
    return trace.model_copy(update={"outcomes": [], "rewards": {}, "reward_score": None, "label": None})


def _learned_line(info: dict[str, Any]) -> str:
    if "reason" in info:
        return f"no proposal for the {info['unlabelled']} unlabelled runs: {info['reason']}"
    said = f"the learned reward, fitted on {info['labels']} labelled runs"
    if "agreement" in info:
        sure = info["confident_agreement"]
        said += f" (held-out agreement {info['agreement']:.0%} on {info['held_out']}; " + (
            f"{sure:.0%} on the {info['held_out_confident']} it was sure of" if sure is not None else "sure of none"
        )
        precision = info["sure_right_precision"]
        if precision is not None:
            said += f"; {precision:.0%} of the {info['held_out_sure_right']} it was sure were right were"
        said += ")"
    left = info["unlabelled"] - info["proposed_right"] - info["proposed_wrong"]
    return (
        f"{said}, proposed {info['proposed_right']} right and {info['proposed_wrong']} wrong of "
        f"{info['unlabelled']} unlabelled runs at confidence {info['confidence']} ({left} not sure)"
    )


def _score_in_memory(traces: list[ExecutionTrace]) -> None:
    """Rewards for the runs that have none, on the copies read here (the store keeps what it had)."""
    unscored = [t for t in traces if not t.rewards]
    if not unscored:
        return
    with RewardEngine() as engine:
        if engine.needs_preparation():
            engine.prepare(traces)
        for trace, results in zip(unscored, engine.compute_batch(unscored), strict=True):
            apply_results(trace, results, engine)
