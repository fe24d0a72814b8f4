"""`flowrl improve`: collect -> score -> select -> train -> eval, in rounds, for any agent.

Every agent runs on a `Policy`: an OpenAI-compatible endpoint (`flowrl.serve.policies.PolicyServer`: the base
model loaded once, each round's LoRA adapter beside it, chosen per request by the policy's name, with the round's
sampling fixed), so the agent's own code loads no model.

Each round r:
1. **collect**: the agent runs every train task `samples` times at `temperature` > 0 with the current policy
   (the base model in round 1, or the production `adapter` when given; round r-1's adapter after), hooked, into
   the store `out/traces`; each run is graded by `grade` as it ends, and its trace gets its task's reference
   answer and task key (the host knows them); the verdicts are kept in `out/round-<r>/collect.json`;
2. **score**: the reward engine scores the round's traces (secondary rewards, for reports);
3. **select**: rejection sampling (STaR / ReST-EM) on exactly `grade`'s verdicts: the runs graded right in
   every round so far become an SFT set (`--method kto`: every run, labelled by its verdict);
   `control="unfiltered"` also builds an SFT set of as many runs drawn from all of them, right or wrong, so
   learning from the reward can be told apart from learning the format;
4. **train**: a LoRA adapter on the base model (`flowrl train`), from scratch each round on the set so far (from
   the production `adapter`'s weights when given: `flowrl train --init-adapter`), for the steps and rows a step
   that the set's size gives on any machine (`flowrl.improve.budget`), recorded in `out/round-<r>/train.json`;
5. **eval**: the base arm (once, cached) and the round's arm(s) on the held-out tasks, the agent's whole loop,
   greedy by default; `out/round-<r>/eval.json` holds the per-task outcomes (with each task's family, when it
   has one), rates with Wilson intervals and McNemar's exact test against the base and of the round against its
   control, and, with `--hold-out-families`, the families never trained on apart (`flowrl.evaluate.results`);
   `out/eval-runs/<arm>.jsonl.gz` every graded run's answer and tool calls (`flowrl.evaluate.runs`);
   `out/round-<r>/rewards.json` each reward's mean per arm over the same tasks (`flowrl.evaluate.secondary`).

Every stage leaves its output in `out/round-<r>/`, so a second call resumes where the first stopped. A round
with no run graded right stops with one line saying what to change.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowrl.engines.policy import Policy
from flowrl.evaluate.agent import run_tasks
from flowrl.evaluate.results import format_table, summarize, write_eval_json
from flowrl.evaluate.runs import write_runs
from flowrl.evaluate.secondary import format_rewards, reward_means, write_rewards_json
from flowrl.improve.agents import source_of
from flowrl.improve.budget import GRPO_ITERATIONS, Budget, grpo_budget, round_budget
from flowrl.improve.config import ImproveConfig, ImproveError
from flowrl.improve.select import TRAINED_AS, Selection, build_set, rows_of
from flowrl.methods import get_method
from flowrl.promote.decide import decide, leaked_tasks, power_problem
from flowrl.promote.history import FILE_NAME as PROMOTIONS
from flowrl.promote.history import Entry, History, fingerprint, sha256_of
from flowrl.serve.policies import PolicyServer
from flowrl.store.files import TraceStore, atomic_write_bytes
from flowrl.train import TrainingConfig, TrainingPipeline

log = logging.getLogger(__name__)

Stage = Callable[[str, str], None]  # (stage, summary)
Progress = Callable[[str, int, int], None]  # (stage, done, total)


AgentFactory = Callable[[Policy], Any]


@dataclass
class RoundResult:
    round: int
    collected: int
    right: int
    selected: int
    adapter: Path
    eval_path: Path
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(data, indent=2, default=str).encode("utf-8"))


class Improve:
    """The loop for one agent. `make_agent(policy)` returns an agent; `grade(task, answer)` says right or
    wrong; tasks have `task_id`, `query` and `answer` (the reference the host knows)."""

    def __init__(
        self,
        make_agent: AgentFactory,
        train_tasks: list[Any],
        eval_tasks: list[Any],
        grade: Callable[[Any, str], bool],
        config: ImproveConfig,
        *,
        on_stage: Stage | None = None,
        on_progress: Progress | None = None,
        policies: Any = None,
    ) -> None:
        overlap = {t.task_id for t in train_tasks} & {t.task_id for t in eval_tasks}
        if overlap:
            raise ImproveError(
                f"{len(overlap)} tasks are both train and held-out (e.g. {sorted(overlap)[0]}): "
                "the eval would measure memory, not improvement"
            )
        trained_unseen = sorted({t.task_id for t in train_tasks if getattr(t, "family", "") in config.unseen_families})
        if trained_unseen:
            raise ImproveError(
                f"{len(trained_unseen)} train tasks are of a held-out family (e.g. {trained_unseen[0]}): take them out "
                "of the train tasks (flowrl.improve.user.hold_out_families)"
            )
        self.make_agent, self.grade, self.cfg = make_agent, grade, config
        self.agents = source_of(make_agent)  # in this process, or in the agent's own Python (AgentProcess)
        self.train_tasks, self.eval_tasks = list(train_tasks), list(eval_tasks)
        self.on_stage = on_stage or (lambda s, m: None)
        self.on_progress = on_progress or (lambda s, d, t: None)
        self.out = config.out
        self.by_id = {t.task_id: t for t in self.train_tasks}
        # serves the policies: `policy(name, adapter, temperature=, seed=) -> Policy`; a PolicyServer when None
        self.policies = policies

    # -- the rounds --------------------------------------------------------------------------------
    def run(self) -> list[RoundResult]:
        if self.policies is not None:
            return self._rounds()
        with PolicyServer(
            self.cfg.base_model,
            engine=self.cfg.engine,
            workdir=self.out,
            slots=self.cfg.slots,
            ctx_per_slot=self.cfg.context,
            max_tokens=self.cfg.reply_tokens,
        ) as self.policies:
            self.on_stage("engine", f"{self.policies.engine} at {self.policies.url}, {self.cfg.slots} slots")
            try:
                return self._rounds()
            finally:
                if self.policies.swap_seconds:
                    swaps = ", ".join(f"{s:.2f}" for s in self.policies.swap_seconds)
                    self.on_stage("engine", f"adapters loaded beside the base model in {swaps} s")
                self.policies = None

    def _rounds(self) -> list[RoundResult]:
        self.out.mkdir(parents=True, exist_ok=True)
        _write_json(
            self.out / "improve.json",
            {"config": asdict(self.cfg), "train_tasks": len(self.train_tasks), "eval_tasks": len(self.eval_tasks)},
        )
        base = self.base_outcomes()
        results = []
        for r in range(1, self.cfg.rounds + 1):
            results.append(self.round(r, base))
        return results

    def round(self, r: int, base: dict[str, bool]) -> RoundResult:
        folder = self.out / f"round-{r}"
        # round 1 collects with what runs today: the production adapter when there is one
        production = Path(self.cfg.adapter) if self.cfg.adapter else None
        previous = self.out / f"round-{r - 1}" / "adapter" if r > 1 else production
        collected, right = self.collect(r, previous) if self.cfg.from_store is None else (0, 0)
        datasets = self.select(r)
        if self.cfg.from_store is not None:
            right = datasets["n_right"]
        longest = datasets.get("longest_tokens")
        if get_method(self.cfg.method).is_grpo:  # RL on from the adapter that sampled the round's groups
            adapters = {f"round-{r}": self.train_grpo(folder / "adapter", datasets["selected"], previous, longest)}
        else:
            adapters = {f"round-{r}": self.train(folder / "adapter", datasets["selected"], self.cfg.method, longest)}
        pairs: tuple[tuple[str, str], ...] = ()
        if "control" in datasets:  # the unfiltered control is SFT on runs drawn without looking at the grade
            adapters[f"control-{r}"] = self.train(folder / "control-adapter", datasets["control"], "sft", longest)
            pairs = ((f"control-{r}", f"round-{r}"),)  # the round against its control, paired
        promoted = self.history().current() if self.cfg.promote else None
        if promoted is not None:  # the round must beat what is promoted now, on the same tasks
            adapters[f"{PROMOTED}-{r}"] = Path(promoted)
            pairs += ((f"{PROMOTED}-{r}", f"round-{r}"),)
        eval_path = folder / "eval.json"
        data = self.evaluate(eval_path, base, adapters, pairs)
        if self.cfg.promote:
            self.promote_round(r, adapters[f"round-{r}"], eval_path, data, promoted)
        return RoundResult(r, collected, right, datasets["n_selected"], adapters[f"round-{r}"], eval_path, data["arms"])

    # -- 6. promote -------------------------------------------------------------------------------------
    def history(self) -> History:
        return History(self.out / PROMOTIONS)

    def promote_round(self, r: int, adapter: Path, eval_path: Path, data: dict[str, Any], promoted: str | None) -> None:
        """`--promote`: the round's adapter replaces what is promoted now (the base model when nothing is) only if
        `flowrl.promote.decide` says it is better; every decision is recorded, a refusal says why in one line."""
        history = self.history()
        if any(e.eval_path == str(eval_path) for e in history.entries()):
            self.on_stage("promote", f"round {r}: already decided (reused)")
            return
        current = f"{PROMOTED}-{r}" if promoted is not None else "base"
        decision = decide(data, candidate=f"round-{r}", current=current)
        reason = decision.reason
        leaked = leaked_tasks(self.eval_tasks, eval_path.parent / "data-selected")
        problem = power_problem(decision.rate_current, decision.n)
        if leaked:
            reason = f"not promoted: the round trained on {len(leaked)} held-out tasks (e.g. {leaked[0]})"
        elif problem:
            reason = f"not promoted: {problem}"
        entry = Entry(
            "promote" if decision.promote and not leaked and not problem else "refuse",
            candidate=str(Path(adapter).resolve()),  # absolute: a server following the record runs elsewhere
            replaced=promoted,
            eval_path=str(eval_path),
            eval_sha256=sha256_of(eval_path),
            held_out=fingerprint(t.task_id for t in self.eval_tasks),
            figures=decision.to_dict(),
            reason=reason,
        )
        uses = history.uses(entry.held_out or "")
        history.append(entry)
        self.on_stage(
            "promote", f"round {r}: {reason}" + (f" (this held-out set served {uses} before)" if uses else "")
        )

    # -- 1. collect ----------------------------------------------------------------------------------
    def store(self) -> Any:
        return TraceStore(self.out / "traces")

    def collect(self, r: int, adapter: Path | None) -> tuple[int, int]:
        marker = self.out / f"round-{r}" / "collect.json"
        if marker.exists():
            done = json.loads(marker.read_text())
            self.on_stage(
                "collect", f"round {r}: {done['runs']} runs already collected, {done['right']} right (reused)"
            )
            return done["runs"], done["right"]
        runs = [_Sample(t, k) for k in range(self.cfg.runs_per_task) for t in self.train_tasks]
        name = f"collect-{r}"
        policy = self.policies.policy(name, adapter, temperature=self.cfg.temperature, seed=self.cfg.seed + r)
        outcomes, stats = self._stage(
            "collect", policy, self.out / "traces", {"improve_round": r}, runs, lambda s: _session(r, s.task_id)
        )
        store = self.store()
        verdicts = {_session(r, sample_id): ok for sample_id, ok in outcomes.items()}
        self.annotate(store, {_session(r, s.task_id): s.task for s in runs})
        right = sum(outcomes.values())
        written = stats.get("written", 0)
        _write_json(marker, {"runs": len(runs), "right": right, "written": written, "verdicts": verdicts})
        self.on_stage(
            "collect",
            f"round {r}: {len(runs)} runs of {len(self.train_tasks)} tasks x {self.cfg.runs_per_task}, "
            f"{right} right ({right / max(1, len(runs)):.1%})",
        )
        return len(runs), right

    def annotate(self, store: Any, tasks: dict[str, Any]) -> None:
        """The host's knowledge on each trace of the round (`tasks`: session id -> task): its task's reference
        answer and task key."""
        for trace in store.iter_traces():
            task = tasks.get(trace.session_id)
            if task is None:
                continue
            if trace.metadata.get("reference_answer") == task.answer and trace.group_key == task.task_id:
                continue
            trace.metadata["reference_answer"] = task.answer
            trace.group_key = task.task_id
            store.update(trace)

    # -- 2. score, 3. select ---------------------------------------------------------------------------
    def select(self, r: int) -> dict[str, Any]:
        """The round's datasets and counts (`flowrl.improve.select.Selection`)."""
        return Selection(self.cfg, self.store(), self.eval_tasks, self.on_stage).select(r)

    def build(self, out: Path, traces: list[Any], method: str | None = None) -> None:
        build_set(out, traces, method or self.cfg.method)

    # -- 4. train --------------------------------------------------------------------------------------
    def train(self, out: Path, dataset: Path, method: str, longest: int | None = None) -> Path:
        """A LoRA adapter in `out` on the set in `dataset`, for the steps `round_budget` gives its size, from the
        production adapter when there is one."""
        budget = round_budget(rows_of(dataset), self.cfg.epochs, self.cfg.max_steps)
        production = Path(self.cfg.adapter) if self.cfg.adapter else None  # the deployed model, improved
        return self._fit(
            out, budget, method=method, dataset=dataset, init_adapter=production, max_length=self.max_length(longest)
        )

    def train_grpo(self, out: Path, dataset: Path, start: Path | None, longest: int | None = None) -> Path:
        """GRPO on the round's groups (offline GRPO replays them, with the log-probabilities the engine sampled
        them with), from `start`, the adapter that sampled them; `grpo_budget` sets the steps. The longest run
        sizes the micro-batch, as for SFT (a batch of 4 agent runs of 1,000+ tokens took 15 GB on a CPU)."""
        k = self.cfg.runs_per_task
        budget = grpo_budget(rows_of(dataset), k, self.cfg.max_steps)
        options = {
            "num_generations": k,
            "max_length": self.max_length(longest),
            "trl_args": {"num_iterations": GRPO_ITERATIONS},
        }
        return self._fit(out, budget, method=TRAINED_AS["grpo"], dataset=dataset, init_adapter=start, **options)

    def _fit(self, out: Path, budget: Budget, **fields: Any) -> Path:
        """Train into `out` (reused when it holds an adapter) for `budget`'s steps, and record what it took in
        `train.json` beside the round's eval.json."""
        name = out.relative_to(self.out).as_posix()
        if (out / "adapter_config.json").exists():
            self.on_stage("train", f"{name} already trained (reused)")
            return out
        options = {**fields, **self.cfg.train_options}
        if "gradient_accumulation_steps" not in options:  # a user's own accumulation decides the batch
            options.setdefault("effective_batch_size", budget.effective_batch)
        cfg = TrainingConfig(
            base_model=self.cfg.base_model,
            output_dir=out,
            max_steps=budget.steps,
            learning_rate=self.cfg.learning_rate,
            progress_bar=False,
            overwrite=True,
            seed=self.cfg.seed,
            **options,
        )
        result = TrainingPipeline(cfg).run()
        settings = result.settings
        record = {
            **budget.to_dict(),
            "method": cfg.method,
            "init_adapter": None if cfg.init_adapter is None else str(cfg.init_adapter),
            "steps_taken": result.global_step,
            "effective_batch_size": settings.get("effective_batch_size"),
            "per_device_train_batch_size": settings.get("per_device_train_batch_size"),
            "gradient_accumulation_steps": settings.get("gradient_accumulation_steps"),
            "profile": settings.get("profile"),
            "learning_rate": cfg.resolved_learning_rate,
            "train_seconds": round(result.train_seconds, 1),
            "loss": result.last_metrics.get("loss"),
        }
        _merge_json(out.parent / "train.json", {name: record})
        self.on_stage(
            "train",
            f"{name}: {budget.describe()}, loss {result.last_metrics.get('loss', float('nan')):.3f}",
        )
        return out

    def max_length(self, longest: int | None) -> int:
        """The longest row training takes: the longest run of the rounds so far as the endpoint counted it (its
        captured ids, a little room for the template's closing tokens), at most the served context; the served
        context when a run has no captured ids. Short rows then train as many at a time as the hardware profile
        allows (flowrl.train.hardware sizes the batch by this)."""
        if longest is None:
            return self.cfg.context
        return min(self.cfg.context, longest + 64)

    # -- 5. eval ----------------------------------------------------------------------------------------
    def _eval_arm(self, name: str, adapter: Path | None) -> dict[str, bool]:
        policy = self.policies.policy(
            f"eval-{name}", adapter, temperature=self.cfg.eval_temperature, seed=self.cfg.seed
        )
        outcomes, _stats = self._stage(
            f"eval {name}", policy, self.out / "eval-traces" / name, {}, self.eval_tasks, _eval_session
        )
        self.publish(name, outcomes)
        return outcomes

    def publish(self, arm: str, outcomes: dict[str, bool]) -> None:
        """The arm's graded runs, answer and tool calls, as `out/eval-runs/<arm>.jsonl.gz` (`flowrl.evaluate.runs`)."""
        path = self.out / "eval-runs" / f"{arm}.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_runs(path, self.out / "eval-traces" / arm, self.eval_tasks, outcomes, arm=arm, session=_eval_session)

    def _stage(
        self,
        stage: str,
        policy: Policy,
        store: Path,
        metadata: dict[str, Any],
        tasks: list[Any],
        session: Callable[[Any], str],
    ) -> tuple[dict[str, bool], dict[str, int]]:
        """Every task through the agent opened on `policy` and hooked into `store` (each run under the session id
        `session(task)`), graded; (task_id -> outcome, the hook's counters)."""

        async def run(agent: Any, task: Any) -> str:
            return str(await agent.a_run(task.query, session(task)))

        with self.agents.open(
            policy,
            store=store,
            metadata=metadata,
            hook_options=self.cfg.hook_options,
            concurrency=self.cfg.concurrency,
        ) as opened:
            outcomes = asyncio.run(
                run_tasks(
                    opened,
                    tasks,
                    self.grade,
                    run=run,
                    concurrency=self.cfg.concurrency,
                    on_done=lambda n: self.on_progress(stage, n, len(tasks)),
                )
            )
        return outcomes, opened.stats

    def base_outcomes(self) -> dict[str, bool]:
        path = self.out / "base-outcomes.json"
        if path.exists():
            self.on_stage("eval", "base: outcomes already measured (reused)")
            outcomes = json.loads(path.read_text())
            if not (self.out / "eval-runs" / "base.jsonl.gz").exists():  # an earlier flowrl did not publish them
                self.publish("base", outcomes)
            return outcomes
        outcomes = self._eval_arm("base", Path(self.cfg.adapter) if self.cfg.adapter else None)
        _write_json(path, outcomes)
        right = sum(outcomes.values())
        self.on_stage("eval", f"base: {right} of {len(outcomes)} held-out tasks right")
        return outcomes

    def evaluate(
        self, path: Path, base: dict[str, bool], adapters: dict[str, Path], pairs: tuple[tuple[str, str], ...] = ()
    ) -> dict[str, Any]:
        """Every arm on the held-out tasks, into `path`: each arm against the base, and each (a, b) of `pairs`."""
        if path.exists():
            data = json.loads(path.read_text())
            self.on_stage("eval", f"{path.relative_to(self.out)} already written (reused)")
            return data
        per_arm = {"base": base}
        for name, adapter in adapters.items():
            per_arm[name] = self._eval_arm(name, adapter)
        outcomes = {t.task_id: {arm: per_arm[arm][t.task_id] for arm in per_arm} for t in self.eval_tasks}
        families = {t.task_id: t.family for t in self.eval_tasks if getattr(t, "family", "")}
        data = summarize(
            outcomes,
            base="base",
            pairs=list(pairs),
            families=families,
            unseen=self.cfg.unseen_families & set(families.values()),
        )
        write_eval_json(path, data)
        for line in format_table(data):
            self.on_stage("eval", line)
        self.secondary(path.parent / "rewards.json", list(per_arm))
        return data

    def secondary(self, path: Path, arms: list[str]) -> None:
        """Each reward's mean per arm over the same held-out tasks (`flowrl.evaluate.secondary`)."""
        stores = {arm: self.out / "eval-traces" / arm for arm in arms}
        data = reward_means(stores, [t.task_id for t in self.eval_tasks])
        write_rewards_json(path, data)
        for line in format_rewards(data):
            self.on_stage("rewards", line)


def _merge_json(path: Path, entries: dict[str, Any]) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    _write_json(path, {**data, **entries})


PROMOTED = "promoted"  # with --promote, round r's eval has the model promoted now as arm "promoted-<r>"


def _eval_session(task: Any) -> str:
    return f"eval-{task.task_id}"


def _session(r: int, sample_id: str) -> str:
    """The session id of a collection run (unique across rounds and samples; nothing reads data back out of it)."""
    return f"improve-r{r}-{sample_id}"


@dataclass(frozen=True)
class _Sample:
    """One collection run: a train task, sampled the k-th time (ids stay unique across samples)."""

    task: Any
    k: int

    @property
    def task_id(self) -> str:
        return f"{self.task.task_id}#{self.k}"

    @property
    def query(self) -> str:
        return self.task.query

    @property
    def answer(self) -> str:
        return self.task.answer


def improve(
    make_agent: AgentFactory,
    train_tasks: list[Any],
    eval_tasks: list[Any],
    grade: Callable[[Any, str], bool],
    config: ImproveConfig,
    **options: Any,
) -> list[RoundResult]:
    """The loop for your own agent (see the module docstring); returns one result per round. `options`:
    `on_stage`, `on_progress`, `policies` (see `Improve`)."""
    return Improve(make_agent, train_tasks, eval_tasks, grade, config, **options).run()
