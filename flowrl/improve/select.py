"""Step 3 of a `flowrl improve` round, select: the round's training set from the runs and their verdicts, kept in
`round-<r>/select.json` (reused on a second call).

- SFT / KTO (`_select`): every run collected so far, labelled by the grade; SFT keeps the right ones (rejection
  sampling), KTO every one; `--control unfiltered` also draws as many runs without looking at the grade;
- GRPO (`_select_groups`): this round's runs only (sampled by the adapter the round trains on from), grouped by
  task and rewarded 1 right / 0 wrong; groups whose runs all got one grade are dropped;
- `--from-store` (`_select_stored`): the store's recorded runs (`flowrl.improve.from_store`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrl.data import DatasetFilter, DatasetPipeline
from flowrl.improve.config import ImproveConfig, ImproveError
from flowrl.improve.from_store import select_from_store
from flowrl.methods import get_method, make_builder
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import score_store
from flowrl.store.files import atomic_write_bytes

__all__ = ["TRAINED_AS", "Selection", "build_set", "rows_of"]

# what a round trains each improve method as: GRPO replays the groups the engine sampled (offline GRPO, with their
# sampling log-probabilities), so rollouts go through the batched policy engine, not the trainer's generate
TRAINED_AS = {"sft": "sft", "kto": "kto", "grpo": "grpo-offline"}


class Selection:
    """Selection for the loop whose config is `cfg`, runs in `store`, held-out tasks `eval_tasks`."""

    def __init__(self, cfg: ImproveConfig, store: Any, eval_tasks: list[Any], on_stage: Callable[[str, str], None]):
        self.cfg, self.store, self.eval_tasks, self.on_stage = cfg, store, eval_tasks, on_stage
        self.out = cfg.out

    def select(self, r: int) -> dict[str, Any]:
        """The round's datasets (`selected`, `control`: their folders) and counts, kept in `select.json`: from the
        runs collected so far, or with `--from-store` from the store's recorded runs."""
        folder = self.out / f"round-{r}"
        marker = folder / "select.json"
        if marker.exists():
            done = json.loads(marker.read_text())
            self.on_stage("select", f"round {r}: {done['n_selected']} runs selected (reused)")
        else:
            if self.cfg.from_store is not None:
                done = self._select_stored(r, folder)
            elif get_method(self.cfg.method).is_grpo:
                done = self._select_groups(r, folder)
            else:
                done = self._select(r, folder)
            atomic_write_bytes(marker, json.dumps(done, indent=2, default=str).encode("utf-8"))
        return {k: (folder / v if k in ("selected", "control") else v) for k, v in done.items()}

    def _select(self, r: int, folder: Path) -> dict[str, Any]:
        store = self.store
        with RewardEngine() as engine:
            score_store(store, engine)
        verdicts = self.verdicts(r)
        traces = [t for t in store.iter_traces() if t.session_id in verdicts]
        right = [t for t in traces if verdicts[t.session_id]]
        if not right:
            raise ImproveError(
                f"round {r}: no run was graded right in {len(traces)} runs, so there is nothing to "
                "learn from: raise --samples or --temperature, or use easier --train-tasks"
            )
        for t in traces:  # the grade is the label: what rejection sampling selects on
            t.label, t.label_source = verdicts[t.session_id], "engine"
        on_right = get_method(self.cfg.method).trains_on_right_runs  # rejection sampling (SFT), else every run (KTO)
        done: dict[str, Any] = {
            "n_selected": len(right) if on_right else len(traces),
            "n_right": len(right),
            "n_runs": len(traces),
        }
        chosen = right if on_right else traces
        done["longest_tokens"] = _longest(traces)
        self.build(folder / "data-selected", chosen)
        done["selected"] = "data-selected"
        if self.cfg.control == "unfiltered":
            rng = random.Random(self.cfg.seed + r)
            control = rng.sample(traces, k=min(len(traces), len(right)))
            for t in control:
                t.label = True  # SFT takes every drawn run, right or wrong
            self.build(folder / "data-control", control, method="sft")
            done["control"] = "data-control"
        self.on_stage(
            "select",
            f"round {r}: {len(right)} of {len(traces)} runs right; {done['n_selected']} in the "
            f"{self.cfg.method} set" + (f", {len(right)} drawn for the control" if "control" in done else ""),
        )
        return done

    def _select_groups(self, r: int, folder: Path) -> dict[str, Any]:
        """GRPO: the round's own runs (on-policy: sampled by the adapter this round trains on from), grouped by
        task, each rewarded 1 when graded right and 0 when wrong; a group whose runs all got the same grade has
        no advantage to learn from and is dropped (the offline GRPO builder)."""
        store = self.store
        with RewardEngine() as engine:
            score_store(store, engine)  # secondary rewards, for reports; the grade alone is the GRPO reward
        verdicts = self.verdicts(r, rounds=[r])
        traces = [t for t in store.iter_traces() if t.session_id in verdicts]
        for t in traces:  # the reward it is trained on, kept on the stored run for review and the report
            t.reward_score = 1.0 if verdicts[t.session_id] else 0.0
            t.label, t.label_source = verdicts[t.session_id], "engine"
            store.update(t)
        right = sum(verdicts[t.session_id] for t in traces)
        cut = sum(_cut(t, self.cfg.reply_tokens) for t in traces)
        by_task: dict[str, set[bool]] = {}
        for t in traces:
            by_task.setdefault(str(t.group_key), set()).add(verdicts[t.session_id])
        if not any(len(v) == 2 for v in by_task.values()):
            raise ImproveError(
                f"round {r}: no task had both right and wrong runs among its {self.cfg.runs_per_task}, so GRPO has "
                "no advantage to learn from: raise --samples or --temperature, or use tasks nearer the agent's reach"
            )
        self.build(folder / "data-selected", traces, method=TRAINED_AS["grpo"])
        groups = rows_of(folder / "data-selected")
        self.on_stage(
            "select",
            f"round {r}: {right} of {len(traces)} runs right; {groups} of {len(by_task)} tasks have right and wrong "
            f"runs (their groups are the grpo set; the others are all right or all wrong); {cut} runs had a reply "
            f"cut at --reply-tokens {self.cfg.reply_tokens} (no loss on them)",
        )
        return {
            "n_selected": groups * self.cfg.runs_per_task,
            "n_right": right,
            "n_runs": len(traces),
            "groups": groups,
            "groups_all_right": sum(v == {True} for v in by_task.values()),
            "groups_all_wrong": sum(v == {False} for v in by_task.values()),
            "runs_cut": cut,
            "longest_tokens": _longest(traces),
            "selected": "data-selected",
        }

    def verdicts(self, r: int, rounds: list[int] | None = None) -> dict[str, bool]:
        """The user's grade of each run collected in `rounds` (every round up to r by default), as collect recorded
        it: the one verdict selection uses."""
        verdicts: dict[str, bool] = {}
        for k in rounds or range(1, r + 1):
            collected = self.out / f"round-{k}" / "collect.json"
            recorded = json.loads(collected.read_text()).get("verdicts")
            if recorded is None:
                raise ImproveError(
                    f"{collected} has no verdicts (an older flowrl wrote it): delete it to collect again"
                )
            verdicts.update(recorded)
        return verdicts

    def _select_stored(self, r: int, folder: Path) -> dict[str, Any]:
        """Round 1 of `--from-store`: the store's runs, by their verdicts (`flowrl.improve.from_store`)."""
        spec = str(self.cfg.from_store)
        got = select_from_store(
            spec,
            [t.query for t in self.eval_tasks],
            self.cfg.method,
            control=self.cfg.control == "unfiltered",
            seed=self.cfg.seed + r,
            unlabelled=self.cfg.unlabelled,
            confidence=self.cfg.confidence,
            check_outcomes=self.cfg.check_outcomes,
        )
        self.on_stage("select", f"round {r}: {got.describe(spec, self.cfg.method)}")
        if not got.chosen or (got.right == 0 and get_method(self.cfg.method).trains_on_right_runs):
            raise ImproveError(
                f"round {r}: no stored run in {spec} was judged right, so there is nothing to learn from: record "
                "outcomes (flowrl traces annotate, record_outcome) or label runs in flowrl review"
            )
        done: dict[str, Any] = {
            "n_selected": len(got.chosen),
            "n_right": got.right,
            "n_runs": len(got.traces),
            "from_store": got.summary(),
            "longest_tokens": _longest(got.traces),
            "selected": "data-selected",
        }
        self.build(folder / "data-selected", got.chosen)
        if got.control is not None:
            self.build(folder / "data-control", got.control, method="sft")
            done["control"] = "data-control"
        return done

    def build(self, out: Path, traces: list[Any], method: str | None = None) -> None:
        build_set(out, traces, method or self.cfg.method)


def build_set(out: Path, traces: list[Any], method: str) -> None:
    """The dataset of `method` from `traces` (the verdict as a manual label) in `out`."""
    spec = get_method(method)
    builder = make_builder(method, **(spec.right_runs_only or {}))
    if spec.is_grpo:
        builder.max_group_size = None  # every run of a group: its size is --samples
    # a GRPO group keeps runs that answered alike: how often the policy samples an answer is its advantage
    filters = DatasetFilter(dedupe=not spec.is_grpo)
    DatasetPipeline(builder, val_fraction=0.0, filters=filters).build(
        [t.model_copy(update={"label_source": "manual"}) for t in traces], out, overwrite=True
    )


def _cut(trace: Any, reply_tokens: int) -> bool:
    """A reply of the run stopped at the policy's token limit (it sampled `reply_tokens` ids)."""
    return any(call.token_ids is not None and len(call.token_ids) >= reply_tokens for call in trace.llm_calls)


def _longest(traces: list[Any]) -> int | None:
    """The most tokens one LLM call of these runs held (prompt and reply, as the endpoint returned them); None when
    a run has a call without ids (then nothing bounds its row but the context)."""
    longest = 0
    for trace in traces:
        for call in trace.llm_calls:
            if not call.prompt_token_ids or call.token_ids is None:
                return None
            longest = max(longest, len(call.prompt_token_ids) + len(call.token_ids))
    return longest or None


def rows_of(dataset: Path) -> int:
    """Rows in a dataset folder's train split, as its card counts them."""
    card = json.loads((dataset / "flowrl_dataset.json").read_text(encoding="utf-8"))
    return int(card["counts"]["train"])
