"""What `flowrl serve MODEL` loads, and with which engine.

MODEL is one of:

* a GGUF file: llama.cpp (its server when built, else llama-cpp-python). Its tokenizer (which renders the chat
  template and must be the GGUF's vocabulary) is `--tokenizer`, else the `merged/` folder `flowrl export` writes
  beside the file, else the file's folder;
* a folder `flowrl export` wrote (it holds `export.json`): its GGUF with llama.cpp when it is there, else its
  `merged/` folder with transformers;
* a PEFT adapter folder from `flowrl train` (the base model from its adapter_config.json, or `--base-model`),
  a Hugging Face model folder, or `default` (flowrl's SmolLM2-135M-Instruct): on llama-server, the base model's
  GGUF (converted once and cached under `$FLOWRL_MODELS/gguf/`) with the adapter beside it as a GGUF LoRA; on
  llama-cpp-python, the model with the adapter merged in, converted and cached likewise; else transformers,
  which needs no build.

`auto` takes llama-server when it is built (several requests decoded together; an adapter is loaded beside its
base as a GGUF LoRA, not merged), else llama-cpp-python, else transformers (`flowrl.engines.choice`).
`--engine llama-server|llama.cpp|transformers` forces one; asking for one that is not installed, or for
transformers with a GGUF file, is one line naming the fix, never another engine in its place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.engines import llama_cpp_backend, llama_server
from flowrl.engines.choice import ENGINES, pick_engine
from flowrl.engines.llama_cpp_backend import INSTALL_HINT, LlamaCppBackend, gguf_for
from flowrl.engines.llama_server import LlamaServer
from flowrl.engines.lora_gguf import lora_beside
from flowrl.engines.server_backend import LlamaServerBackend
from flowrl.engines.transformers_backend import TransformersBackend
from flowrl.errors import ConfigError
from flowrl.models import resolve_model
from flowrl.serve.model import Route


@dataclass(frozen=True)
class Plan:
    engine: str
    model_dir: Path  # the Hugging Face folder: the tokenizer (and the weights for transformers)
    adapter: Path | None = None
    gguf: Path | None = None
    name: str = "flowrl"


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def _llama_cpp() -> bool:
    return llama_cpp_backend.llama_cpp_available()  # looked up on the module: tests replace it there


def _need_llama_cpp(what: str) -> None:
    if not _llama_cpp():
        raise ConfigError(f"{what} needs llama-cpp-python: {INSTALL_HINT}")


def _gguf_engine(engine: str, what: str) -> str:
    """The llama.cpp engine for a GGUF: its server when built (or asked for), else llama-cpp-python."""
    if engine == "llama-server" or (engine == "auto" and llama_server.available()):
        llama_server.find_binary()
        return "llama-server"
    if engine == "auto" and not _llama_cpp():
        raise ConfigError(f"{what} needs llama-server ({llama_server.BUILD_HINT}) or llama-cpp-python ({INSTALL_HINT})")
    _need_llama_cpp(what)
    return "llama.cpp"


def _gguf_plan(path: Path, engine: str, tokenizer: Path | None) -> Plan:
    if engine == "transformers":
        raise ConfigError(
            f"{path} is a GGUF file, which transformers does not serve: use --engine llama-server (or auto), "
            "or serve the merged/ folder flowrl export wrote beside it"
        )
    concrete = _gguf_engine(engine, f"serving {path}")
    candidates = [tokenizer] if tokenizer else [path.parent / "merged", path.parent]
    folder = next((c for c in candidates if c is not None and _has_tokenizer(c)), None)
    if folder is None:
        raise ConfigError(
            f"{path}: a GGUF file needs its Hugging Face tokenizer folder to render the chat template as training "
            f"did (looked in {', '.join(str(c) for c in candidates)}): pass --tokenizer FOLDER, e.g. the merged/ "
            "folder flowrl export writes"
        )
    return Plan(concrete, folder, gguf=path, name=path.stem)


def _export_plan(folder: Path, engine: str) -> Plan:
    try:
        record = json.loads((folder / "export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder}/export.json cannot be read ({exc}): export again, or serve the GGUF file") from exc

    def recorded(key: str, fallback: Path) -> Path:
        """A path export.json names (relative to where export ran), else the same name in `folder`."""
        value = record.get(key)
        if value and Path(value).exists():
            return Path(value)
        return folder / Path(value).name if value else fallback

    merged = recorded("model_dir", folder / "merged")
    gguf: Path | None = recorded("gguf_path", folder / "none.gguf")
    if gguf is not None and not gguf.is_file():
        gguf = next(iter(sorted(folder.glob("*.gguf"))), None)
    name = gguf.stem if gguf else folder.name
    gguf_engine = engine in ("llama.cpp", "llama-server") or (
        engine == "auto" and (llama_server.available() or _llama_cpp())
    )
    if gguf_engine and gguf is not None:
        return _gguf_plan(gguf, engine, merged)
    if gguf_engine:  # no GGUF there: converted from merged/ and cached
        return Plan(_gguf_engine(engine, f"serving {folder}"), merged, name=name)
    if not (merged / "config.json").is_file():
        raise ConfigError(f"{folder}/export.json names no merged/ model folder: export again, or serve the GGUF file")
    return Plan("transformers", merged, name=name)


def plan(spec: str, *, engine: str = "auto", base_model: str | None = None, tokenizer: str | None = None) -> Plan:
    """What to load for `spec` (the module docstring says how it is read)."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine}: use one of {', '.join(ENGINES)}")
    tok = Path(tokenizer).expanduser() if tokenizer else None
    if tok is not None and not _has_tokenizer(tok):
        raise ConfigError(f"--tokenizer {tok}: no tokenizer_config.json or tokenizer.json there")
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"{path} does not exist: pass the .gguf file flowrl export wrote")
        return _gguf_plan(path, engine, tok)
    if path.is_dir() and (path / "export.json").is_file():
        return _export_plan(path, engine)
    if base_model is not None and not (path / "adapter_config.json").is_file():
        raise ConfigError(f"--base-model applies to an adapter folder; {spec} is not one (no adapter_config.json)")
    resolved = resolve_model(spec)
    model_dir = Path(resolve_model(base_model).path if base_model else resolved.path)
    adapter = Path(resolved.adapter) if resolved.adapter else None
    name = (adapter or Path(resolved.path)).name if not resolved.builtin else "smollm2-135m-instruct"
    return Plan(pick_engine(engine), model_dir, adapter=adapter, name=name)


def load_backend(
    p: Plan, *, max_tokens: int = 512, temperature: float = 0.7, n_ctx: int = 4096, seed: int = 0, slots: int = 8
) -> Any:
    """The `TokensInBackend` that `p` describes. A llama-server backend owns a running server: stop it with
    `backend.server.stop()` (`flowrl serve` does on exit)."""
    if p.engine == "llama-server":
        return _llama_server_backend(p, max_tokens=max_tokens, temperature=temperature, n_ctx=n_ctx, seed=seed,
                                     slots=slots)  # fmt: skip
    kwargs: dict[str, Any] = {
        "adapter": p.adapter,
        "max_new_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
    }
    if p.engine == "llama.cpp":
        return LlamaCppBackend(p.model_dir, gguf=p.gguf, n_ctx=n_ctx, **kwargs)
    return TransformersBackend(p.model_dir, batch_size=1, **kwargs)


def _llama_server_backend(p: Plan, *, max_tokens: int, temperature: float, n_ctx: int, seed: int, slots: int) -> Any:
    adapters: dict[str, Path] = {}
    if p.adapter is not None:  # beside the base, as a GGUF LoRA (written once into the adapter's folder)
        adapters[p.name] = lora_beside(p.adapter, p.model_dir)
    server = LlamaServer(p.gguf or gguf_for(p.model_dir), adapters=adapters, slots=slots, ctx_per_slot=n_ctx)
    server.start()
    try:
        return LlamaServerBackend(
            p.model_dir,
            server,
            adapter=p.name if p.adapter is not None else None,
            max_new_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
        )
    except BaseException:
        server.stop()
        raise


def open_route(p: Plan, **options: Any) -> tuple[Route, Callable[[], None]]:
    """The backend `p` describes (`load_backend`'s options) as a `flowrl.serve.model.Route`, and what stops its
    engine (a llama-server process; nothing for an in-process one)."""
    backend = load_backend(p, **options)
    server = getattr(backend, "server", None)
    return Route(backend, adapter=getattr(backend, "adapter_name", None)), (server.stop if server else nothing_to_stop)


def nothing_to_stop() -> None:
    """The stop of an engine that runs in this process: nothing to do."""
