"""Give a FlowAgent tools to train, export and switch to its own improved model.

    from flowrl.rl_tools import register_rl_tools
    tools = register_rl_tools(agent)                 # runs under $FLOWRL_HOME/runs (or ~/.local/share/flowrl/runs)

(`hooks/flowrl_rl_tools.py` is the same as a drop-in file: copy it next to an application that imports
`flowrl_rl_tools`, as toolboxv2's rl module was imported.)

It registers, with `agent.add_tool(func, name=..., description=...)`, the five tools toolboxv2's rl
module exposed (same names, so prompts written for it keep working):

* `start_rl_training(model_name, method="sft", dataset="", base_model="", extra_args="")` starts
  `flowrl train` in a background subprocess (output in RUNS/NAME/train.log) and returns at once;
* `check_training_status(model_name="")` tells whether it runs, its exit code and the log's last lines;
* `stop_rl_training(model_name="")` ends that subprocess (SIGTERM, then SIGKILL after 10 s);
* `switch_rl_model(model_name)` exports the run's adapter (`flowrl export`, GGUF q8_0, verified,
  Modelfile, `ollama create flowrl-NAME`) if not done yet and points the agent's fast and complex
  models at `ollama/flowrl-NAME`; `switch_rl_model("original")` switches back. When Ollama is not
  installed the agent is left as it is and the tool returns the `ollama create` command to run;
* `list_rl_models()` lists the runs, their state and their Ollama names.

State lives in one `RLTools` object (no module globals) and in `RUNS/NAME/flowrl_run.json`, so a
restarted host still sees its earlier runs. All tools return short text for the model to read, and
never raise into the agent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from flowrl.export.agent import ollama_model, restore_model, use_model
from flowrl.export.pipeline import ExportPipeline

RUN_FILE = "flowrl_run.json"


def default_runs_dir() -> Path:
    home = os.environ.get("FLOWRL_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".local" / "share" / "flowrl"
    return base / "runs"


def flowrl_command() -> list[str]:
    """How to run the `flowrl` command: the installed script, else this interpreter with flowrl's entry point."""
    exe = shutil.which("flowrl")
    if exe:
        return [exe]
    return [sys.executable, "-c", "import sys; from flowrl.cli import main; sys.exit(main())"]


class RLTools:
    """The state behind the agent tools: runs folder, running subprocesses, the agent's original model."""

    def __init__(
        self,
        agent: Any = None,
        runs_dir: str | os.PathLike[str] | None = None,
        *,
        command: Callable[[], list[str]] = flowrl_command,
        export_quant: str = "q8_0",
    ) -> None:
        self.agent = agent
        self.runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
        self.command = command
        self.export_quant = export_quant
        self._procs: dict[str, subprocess.Popen] = {}
        self._original: dict[str, Any] | None = None
        self._last: str | None = None

    # ------------------------------------------------------------------ records
    def _record_path(self, name: str) -> Path:
        return self.runs_dir / name / RUN_FILE

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._record_path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _write(self, name: str, record: dict[str, Any]) -> None:
        path = self._record_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{RUN_FILE}.partial")
        tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
        os.replace(tmp, path)

    def _state(self, name: str, record: dict[str, Any]) -> str:
        proc = self._procs.get(name)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return "running"
            if record.get("state") == "running":
                record.update(state="completed" if code == 0 else "failed", exit_code=code, ended=time.time())
                self._write(name, record)
        elif record.get("state") == "running":  # started by an earlier host process: ask the OS
            try:
                os.kill(int(record["pid"]), 0)
                return "running"
            except (OSError, KeyError, ValueError):
                record.update(state="unknown (host restarted)")
        return str(record.get("state"))

    def _pick(self, name: str) -> str | None:
        return name or self._last or next(iter(self._procs), None)

    # ------------------------------------------------------------------ tools
    async def start_rl_training(
        self, model_name: str, method: str = "sft", dataset: str = "", base_model: str = "", extra_args: str = ""
    ) -> str:
        """Start `flowrl train` in the background; returns at once. Use check_training_status to follow it."""
        if not model_name or "/" in model_name or model_name.startswith("."):
            return "✗ model_name must be a plain name like my-agent-v1"
        record = self._read(model_name)
        if record and self._state(model_name, record) == "running":
            return f"✗ {model_name} is already training (pid {record.get('pid')})"
        run_dir = self.runs_dir / model_name
        run_dir.mkdir(parents=True, exist_ok=True)
        args = [*self.command(), "train", "--method", method, "--output-dir", str(run_dir / "train")]
        if dataset:
            args += ["--dataset", dataset]
        if base_model:
            args += ["--base-model", base_model]
        args += shlex.split(extra_args)
        log_path = run_dir / "train.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(run_dir),
                start_new_session=True,
            )
        self._procs[model_name] = proc
        self._last = model_name
        self._write(
            model_name,
            {
                "model_name": model_name,
                "method": method,
                "base_model": base_model or None,
                "state": "running",
                "pid": proc.pid,
                "command": args,
                "log": str(log_path),
                "started": time.time(),
                "output_dir": str(run_dir / "train"),
            },
        )
        return f"✓ Training started: {model_name} ({method}), pid {proc.pid}. Log: {log_path}"

    async def check_training_status(self, model_name: str = "") -> str:
        """State of a training run (the last one started when no name is given) and its log's last lines."""
        name = self._pick(model_name)
        record = self._read(name) if name else None
        if name is None or record is None:
            return "No training runs found. Use start_rl_training to start one."
        state = self._state(name, record)
        tail = ""
        try:
            lines = Path(record["log"]).read_text(encoding="utf-8", errors="replace").splitlines()
            tail = "\n".join(lines[-8:])
        except (OSError, KeyError):
            pass
        elapsed = time.time() - float(record.get("started", time.time()))
        text = f"{name}: {state} ({record.get('method')}, {elapsed / 60:.1f} min"
        text += f", exit code {record['exit_code']})" if "exit_code" in record else ")"
        return text + (f"\nlast log lines:\n{tail}" if tail else "")

    async def stop_rl_training(self, model_name: str = "") -> str:
        """Stop a running `flowrl train` subprocess that this host started."""
        name = self._pick(model_name)
        proc = self._procs.get(name) if name else None
        if name is None or proc is None or proc.poll() is not None:
            return f"✗ no training started by this process is running{f' for {name}' if name else ''}"
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the trainer and the workers it spawned
        except OSError:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        record = self._read(name) or {}
        record.update(state="stopped", exit_code=proc.returncode, ended=time.time())
        self._write(name, record)
        return f"✓ stopped {name}; checkpoints stay in {record.get('output_dir')}"

    async def list_rl_models(self) -> str:
        """Every run under the runs folder, with its state and Ollama name."""
        if not self.runs_dir.is_dir():
            return "No trained models found. Use start_rl_training to train one."
        lines = []
        for path in sorted(self.runs_dir.glob(f"*/{RUN_FILE}")):
            name = path.parent.name
            record = self._read(name) or {}
            state = self._state(name, record)
            ollama = record.get("ollama_model")
            lines.append(
                f"{'✓' if ollama else '○'} {name}: {state}, {record.get('method')}"
                + (f", ollama/{ollama}" if ollama else "")
            )
        return "\n".join(lines) if lines else "No trained models found. Use start_rl_training to train one."

    async def switch_rl_model(self, model_name: str) -> str:
        """Point the agent at a trained model (exporting it to Ollama first if needed), or at 'original'."""
        if self.agent is None:
            return "✗ no agent to switch"
        if model_name in ("original", "base", "default"):
            if self._original is None:
                return "The agent already uses its original model."
            restore_model(self.agent, self._original)
            self._original = None
            return "✓ switched back to the original model"
        record = self._read(model_name)
        if record is None:
            return f"✗ no run named {model_name}. {await self.list_rl_models()}"
        if self._state(model_name, record) == "running":
            return f"✗ {model_name} is still training"
        ollama = record.get("ollama_model")
        if not ollama:
            try:
                ollama, message = await asyncio.to_thread(self._export, model_name, record)
            except Exception as exc:  # a tool never raises into the agent
                return f"✗ export of {model_name} failed: {exc}"
            if ollama is None:
                return message
        previous = use_model(self.agent, ollama_model(ollama))
        if self._original is None:
            self._original = previous
        return f"✓ the agent now uses ollama/{ollama} (switch_rl_model('original') switches back)"

    def _export(self, name: str, record: dict[str, Any]) -> tuple[str | None, str]:
        ollama = f"flowrl-{name}"
        result = ExportPipeline(
            record.get("output_dir") or self.runs_dir / name / "train",
            self.runs_dir / name / "export",
            quant=self.export_quant,
            ollama_name=ollama,
            name=name,
        ).run()
        if not result.ollama_created:
            return None, (
                f"Exported to {result.gguf_path}, but Ollama is not installed here, so the agent keeps its "
                f"model. Run: {result.ollama_command}"
            )
        record.update(ollama_model=ollama, gguf=str(result.gguf_path))
        self._write(name, record)
        return ollama, ""

    def tools(self) -> list[tuple[Callable[..., Any], str, str]]:
        return [
            (
                self.start_rl_training,
                "start_rl_training",
                (
                    "Start training a better model from the collected traces "
                    "(flowrl train, in the background). Returns at once."
                ),
            ),
            (
                self.check_training_status,
                "check_training_status",
                "Check the state and recent log lines of a training run.",
            ),
            (self.stop_rl_training, "stop_rl_training", "Stop a running training run."),
            (
                self.switch_rl_model,
                "switch_rl_model",
                "Use a trained model for this agent (exported to Ollama if needed); 'original' switches back.",
            ),
            (self.list_rl_models, "list_rl_models", "List trained models, their state and Ollama names."),
        ]


async def _settle(awaitable: Awaitable[Any]) -> None:
    await awaitable


def register_rl_tools(agent: Any, runs_dir: str | os.PathLike[str] | None = None, **options: Any) -> RLTools:
    """Register the five tools on `agent` with `agent.add_tool(func, name=..., description=...)`; return the RLTools."""
    tools = RLTools(agent, runs_dir, **options)
    for func, name, description in tools.tools():
        result = agent.add_tool(func, name=name, description=description)
        if inspect.isawaitable(result):  # some FlowAgent versions made add_tool a coroutine
            try:
                asyncio.get_running_loop().create_task(_settle(result))
            except RuntimeError:
                asyncio.run(_settle(result))
    return tools
