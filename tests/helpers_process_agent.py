"""Agents for tests/test_improve_process.py, built in a worker process by `flowrl.improve.process.AgentProcess`:
no model, the answer made from the query and the policy, so the test can tell which policy the worker got."""

from __future__ import annotations

import os
import sys
import time
from typing import Any


class EchoAgent:
    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def run(self, query: str) -> str:
        print("the agent prints this: it goes to the log, not to the loop")
        if query == "raise":
            raise ValueError("the agent failed on purpose")
        if query == "die":
            sys.stdout.flush()
            os._exit(3)
        if query == "slow":
            time.sleep(0.5)
        return f"{query.upper()} via {self.policy.model} at {self.policy.base_url} t={self.policy.temperature}"


def make_agent(policy: Any) -> EchoAgent:
    return EchoAgent(policy)


def broken_factory(policy: Any) -> Any:
    raise RuntimeError("cannot build the agent: no config")
