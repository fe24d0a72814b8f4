"""Closing the loop: point an agent at the exported model, so its next traces come from the improved one.

A toolboxv2 `FlowAgent` names its models in `agent.amd` (`AgentModelData`): `fast_llm_model` and
`complex_llm_model`, as `provider/model` strings, with optional `api_base` and `api_key`. Its LLM router
reads them on every call, so changing them takes effect from the next call on.

* Ollama: `use_model(agent, "ollama/flowrl-smollm2")` after `flowrl export ... --ollama flowrl-smollm2`.
* Any OpenAI-compatible server (llama.cpp's `llama-server -m model-q8_0.gguf`, vLLM, LM Studio):
  `use_model(agent, "openai/flowrl-smollm2", api_base="http://127.0.0.1:8080/v1", api_key="none")`.

`use_model` returns what it replaced; `restore_model(agent, previous)` puts it back. Agents other than
FlowAgent work when they keep the same attributes on `agent.amd` or on the agent itself.

FlowAgent 0.1.28 does not pass `amd.api_base` on: its `CompletionRouter` sends a model with no native adapter
(`openai/...`) to `litellm.acompletion` with the model, the messages, the tools and an API key from the
environment, so LiteLLM would call api.openai.com. When `api_base` is given and the agent's router would hand
`model` to LiteLLM, `use_model` routes that model's calls to `api_base` with `api_key`: that router's LiteLLM
adapter gets a LiteLLM that adds them to the calls for that model only (`_route_litellm`); every other model goes
as before. `restore_model` takes the route away.
"""

from __future__ import annotations

import logging
from typing import Any

from flowrl.export.errors import ExportError

log = logging.getLogger(__name__)

_SLOTS = {
    "fast": ("fast_llm_model",),
    "complex": ("complex_llm_model",),
    "both": ("fast_llm_model", "complex_llm_model"),
}


def ollama_model(name: str) -> str:
    """The model string a FlowAgent uses for the Ollama model `name`."""
    return name if name.startswith("ollama/") else f"ollama/{name}"


def _target(agent: Any) -> Any:
    amd = getattr(agent, "amd", None)
    if amd is not None and hasattr(amd, "fast_llm_model"):
        return amd
    if hasattr(agent, "fast_llm_model"):
        return agent
    raise ExportError(
        f"{type(agent).__name__} has neither amd.fast_llm_model nor fast_llm_model: cannot point it at another model"
    )


def use_model(
    agent: Any, model: str, *, api_base: str | None = None, api_key: str | None = None, which: str = "both"
) -> dict[str, Any]:
    """Make `agent` use `model` for its fast and/or complex slot; return the previous values.

    `which` is `fast`, `complex` or `both`. `api_base`/`api_key` are set only when given.
    """
    if which not in _SLOTS:
        raise ExportError(f"which={which!r}: use fast, complex or both")
    if "/" not in model:
        raise ExportError(f"model {model!r} needs a provider prefix, e.g. ollama/{model} or openai/{model}")
    target = _target(agent)
    previous: dict[str, Any] = {}
    for slot in _SLOTS[which]:
        previous[slot] = getattr(target, slot, None)
        setattr(target, slot, model)
    for key, value in (("api_base", api_base), ("api_key", api_key)):
        if value is not None:
            previous[key] = getattr(target, key, None)
            setattr(target, key, value)
    if api_base is not None:
        route = _route_litellm(agent, model, api_base, api_key)
        if route is not None:
            previous[_ROUTE] = route
    return previous


def restore_model(agent: Any, previous: dict[str, Any]) -> None:
    """Undo `use_model` with the dict it returned."""
    target = _target(agent)
    for key, value in previous.items():
        if key == _ROUTE:
            _unroute(value)
        else:
            setattr(target, key, value)


_ROUTE = "_flowrl_router_route"  # the key of `previous` that holds the route (adapter, the LiteLLM it had)


def _route_litellm(agent: Any, model: str, api_base: str, api_key: str | None) -> tuple[Any, Any] | None:
    """Route `model` to `api_base` on the LiteLLM adapter of the agent's FlowAgent-style router (one with
    `resolve`), when the router would give the model to LiteLLM (`resolve` names no prefix). None when there is
    nothing to route.

    0.1.28's router takes `api_key` out of the call's keywords and hands it to the adapter as an argument, which its
    LiteLLM adapter drops; what reaches LiteLLM is `adapter._litellm.acompletion(model=..., **keywords)`. So the
    adapter's `_litellm` becomes `_Routed`: the same module for everything, `acompletion` and `completion` with the
    endpoint and key added for that one model, looked up on the module at each call (flowrl's LiteLLM capture
    patch sees them)."""
    try:
        router = getattr(agent, "router", None)  # FlowAgent creates it on first use
        adapter, actual, prefix = router.resolve(model)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not such a router, or strict about unknown models: nothing to route
        return None
    if prefix:
        return None  # a native adapter, with its own base URL
    ensure = getattr(adapter, "_ensure", None)
    if not callable(ensure) or not hasattr(adapter, "_litellm"):
        log.warning(
            "flowrl: %s's router hands %s to %s, which flowrl cannot point at %s: that model's calls may go "
            "elsewhere; register an adapter for the endpoint on the agent's router",
            type(agent).__name__,
            model,
            type(adapter).__name__,
            api_base,
        )
        return None
    ensure()  # imports LiteLLM, as the agent's first call would
    had = adapter._litellm
    adapter._litellm = _Routed(had, actual, {"api_base": api_base, **({"api_key": api_key} if api_key else {})})
    return adapter, had


class _Routed:
    """The LiteLLM module, with `extra` keywords added to the calls for `model`."""

    def __init__(self, litellm: Any, model: str, extra: dict[str, Any]) -> None:
        self._litellm, self._model, self._extra = litellm, model, extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._litellm, name)

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**kwargs, **self._extra} if kwargs.get("model") == self._model else kwargs

    async def acompletion(self, *args: Any, **kwargs: Any) -> Any:
        return await self._litellm.acompletion(*args, **self._keywords(kwargs))

    def completion(self, *args: Any, **kwargs: Any) -> Any:
        return self._litellm.completion(*args, **self._keywords(kwargs))


def _unroute(route: tuple[Any, Any]) -> None:
    adapter, had = route
    adapter._litellm = had


def current_models(agent: Any) -> dict[str, Any]:
    target = _target(agent)
    return {slot: getattr(target, slot, None) for slot in ("fast_llm_model", "complex_llm_model", "api_base")}
