"""`python -m flowrl.improve.worker --reply-fd N`: your agent, built and run in its own Python for `flowrl improve
--agent-python PY` (`flowrl.improve.process.AgentProcess` starts it; nothing else should).

Your agent often lives in its own environment (toolboxv2's FlowAgent, a web app's venv) while the loop's training
stack (torch, TRL) lives in flowrl's: this process needs only flowrl itself, no extras. It

1. reads one JSON line from stdin: the factory (`MODULE:NAME` or `file.py:NAME`), the round's `Policy` (the
   endpoint, nothing more: no model is loaded here), the store root, the hook's metadata and options;
2. builds the agent with `factory(policy)`, hooks it (`hook_into_agent`, as the loop does in its own process),
   and answers `{"ready": ...}` on the reply pipe;
3. runs each request line `{"id", "query", "session_id"}` as it comes (the parent sends at most its concurrency
   at once), answering `{"id", "answer"}` or `{"id", "error"}`: an agent that raises is a failed task, not a
   dead worker;
4. at the end of stdin: waits for the runs in flight and for a FlowAgent's background commits (it writes a run's
   history and summary after `a_run` returned; up to `settle_s`, then cancelled and said), flushes the
   hook (every trace on disk), answers `{"done": stats}` and ends with `os._exit(0)`. The agent's own exit
   handlers do not run: nothing of the loop needs them, and toolboxv2's spend about 12 s retrying MinIO.

Replies go to a pipe of their own (`--reply-fd`), so whatever the agent prints (stdout, stderr: the parent sends
both to a log file) never mixes with them. It dies with its parent (`PR_SET_PDEATHSIG`, set by the parent).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import traceback
from typing import IO, Any

from flowrl.capture import hook_into_agent
from flowrl.capture.flowagent import pending_commits
from flowrl.engines.policy import Policy
from flowrl.improve.agents import driven, run_agent
from flowrl.improve.user import load_object
from flowrl.store.files import TraceStore


def _send(out: IO[str], lock: threading.Lock, message: dict[str, Any]) -> None:
    line = json.dumps(message, default=str)
    with lock:
        out.write(line + "\n")
        out.flush()


def _build(config: dict[str, Any]) -> tuple[Any, Any]:
    """(agent as the loop drives it, its hook)."""
    from pathlib import Path

    spec = dict(config["policy"])
    spec["adapter"] = Path(spec["adapter"]) if spec.get("adapter") else None
    factory = load_object(config["factory"], "--agent")
    agent, options = driven(factory(Policy(**spec)), config.get("hook_options") or {})
    hook = hook_into_agent(agent, store=TraceStore(config["store"]), metadata=config.get("metadata") or {}, **options)
    return agent, hook


async def _serve(agent: Any, out: IO[str], lock: threading.Lock, concurrency: int, settle_s: float) -> None:
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    # a sync agent runs in a thread per run (Driven): the default pool would cap the runs in flight
    loop.set_default_executor(ThreadPoolExecutor(max_workers=max(4, 2 * concurrency)))
    reader = ThreadPoolExecutor(max_workers=1)  # stdin, off the loop
    running: set[asyncio.Task[None]] = set()

    async def one(request: dict[str, Any]) -> None:
        try:
            answer = await run_agent(agent, str(request["query"]), str(request["session_id"]))
            _send(out, lock, {"id": request["id"], "answer": answer})
        except Exception as exc:  # noqa: BLE001 - the agent's failure is a failed task, reported to the loop
            _send(out, lock, {"id": request["id"], "error": f"{type(exc).__name__}: {exc}"})

    while True:
        line = await loop.run_in_executor(reader, sys.stdin.readline)
        if not line:
            break
        task = asyncio.create_task(one(json.loads(line)))
        running.add(task)
        task.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)
    await _settle(agent, settle_s)


async def _settle(agent: Any, timeout: float) -> None:
    """Let the agent's background commits end (a FlowAgent writes each run's session history and summary in a
    task after `a_run` returned), so the host's state is whole and no request is left generating on the endpoint
    for a process that is gone. Other agents' tasks are not waited for: the loop cannot tell theirs from a
    library's that never end (LiteLLM keeps a logging worker). What is still running after `timeout` seconds is
    cancelled, and said."""
    pending = pending_commits(agent)
    if not pending:
        return
    _done, late = await asyncio.wait(pending, timeout=timeout)
    if late:
        print(
            f"flowrl worker: {len(late)} of the agent's commits still running after {timeout:.0f} s: cancelled",
            file=sys.stderr,
        )
        for task in late:
            task.cancel()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--reply-fd":
        print("usage: python -m flowrl.improve.worker --reply-fd N (started by flowrl improve)", file=sys.stderr)
        return 2
    out = os.fdopen(int(argv[1]), "w", encoding="utf-8")
    lock = threading.Lock()
    try:
        config = json.loads(sys.stdin.readline())
        os.chdir(config.get("cwd") or ".")
        agent, hook = _build(config)
    except BaseException as exc:  # noqa: BLE001 - said to the parent in one line, the traceback in the log
        traceback.print_exc()
        _send(out, lock, {"error": f"{type(exc).__name__}: {exc}"})
        sys.stderr.flush()
        os._exit(1)
    _send(out, lock, {"ready": True, "agent": type(agent).__name__, "python": sys.executable})
    try:
        concurrency = int(config.get("concurrency") or 8)
        asyncio.run(_serve(agent, out, lock, concurrency, float(config.get("settle_s", 120.0))))
    finally:
        hook.flush()
        hook.unhook()
        _send(out, lock, {"done": True, "stats": hook.stats.as_dict()})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
