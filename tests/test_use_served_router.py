"""`use_served` on a FlowAgent-style agent whose router does not pass `amd.api_base` on (toolboxv2 0.1.28: a model
with no native adapter goes to LiteLLM with the model, the messages and a key from the environment only). Without
the route, the served policy's calls would go to api.openai.com; with it, that model's calls (and only that
model's) carry the endpoint, and `restore_model` takes the route away. The router here has 0.1.28's `resolve`,
`complete` and `stream` logic; the real one is exercised by tests/integration/test_improve_flowagent.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from flowrl.export.agent import restore_model
from flowrl.serve.client import use_served


class FakeLiteLLM:
    """Stands for the litellm module: records what `acompletion` gets."""

    drop_params = False

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def acompletion(self, **kw: Any) -> str:
        self.sent.append(kw)
        return "ok"


LITELLM = FakeLiteLLM()


class LiteLLMAdapter:
    """0.1.28's LiteLLMFallbackAdapter (adapters/litellm_fallback.py): LiteLLM imported on first use; `api_key` an
    argument it drops; its keywords (None dropped) go to `litellm.acompletion`."""

    def __init__(self) -> None:
        self._litellm: Any = None

    def _ensure(self) -> None:
        if self._litellm is None:
            LITELLM.drop_params = True
            self._litellm = LITELLM

    async def complete(self, session: Any, api_key: str, model: str, messages: list, tools: Any, **kw: Any) -> str:
        self._ensure()
        kw = {k: v for k, v in kw.items() if v is not None}
        return await self._litellm.acompletion(model=model, messages=messages, **kw)

    async def stream(self, session: Any, api_key: str, model: str, messages: list, tools: Any, **kw: Any) -> Any:
        self._ensure()
        yield await self._litellm.acompletion(model=model, messages=messages, stream=True, **kw)


class Router:
    """CompletionRouter (llm_router/router.py): a registered prefix, else the LiteLLM adapter; `api_key` taken
    out of the keywords and handed to the adapter as an argument."""

    def __init__(self) -> None:
        self._adapters: dict[str, Any] = {"ollama": LiteLLMAdapter()}
        self.fallback = LiteLLMAdapter()

    def resolve(self, model: str) -> tuple[Any, str, str]:
        for prefix, adapter in self._adapters.items():
            if model.startswith(prefix + "/"):
                return adapter, model[len(prefix) + 1 :], prefix
        return self.fallback, model, ""

    async def complete(self, model: str, messages: list, tools: list | None = None, **kw: Any) -> str:
        adapter, actual, _prefix = self.resolve(model)
        kw.pop("cache", None)
        api_key = kw.pop("api_key", "")
        return await adapter.complete(None, api_key, actual, messages, tools, **kw)

    async def stream(self, model: str, messages: list, tools: list | None = None, **kw: Any) -> Any:
        adapter, actual, _prefix = self.resolve(model)
        api_key = kw.pop("api_key", "")
        async for chunk in adapter.stream(None, api_key, actual, messages, tools, **kw):
            yield chunk


def _agent() -> SimpleNamespace:
    amd = SimpleNamespace(fast_llm_model="openrouter/a", complex_llm_model="openrouter/b", api_base=None, api_key=None)
    return SimpleNamespace(amd=amd, router=Router())


async def _calls(router: Router) -> None:
    # what FlowAgent.a_run_llm_completion sends (flow_agent.py: keywords only, an env key that is empty here)
    await router.complete(model="openai/collect-1", messages=[], tools=None, api_key="", cache=True, max_tokens=9)
    await router.complete(model="openrouter/other", messages=[], api_key="")
    async for _chunk in router.stream(model="openai/collect-1", messages=[], api_key=""):
        pass


def _sent() -> list[tuple[str, dict[str, Any]]]:
    out = [(kw.pop("model"), {k: v for k, v in kw.items() if k != "messages"}) for kw in LITELLM.sent]
    LITELLM.sent.clear()
    return out


def test_the_served_model_reaches_the_endpoint_through_a_router_that_drops_api_base() -> None:
    agent = _agent()
    previous = use_served(agent, "http://127.0.0.1:8123/v1/", "collect-1", api_key="k")
    assert agent.amd.fast_llm_model == agent.amd.complex_llm_model == "openai/collect-1"
    asyncio.run(_calls(agent.router))
    (m1, kw1), (m2, kw2), (m3, kw3) = _sent()
    assert (m1, kw1) == ("openai/collect-1", {"max_tokens": 9, "api_base": "http://127.0.0.1:8123/v1", "api_key": "k"})
    assert (m2, kw2) == ("openrouter/other", {})  # another model goes as before
    assert kw3 == {"stream": True, "api_base": "http://127.0.0.1:8123/v1", "api_key": "k"}

    restore_model(agent, previous)
    assert agent.amd.fast_llm_model == "openrouter/a" and agent.amd.api_base is None
    assert agent.router.fallback._litellm is LITELLM
    asyncio.run(_calls(agent.router))
    assert "api_base" not in _sent()[0][1]


def test_a_model_with_a_native_adapter_is_not_routed() -> None:
    from flowrl.export.agent import use_model

    agent = _agent()
    previous = use_model(agent, "ollama/flowrl", api_base="http://127.0.0.1:11434")
    assert all(a._litellm is None for a in (agent.router.fallback, *agent.router._adapters.values()))
    restore_model(agent, previous)


def test_an_agent_without_such_a_router_gets_its_attributes_only() -> None:
    agent = SimpleNamespace(amd=SimpleNamespace(fast_llm_model="a/b", complex_llm_model="a/c"))
    previous = use_served(agent, "http://127.0.0.1:1/v1", "x")
    assert agent.amd.api_base == "http://127.0.0.1:1/v1"
    restore_model(agent, previous)
    assert agent.amd.api_base is None
