"""The policies of a run behind one OpenAI-compatible endpoint: what `flowrl improve` and `flowrl eval` give agents.

`PolicyServer(base_model)` is a context manager. It loads the base model once into an engine and starts
`flowrl serve`'s front on 127.0.0.1 (a free port, a random API key); `policy(name, adapter, temperature, seed)`
serves a LoRA adapter (or the base model) under `name`, with that sampling fixed, and returns the `Policy` an
agent factory gets. On exit the front and the engine stop.

Engines (`engine=`):
* `llama-server` (`auto` picks it when the binary is there): llama.cpp's server, several sequences per step;
  each adapter is written once as a GGUF LoRA (`flowrl.engines.lora_gguf`) and loaded beside the base model,
  chosen per request: no merge and no reconversion per round. Adding one restarts the server (llama-server
  loads adapters only at start): `swap_seconds` lists how long each took.
* `transformers`: the fallback, a `TransformersBackend` per policy (the base model loaded again with each
  adapter), batching the calls that arrive together. `auto` falls back to it when llama-server is missing,
  said once in the log with the command that builds it.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from flowrl.engines.choice import pick_engine
from flowrl.engines.llama_cpp_backend import gguf_for
from flowrl.engines.llama_server import LlamaServer
from flowrl.engines.lora_gguf import lora_beside
from flowrl.engines.policy import Policy
from flowrl.engines.server_backend import LlamaServerBackend
from flowrl.engines.transformers_backend import TransformersBackend
from flowrl.errors import ConfigError
from flowrl.models import resolve_model
from flowrl.serve.model import Route, ServedModel
from flowrl.serve.server import start

log = logging.getLogger(__name__)


class PolicyServer:
    """See the module docstring. `slots`: sequences decoded together; `max_tokens`: the most new tokens a policy's
    reply holds, whatever a request asks (a FlowAgent asks for 16,384 on every call; a sampled reply that never
    ends would hold a slot for minutes), said once and counted when a request asked for more."""

    def __init__(
        self,
        base_model: str,
        *,
        engine: str = "auto",
        workdir: Path | None = None,
        slots: int = 8,
        max_tokens: int = 512,
        ctx_per_slot: int = 4096,
    ) -> None:
        self.base_model = base_model
        resolved = resolve_model(base_model)
        if resolved.adapter:
            raise ConfigError(f"{base_model} is an adapter: pass the model it was trained from as the base")
        self.model_dir = Path(resolved.path)
        self.engine = pick_engine(engine, batched=True)
        self.workdir = Path(workdir) if workdir is not None else None
        self.slots, self.max_tokens, self.ctx_per_slot = slots, max_tokens, ctx_per_slot
        self.api_key = secrets.token_urlsafe(16)
        self.swap_seconds: list[float] = []
        self._gguf_adapters: dict[str, Path] = {}
        self._policies: dict[str, Policy] = {}
        self._llama: Any = None
        self._backend: Any = None
        self._model: Any = None
        self._http: Any = None

    # -- lifetime ------------------------------------------------------------------------------------------------
    def __enter__(self) -> PolicyServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        if self.engine == "llama-server":
            log_path = self.workdir / "llama-server.log" if self.workdir else None
            self._llama = LlamaServer(
                gguf_for(self.model_dir), slots=self.slots, ctx_per_slot=self.ctx_per_slot, log_path=log_path
            )
            self._llama.start()
            self._backend = LlamaServerBackend(self.model_dir, self._llama, max_new_tokens=self.max_tokens)
        else:
            self._backend = self._transformers(None)
        self._model = ServedModel(self._backend, name="base", max_tokens=self.max_tokens)
        self._http, _ = start(self._model, port=0, api_key=self.api_key)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._llama is not None:
            self._llama.stop()
            self._llama = None

    @property
    def url(self) -> str:
        if self._http is None:
            raise ConfigError("the policy server is not started: use it as a context manager")
        return str(self._http.url)

    @property
    def stats(self) -> Any:
        """What the front counted (requests, tool calls, what it could not do faithfully)."""
        return self._model.stats if self._model is not None else None

    # -- policies ------------------------------------------------------------------------------------------------
    def _transformers(self, adapter: Path | None) -> Any:
        return TransformersBackend(
            self.model_dir, adapter=adapter, batch_size=self.slots, max_new_tokens=self.max_tokens
        )

    def policy(self, name: str, adapter: Path | None = None, *, temperature: float, seed: int = 0) -> Policy:
        """`adapter` (a PEFT LoRA folder; None: the base model) served as `name` at `temperature`."""
        if self._model is None:
            raise ConfigError("the policy server is not started: use it as a context manager")
        known = self._policies.get(name)
        if known is not None and (known.adapter, known.temperature, known.seed) != (adapter, temperature, seed):
            raise ConfigError(f"policy {name!r} is already served with another adapter or sampling: use a new name")
        if known is None:
            if adapter is None:
                backend, on_engine = self._backend, None
            elif self.engine == "llama-server":
                backend, on_engine = self._backend, self._load_adapter(Path(adapter))
            else:
                backend, on_engine = self._transformers(Path(adapter)), None
            route = Route(backend, adapter=on_engine, temperature=temperature, seed=seed, max_tokens=self.max_tokens)
            self._model.add_route(name, route)
            self._policies[name] = Policy(
                base_url=self.url,
                model=name,
                api_key=self.api_key,
                temperature=temperature,
                seed=seed,
                base_model=self.base_model,
                adapter=Path(adapter) if adapter is not None else None,
            )
        return self._policies[name]

    def _load_adapter(self, adapter: Path) -> str:
        """The engine's name for `adapter`, converted and loaded the first time it is asked for."""
        import hashlib

        key = hashlib.sha256(str(adapter.resolve()).encode()).hexdigest()[:12]
        if key in self._gguf_adapters:
            return key
        self._gguf_adapters[key] = lora_beside(adapter, self.model_dir)
        seconds = self._llama.set_adapters(dict(self._gguf_adapters))
        self.swap_seconds.append(seconds)
        log.info("adapter %s loaded beside the base model (%.2f s)", adapter, seconds)
        return key
