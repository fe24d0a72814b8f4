"""The example agent for `flowrl improve` and `flowrl eval --agent example`: one factory, one sandbox.

`ExampleAgents()` is a context manager (it owns the code sandbox every agent shares); called with a `Policy` it
returns an `ExampleAgent` that talks to the policy's endpoint, as any user's agent does: nothing special beyond
its built-in tasks and grader. Its messages are sent in its own text format (tool calls written into the
assistant text, tool results as text), the format its prompt teaches, so the model sees what the agent's local
backends used to render.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from flowrl.demo.agent import ExampleAgent
from flowrl.engines.chat_backend import Completion, flatten_message
from flowrl.engines.policy import Policy
from flowrl.improve.config import UNSEEN_TASKS
from flowrl.improve.user import hold_out_families
from flowrl.rewards.sandbox import Sandbox
from flowrl.serve.client import ServedBackend
from flowrl.train.agent_rollout import AgentAdapter


class _TextBackend:
    """The example agent's backend on an endpoint: its messages flattened to text before they are sent."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.model_name = client.model_name

    def complete(self, messages: list[dict[str, Any]]) -> Completion:
        return self.client.complete([flatten_message(m) for m in messages])


class ExampleAgents:
    def __init__(self, *, max_new_tokens: int = 64) -> None:
        self.max_new_tokens = max_new_tokens
        self._sandbox: Any = None

    def __enter__(self) -> ExampleAgents:
        self._sandbox = Sandbox(workers=1).__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._sandbox is not None:
            self._sandbox.__exit__(*exc)
            self._sandbox = None

    def backend(self, policy: Policy) -> Any:
        client = ServedBackend(
            policy.base_url,
            policy.model,
            api_key=policy.api_key,
            temperature=policy.temperature,
            max_tokens=self.max_new_tokens,
        )
        return _TextBackend(client)

    def __call__(self, policy: Policy) -> Any:
        if self._sandbox is None:
            raise RuntimeError("use ExampleAgents as a context manager (it owns the code sandbox)")
        return ExampleAgent(self.backend(policy), sandbox=self._sandbox, seed=policy.seed)


def example_tasks(
    train_tasks: int, eval_tasks: int, *, seed: int = 0, hold_out: Collection[str] = (), unseen: int = UNSEEN_TASKS
) -> tuple[list[Any], list[Any]]:
    """`train_tasks` and `eval_tasks` tasks of the generated suite, from its two disjoint parts; the families in
    `hold_out` leave training, and up to `unseen` of their tasks join the held-out ones
    (`flowrl.improve.user.hold_out_families`)."""
    from flowrl.demo import suite as tasks_suite  # lazy: the package's __init__ imports this module

    tasks = tasks_suite.suite(seed=seed)
    train, held_out = tasks_suite.split(tasks, held_out=max(eval_tasks, 150), seed=seed)
    train, held = hold_out_families(list(train), list(held_out)[:eval_tasks], hold_out, unseen)
    return train[:train_tasks], held


def example_grade(task: Any, answer: str) -> bool:
    from flowrl.demo import suite as tasks_suite  # lazy: the package's __init__ imports this module

    return bool(tasks_suite.grade(task, answer))


def example_adapter(train_tasks: int = 400, seed: int = 0) -> Any:
    """The example agent for online GRPO (`flowrl train --method grpo --agent example`): an `ExampleAgent` per
    rollout on the policy's backend, its tools executed (`exec_code` in one shared sandbox, started on the first
    rollout), on the training part of the generated suite, each task's answer its reference."""
    sandbox: dict[str, Any] = {}

    def make_agent(backend: Any) -> Any:
        if "box" not in sandbox:
            sandbox["box"] = Sandbox(workers=1).__enter__()
        return ExampleAgent(backend, sandbox=sandbox["box"], seed=seed)

    def close() -> None:
        if "box" in sandbox:
            sandbox.pop("box").__exit__(None, None, None)

    train, _held_out = example_tasks(train_tasks, 0, seed=seed)
    return AgentAdapter(make_agent=make_agent, tasks=train, name="example agent", close=close)
