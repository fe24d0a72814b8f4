"""Agents on a served model: the next round of traces comes from the model `flowrl serve` (or any
OpenAI-compatible server) runs.

* A FlowAgent, or any agent whose LLM calls go through LiteLLM model strings: `use_served(agent, url, name)`
  sets its model to `openai/<name>` with `api_base=url` (`flowrl.export.agent.use_model`); LiteLLM's `openai/`
  provider talks to any OpenAI-compatible server.
* The example agent, and any agent built on a `complete(messages) -> Completion` backend: `ServedBackend(url)`.
  Its replies carry the prompt ids the server rendered and the ids it sampled, so a hooked agent's trace
  records exactly what the model saw.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from flowrl.data.tokens import fold_tool_calls
from flowrl.engines.chat_backend import Completion
from flowrl.errors import FlowRLError
from flowrl.export.agent import use_model


def use_served(agent: Any, url: str, name: str, *, api_key: str = "none", which: str = "both") -> dict[str, Any]:
    """Point `agent` (a FlowAgent or look-alike) at the model served at `url` (`.../v1`); returns what it
    replaced, for `flowrl.export.agent.restore_model`."""
    return use_model(agent, f"openai/{name}", api_base=url.rstrip("/"), api_key=api_key, which=which)


class ServedBackend:
    """A chat backend on an OpenAI-compatible server: `complete(messages)` posts a chat completion request.

    `url` ends in `/v1`; `model` is the name the server serves (`flowrl serve` prints it); `temperature` and
    `max_tokens` go with every request.
    """

    def __init__(
        self,
        url: str,
        model: str = "flowrl",
        *,
        api_key: str | None = None,
        temperature: float = 0.7,
        max_tokens: int = 256,
        timeout: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.model_name = model
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout

    def complete(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> Completion:
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "logprobs": True,
        }
        if tools:
            body["tools"] = tools
        reply = self._post("/chat/completions", body)
        choice = reply["choices"][0]
        message = choice["message"]
        # tool calls back into the text form the example agent parses
        text = fold_tool_calls([dict(message, role="assistant")])[0].get("content") or ""
        logprobs = (choice.get("logprobs") or {}).get("content")
        usage = reply.get("usage") or {}
        return Completion(
            text=text.strip(),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            prompt_token_ids=reply.get("prompt_token_ids"),
            token_ids=choice.get("token_ids"),
            logprobs=[float(item["logprob"]) for item in logprobs] if logprobs else None,
            tokenizer=reply.get("tokenizer"),
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise FlowRLError(f"{self.url}{path} answered {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise FlowRLError(f"cannot reach {self.url} ({exc}): is `flowrl serve` running there?") from exc
