"""A user's own agent, written as a user would: the OpenAI SDK on the policy's endpoint, no model loaded here.
`flowrl improve --agent tests/helpers_openai_agent.py:make_agent` runs it (tests/test_improve_agent.py)."""

from __future__ import annotations

from typing import Any

SYSTEM = "You are a calculator. Reply with the number only."


class ArithmeticAgent:
    def __init__(self, policy: Any) -> None:
        self.client = policy.openai_client()
        self.model = policy.model

    def run(self, query: str) -> str:
        reply = self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": query}],
            max_tokens=12,
        )
        return reply.choices[0].message.content or ""


def make_agent(policy: Any) -> ArithmeticAgent:
    return ArithmeticAgent(policy)


def last_number_grade(task: Any, answer: str) -> bool:
    """Right when the last number in the reply is the answer ("3 + 1 = 4" is right, "4 is not 3 + 2" is not)."""
    import re

    numbers = re.findall(r"-?\d+", answer)
    return bool(numbers) and numbers[-1] == task.answer
