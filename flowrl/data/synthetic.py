"""Synthetic agent traces for tests, benchmarks and demos: tool-calling runs of a few tasks, scored.

Each trace is a run of one of `n_tasks` arithmetic tasks: system prompt, user turn, one to `max_steps`
`exec_code` tool calls with their results, then a final answer. About a third of the runs answer
wrongly (reward 0.1 to 0.4, engine label false); the rest are right (reward 0.6 to 1.0, label true).
Everything is derived from `seed` and the index, so the same call gives the same traces.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from flowrl.trace.load import stored_dict
from flowrl.trace.schema import ExecutionTrace

SYSTEM = "You are a careful coding agent. Use exec_code to compute, then answer."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "exec_code",
            "description": "Run Python code and return its output.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]


def synthetic_trace(
    index: int, *, n_tasks: int = 100, max_steps: int = 3, seed: int = 0, start: datetime | None = None
) -> ExecutionTrace:
    rng = random.Random(f"{seed}:{index}")
    task = index % n_tasks
    a, b = task + 2, (task * 7) % 13 + 1
    query = f"What is {a} times {b} plus {task}?"
    answer = a * b + task
    good = rng.random() > 0.33
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": query}]
    tool_calls = []
    steps = rng.randint(1, max_steps)
    when = (start or datetime(2026, 11, 1)) + timedelta(minutes=index)
    for s in range(steps):
        code = f"print({a} * {b} + {task})" if good or s < steps - 1 else f"print({a} + {b} + {task})"
        output = str(eval(code[6:-1]))  # noqa: S307 - the code is built above from integers
        call_id = f"call_{index}_{s}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "exec_code", "arguments": orjson.dumps({"code": code}).decode()},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": "exec_code", "content": output})
        tool_calls.append(
            {
                "tool_name": "exec_code",
                "arguments": {"code": code},
                "result": output,
                "success": True,
                "call_id": call_id,
                "timestamp": when.isoformat(),
            }
        )
    final = f"The answer is {answer}." if good else f"The answer is {a + b + task}."
    messages.append({"role": "assistant", "content": final})
    reward = round(rng.uniform(0.6, 1.0) if good else rng.uniform(0.1, 0.4), 3)
    return ExecutionTrace(
        trace_id=f"syn{seed}x{index:07d}",
        session_id=f"s{task}",
        timestamp=when.isoformat(),
        user_query=query,
        tool_calls=tool_calls,
        final_response=final,
        agent_name="synthetic",
        source="live",
        success=good,
        messages=messages,
        tools=TOOLS,
        reward_score=reward,
        rewards={"task_completion": reward},
        label=good,
        label_source="engine",
        metadata={"reference_answer": str(answer)},
    )


def write_synthetic_store(root: str | Path, n: int, **kwargs: Any) -> Path:
    """Write `n` synthetic traces in the store layout (plain writes: fast, not crash-safe; for benchmarks)."""
    root = Path(root)
    made: set[Path] = set()
    for i in range(n):
        trace = synthetic_trace(i, **kwargs)
        day = root / trace.date()
        if day not in made:
            day.mkdir(parents=True, exist_ok=True)
            made.add(day)
        (day / f"{trace.trace_id}.json").write_bytes(orjson.dumps(stored_dict(trace)))
    return root
