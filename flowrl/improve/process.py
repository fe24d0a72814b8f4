"""`AgentProcess`: your agent built and run by another Python, for the agent whose environment is not flowrl's
(`flowrl improve --agent MODULE:FACTORY --agent-python PY`).

    from flowrl.improve.process import AgentProcess
    improve(AgentProcess("my_agent:make_agent", python=".venv-app/bin/python"), train, held_out, grade, cfg)

Each stage (a round's collection, an arm's eval) starts one worker (`python -m flowrl.improve.worker` in that
Python, where flowrl must be installed; no extras): it builds the agent with `factory(policy)` on the stage's
served policy, hooks it into the stage's store, and runs the queries the loop sends. The grade runs here, on the
answers. The worker's stdout and stderr go to `log` (a file; the agent's prints land there), its replies come
back on a pipe of their own. It is stopped when the stage ends, killed when it does not end within `stop_timeout`,
and dies with this process (`PR_SET_PDEATHSIG`): no worker is left behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from flowrl.engines.llama_server import die_with_parent
from flowrl.engines.policy import Policy
from flowrl.errors import ConfigError, FlowRLError

log = logging.getLogger(__name__)


class AgentProcessError(FlowRLError):
    """The agent's worker could not start, or died."""


class AgentProcess:
    """See the module docstring. `factory`: `MODULE:NAME` (importable from `cwd` in that Python) or
        `path/to/file.py:NAME`; `python`: that interpreter; `env`: its whole environment (default: this process's);
        `log`: where its output goes (default: a file beside the stage's store); `settle_timeout`: how long the worker
    waits, at the end of a stage, for the agent's own background tasks (FlowAgent's run commits)."""

    def __init__(
        self,
        factory: str,
        python: str | Path,
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        log: Path | None = None,
        start_timeout: float = 300.0,
        stop_timeout: float = 300.0,
        settle_timeout: float = 120.0,
    ) -> None:
        if ":" not in factory:
            raise ConfigError(f"--agent {factory!r}: use MODULE:NAME or path/to/file.py:NAME")
        self.python = Path(python)
        if not (self.python.is_file() and os.access(self.python, os.X_OK)):
            raise ConfigError(f"--agent-python {python}: not an executable file (give the python of your agent's venv)")
        module, _, name = factory.rpartition(":")
        self.factory = f"{Path(module).resolve()}:{name}" if module.endswith(".py") else factory
        self.env = dict(env) if env is not None else None
        self.cwd = Path(cwd or Path.cwd()).resolve()
        self.log = log
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.settle_timeout = min(settle_timeout, stop_timeout / 2)  # the agent's background tasks, at the end
        self.started = 0  # workers started (one a stage)

    @contextmanager
    def open(
        self, policy: Policy, *, store: Path, metadata: dict[str, Any], hook_options: dict[str, Any], concurrency: int
    ) -> Iterator[RemoteAgent]:
        try:
            json.dumps({"hook_options": hook_options, "metadata": metadata})
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"hook options {sorted(hook_options)} and metadata go to the agent's own Python as JSON ({exc}): "
                "pass plain values there, or run the agent in this Python"
            ) from exc
        store = Path(store)
        store.mkdir(parents=True, exist_ok=True)
        config = {
            "factory": self.factory,
            "policy": {**asdict(policy), "adapter": str(policy.adapter) if policy.adapter else None},
            "store": str(store.resolve()),
            "metadata": metadata,
            "hook_options": hook_options,
            "concurrency": concurrency,
            "settle_s": self.settle_timeout,
            "cwd": str(self.cwd),
        }
        log_path = self.log or store.parent / f"{store.name}.agent.log"
        agent = RemoteAgent(self, config, log_path)
        self.started += 1
        try:
            agent.start()
            yield agent
            agent.finish()
        finally:
            agent.stop()


class RemoteAgent:
    """One worker: `a_run(query, session_id)` sends a query and awaits its answer (any number at once, from one
    event loop at a time); `stats` is the worker's hook counters once `finish` returned."""

    def __init__(self, owner: AgentProcess, config: dict[str, Any], log_path: Path) -> None:
        self.owner, self.config, self.log_path = owner, config, log_path
        self.stats: dict[str, int] = {}
        self.agent_type = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: IO[str] | None = None
        self._write_lock = threading.Lock()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[str]]] = {}
        self._next_id = 0
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._failure: str | None = None
        self._gone = False  # set by the reader, under the write lock, once the worker can answer nothing more
        self._reader: threading.Thread | None = None

    # -- lifetime ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            try:
                self._proc = subprocess.Popen(
                    [str(self.owner.python), "-m", "flowrl.improve.worker", "--reply-fd", str(write_fd)],
                    stdin=subprocess.PIPE,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    env=self.owner.env,
                    cwd=self.owner.cwd,
                    preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
                )
            finally:
                os.close(write_fd)
        assert self._proc.stdin is not None
        self._stdin = open(self._proc.stdin.fileno(), "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        self._reader = threading.Thread(
            target=self._read, args=(os.fdopen(read_fd, "r", encoding="utf-8"),), daemon=True
        )
        self._reader.start()
        self._write(self.config)
        if not self._ready.wait(self.owner.start_timeout) and self._failure is None:
            self._failure = f"no answer within {self.owner.start_timeout:.0f} s"
        if self._failure is not None:
            raise AgentProcessError(self._explain(f"the agent did not start in {self.owner.python}"))

    def finish(self) -> None:
        """No more queries: the worker waits for its runs, writes its traces, and ends."""
        self._close_stdin()
        if not self._finished.wait(self.owner.stop_timeout) and self._failure is None:
            self._failure = f"it did not end within {self.owner.stop_timeout:.0f} s"
        if not self._finished.is_set():
            raise AgentProcessError(self._explain("the agent's worker did not finish its traces"))

    def stop(self) -> None:
        """Whatever state it is in: the worker is gone when this returns."""
        self._close_stdin()
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout=10 if self._finished.is_set() else 0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(5)

    # -- queries -------------------------------------------------------------------------------------------------
    async def a_run(self, query: str, session_id: str) -> str:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        with self._write_lock:
            if self._gone or self._failure is not None:
                raise AgentProcessError(self._explain("the agent's worker is gone"))
            self._next_id += 1
            request_id = self._next_id
            self._pending[request_id] = (loop, future)
        self._write({"id": request_id, "query": query, "session_id": session_id})
        return await future

    def _write(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str) + "\n"
        with self._write_lock:
            try:
                assert self._stdin is not None
                self._stdin.write(line)
                self._stdin.flush()
            except (OSError, ValueError) as exc:  # the worker died: its reader fails what is pending
                log.debug("flowrl improve: cannot write to the agent's worker: %s", exc)

    def _close_stdin(self) -> None:
        with self._write_lock:
            if self._stdin is not None:
                try:
                    self._stdin.close()
                    if self._proc is not None and self._proc.stdin is not None:
                        self._proc.stdin.close()
                except OSError:
                    pass
                self._stdin = None

    def _read(self, replies: IO[str]) -> None:
        with replies:
            for line in replies:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "id" in message:
                    self._answer(message)
                elif message.get("ready"):
                    self.agent_type = str(message.get("agent", ""))
                    self._ready.set()
                elif message.get("done"):
                    self.stats = dict(message.get("stats") or {})
                    self._finished.set()
                elif "error" in message:
                    self._failure = str(message["error"])
        if not self._finished.is_set() and self._failure is None:
            code = self._proc.wait() if self._proc is not None else None
            self._failure = f"it exited with code {code}"
        self._ready.set()
        with self._write_lock:  # no query is added after this: a_run checks `_gone` under the same lock
            self._gone = True
            pending = list(self._pending)
        for request_id in pending:
            self._answer({"id": request_id, "error": self._explain("the agent's worker died mid-run")})

    def _answer(self, message: dict[str, Any]) -> None:
        with self._write_lock:
            entry = self._pending.pop(int(message["id"]), None)
        if entry is None:
            return
        loop, future = entry

        def settle() -> None:
            if future.done():
                return
            if "answer" in message:
                future.set_result(str(message["answer"]))
            else:
                future.set_exception(AgentProcessError(str(message.get("error"))))

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # that loop is closed: nobody waits for this answer any more
            pass

    def _explain(self, what: str) -> str:
        """One line: what failed, why, and where the worker's output is (with the fix when it is a known one)."""
        tail = ""
        try:
            tail = self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
        except OSError:
            pass
        hint = f"its output is in {self.log_path}"
        if "No module named 'flowrl'" in tail or "No module named flowrl" in tail:
            hint = f"flowrl is not installed there: {self.owner.python} -m pip install flowrl (no extras needed)"
        return f"{what}: {self._failure}; {hint}"
