"""How the loop reaches an agent: an `AgentSource` opens the agent on one policy, hooked into one store, for one
stage (a round's collection, an arm's eval), and closes it when the stage is done.

* `InProcess(factory)`: `factory(policy)` called here, the agent hooked in this process (the default: a plain
  factory is wrapped in it);
* `flowrl.improve.process.AgentProcess(spec, python)`: the agent built and run by another Python (its own venv),
  hooked there (`flowrl improve --agent-python PY`).

Either way the stage sees an object with `a_run(query, session_id) -> str`, and after the stage `stats` (the hook's
counters: written, errors, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from flowrl.capture import hook_into_agent
from flowrl.capture.flowagent import is_flowagent
from flowrl.engines.policy import Policy
from flowrl.errors import FlowRLError
from flowrl.store.files import TraceStore


class Opened(Protocol):
    stats: dict[str, int]

    async def a_run(self, query: str, session_id: str) -> str: ...


class AgentSource(Protocol):
    def open(
        self, policy: Policy, *, store: Path, metadata: dict[str, Any], hook_options: dict[str, Any], concurrency: int
    ) -> Any:  # a context manager yielding an `Opened`
        ...


class InProcess:
    """`factory(policy) -> agent`, built and hooked in this process."""

    def __init__(self, factory: Callable[[Policy], Any]) -> None:
        self.factory = factory

    @contextmanager
    def open(
        self, policy: Policy, *, store: Path, metadata: dict[str, Any], hook_options: dict[str, Any], concurrency: int
    ) -> Iterator[Opened]:
        agent, options = driven(self.factory(policy), hook_options)
        hook = hook_into_agent(agent, store=TraceStore(store), metadata=metadata, **options)
        opened = _Hooked(agent)
        try:
            yield opened
        finally:
            hook.flush()
            hook.unhook()
            opened.stats = hook.stats.as_dict()


class _Hooked:
    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.stats: dict[str, int] = {}

    async def a_run(self, query: str, session_id: str) -> str:
        return await run_agent(self.agent, query, session_id)


def source_of(make_agent: Any) -> AgentSource:
    """An `AgentSource` as it is; a plain factory as `InProcess`."""
    return make_agent if callable(getattr(make_agent, "open", None)) else InProcess(make_agent)


def driven(agent: Any, hook_options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """What the loop runs and hooks for `agent`, and the hook's options. A FlowAgent, or an agent hooked with
    `hook_options`, as it is; any other agent through `Driven`, so each run's trace carries the loop's session id
    (what the verdicts are keyed by) whatever the agent's entry point takes, its OpenAI SDK and LiteLLM calls
    recorded as its LLM calls."""
    if hook_options or is_flowagent(agent):
        return agent, dict(hook_options)
    return Driven(agent), {"run_methods": ["a_run"], "agent_name": type(agent).__name__}


class Driven:
    """A user's agent as the loop drives it: `a_run(query, session_id=...)` calls its `a_run` or `run` (in a
    thread), with `session_id` when its signature takes one."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    async def a_run(self, query: str, session_id: str = "default") -> str:
        import asyncio

        method = getattr(self.agent, "a_run", None) or getattr(self.agent, "run", None)
        if method is None:
            raise FlowRLError(f"{type(self.agent).__name__} has neither a_run(query, ...) nor run(query, ...)")
        try:
            params = inspect.signature(method).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        takes_session = "session_id" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        kwargs = {"session_id": session_id} if takes_session else {}
        if inspect.iscoroutinefunction(method):
            result = await method(query, **kwargs)
        else:
            result = await asyncio.to_thread(method, query, **kwargs)
        return result if isinstance(result, str) else str(result)


async def run_agent(agent: Any, query: str, session_id: str) -> str:
    """One run of what `driven` returned (a FlowAgent, a `Driven`, or an agent hooked as configured): its
    `a_run(query, session_id=...)`; the answer as text."""
    result = await agent.a_run(query, session_id=session_id)
    return result if isinstance(result, str) else str(result)
