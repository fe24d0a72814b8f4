"""A scripted agent for online GRPO tests: it asks its backend, runs its `lookup` tool whatever the model said,
shows the tool's result to the model and returns the model's second reply. Hooked as a generic agent."""

from __future__ import annotations

import asyncio
from typing import Any

from flowrl.train.agent_rollout import AgentAdapter

HOOK_OPTIONS = {"run_methods": ["a_run"], "tool_methods": ["lookup"], "llm_methods": ["llm"]}
TASKS = [{"task_id": f"t{i}", "query": f"What is the capital of country {i}?", "answer": f"City{i}"} for i in range(4)]


class ScriptedAgent:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.lookups = 0

    def llm(self, messages: list[dict[str, Any]]) -> Any:
        return self.backend.complete(messages)

    def lookup(self, key: str) -> str:
        self.lookups += 1
        return f"the capital of {key} is City{key.rsplit(' ', 1)[-1]}"

    async def a_run(self, query: str, session_id: str = "default") -> str:
        messages = [{"role": "user", "content": query}]
        first = await asyncio.to_thread(self.llm, messages)
        result = self.lookup(query.rstrip("?").rsplit(" ", 2)[-1])
        messages += [
            {"role": "assistant", "content": first.text},
            {"role": "tool", "name": "lookup", "content": result},
        ]
        second = await asyncio.to_thread(self.llm, messages)
        return second.text


def scripted_adapter(**overrides: Any) -> AgentAdapter:
    return AgentAdapter(
        **{
            "make_agent": ScriptedAgent,
            "tasks": TASKS,
            "hook_options": dict(HOOK_OPTIONS),
            "name": "scripted",
            **overrides,
        }
    )
