"""A real toolboxv2 0.1.28 FlowAgent on the round's served policy: the `--agent` factory of
tests/integration/test_improve_flowagent.py, run by `flowrl improve --agent-python .venv-toolbox/bin/python` in the
toolboxv2 venv (flowrl's worker builds and hooks it there).

Nothing here loads a model: the agent's LiteLLM model string is the policy's (`openai/<name>`), pointed at the
endpoint with `use_served`. What is swapped out is what needs services this sandbox lacks, as in
flowagent_driver.py: the isaa semantic memory (faiss) and the narrator's "blitz" model (a second model through a
router of its own), which here answers the run summary with a fixed text (FlowAgent asks its own model for the
summary only when the narrator has none: a 4,400-token prompt, about 26 s on 2 cores). The ReAct engine, the tool
manager, sessions, checkpoints, the background commit, and every LLM call of the agent's own loop are real and go
to the served policy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SYSTEM = "You answer questions. Reply with the answer in a few words, without calling any tool."
_READY: list[bool] = []


def _offline_once() -> None:
    if _READY:
        return
    from flowagent_driver import _install_offline_stubs
    from toolboxv2 import get_app

    get_app("flowrl-improve-it")
    _install_offline_stubs()
    import toolboxv2.mods.isaa.base.Agent.narrator as narrator

    async def stand_in_blitz(system: str, messages: Any, force_json: bool = True, **_k: Any) -> Any:
        """The narrator's model: a fixed run summary (FlowAgent's commit asks it first, and only asks the agent's
        own model, a 4,400-token prompt here, when it has none); nothing for its JSON checks."""
        if force_json:
            return None
        return {"in": 0, "out": 0, "data": None, "raw": "Run finished (the narrator's summary, a stand-in)."}

    narrator._call_blitz = stand_in_blitz
    _READY.append(True)


def make_agent(policy: Any) -> Any:
    os.environ.setdefault("LIGHNIGMODEL", "mock/blitz")
    os.environ.setdefault("BLITZMODEL", "mock/blitz")
    _offline_once()
    from toolboxv2.mods.isaa.base.Agent.flow_agent import FlowAgent
    from toolboxv2.mods.isaa.base.Agent.types import AgentModelData

    from flowrl.serve.client import use_served

    amd = AgentModelData(
        name="flowrl_improve_it",
        fast_llm_model="openrouter/unused",
        complex_llm_model="openrouter/unused",
        system_message=SYSTEM,
        enable_docker=False,
        enable_lsp=False,
    )
    agent = FlowAgent(amd, stream=False, auto_load_checkpoint=False)
    use_served(agent, policy.base_url, policy.model, api_key=policy.api_key)
    return agent
