"""The LLM client libraries capture can patch: one line each (a new client is a module with a `SPEC` and a
line here). `hook_into_agent(..., llm_clients=...)` names them; `client_patch` does the patching."""

from __future__ import annotations

from flowrl.capture import client_patch, litellm_client, openai_client
from flowrl.capture.client_patch import ClientSpec, importable, patched, release
from flowrl.capture.events import HookPort

CLIENTS: dict[str, ClientSpec] = {
    "openai": openai_client.SPEC,  # the OpenAI Python SDK: chat completions and the Responses API
    "litellm": litellm_client.SPEC,  # litellm.completion / acompletion, patched once the host imports it
}


def auto_clients() -> tuple[str, ...]:
    """`llm_clients="auto"`: every client library flowrl knows that is importable."""
    return tuple(c for c in CLIENTS if importable(c))


def acquire(hook: HookPort, names: tuple[str, ...]) -> list[str]:
    """Patch the named clients for `hook` (`client_patch.acquire`); returns what is patched."""
    return client_patch.acquire(hook, [CLIENTS[name] for name in names])


__all__ = ["CLIENTS", "acquire", "auto_clients", "importable", "patched", "release"]
