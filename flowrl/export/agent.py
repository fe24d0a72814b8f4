"""Closing the loop: point an agent at the exported model, so its next traces come from the improved one.

A toolboxv2 `FlowAgent` names its models in `agent.amd` (`AgentModelData`): `fast_llm_model` and
`complex_llm_model`, as `provider/model` strings, with optional `api_base` and `api_key`. Its LLM router
reads them on every call, so changing them takes effect from the next call on.

* Ollama: `use_model(agent, "ollama/flowrl-smollm2")` after `flowrl export ... --ollama flowrl-smollm2`.
* Any OpenAI-compatible server (llama.cpp's `llama-server -m model-q8_0.gguf`, vLLM, LM Studio):
  `use_model(agent, "openai/flowrl-smollm2", api_base="http://127.0.0.1:8080/v1", api_key="none")`.

`use_model` returns what it replaced; `restore_model(agent, previous)` puts it back. Agents other than
FlowAgent work when they keep the same attributes on `agent.amd` or on the agent itself.
"""

from __future__ import annotations

from typing import Any

from flowrl.export.errors import ExportError

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
    return previous


def restore_model(agent: Any, previous: dict[str, Any]) -> None:
    """Undo `use_model` with the dict it returned."""
    target = _target(agent)
    for key, value in previous.items():
        setattr(target, key, value)


def current_models(agent: Any) -> dict[str, Any]:
    target = _target(agent)
    return {slot: getattr(target, slot, None) for slot in ("fast_llm_model", "complex_llm_model", "api_base")}
