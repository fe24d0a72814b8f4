"""`Policy`: the model an agent runs on, as an OpenAI-compatible endpoint.

`flowrl improve` gives each agent it makes a `Policy`: where the round's model is served (`base_url`, ending in
`/v1`), the name to ask for (`model`), a key, and how that endpoint samples (`temperature`, `seed`: the endpoint
applies them whatever the request says, so a round collects and evaluates as configured). An agent that speaks
the OpenAI API uses `policy.openai_client()` (or `async_openai_client()`); one that goes through LiteLLM uses
`policy.litellm_model` with `api_base=policy.base_url`; a FlowAgent is pointed at it with
`flowrl.serve.client.use_served(agent, policy.base_url, policy.model)`. No model is loaded in the agent's code.

`adapter` and `base_model` say what is behind the endpoint (None: the base model), for reports and for agents
that want to know; nothing needs them to generate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Policy:
    base_url: str
    model: str
    api_key: str = "flowrl"
    temperature: float = 0.7
    seed: int = 0
    base_model: str = ""
    adapter: Path | None = None

    @property
    def litellm_model(self) -> str:
        """The LiteLLM model string for this endpoint (LiteLLM's `openai/` provider talks to any
        OpenAI-compatible server)."""
        return f"openai/{self.model}"

    def openai_client(self, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client on this endpoint (the OpenAI SDK must be installed)."""
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)
