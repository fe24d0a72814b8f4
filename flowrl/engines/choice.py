"""Which engine generates: `ENGINES` are the names `--engine` takes, and `pick_engine` makes `auto` concrete.

* `llama-server`: llama.cpp's own server (`flowrl.engines.llama_server`), several sequences per step, LoRA
  adapters per request; what `auto` picks when the binary is built (`make setup` builds it).
* `llama.cpp`: llama-cpp-python in-process (`flowrl.engines.llama_cpp_backend`), one sequence at a time, an
  adapter merged into a GGUF; `auto`'s second choice where a single sequence is enough (`flowrl serve`).
* `transformers`: the fallback; batches concurrent calls in one process.

Every choice `auto` makes other than llama-server is said once in the log, with the command that builds it. It
imports nothing heavy; the backends themselves are imported by whoever loads one.
"""

from __future__ import annotations

import logging

from flowrl.engines.llama_cpp_backend import INSTALL_HINT, llama_cpp_available
from flowrl.errors import ConfigError

log = logging.getLogger(__name__)
ENGINES = ("auto", "llama-server", "llama.cpp", "transformers")


def pick_engine(engine: str, *, batched: bool = False) -> str:
    """`engine`, with `auto` made concrete (and a fallback logged). `batched`: the caller runs many sequences
    with adapters chosen per request (`flowrl improve`, `flowrl eval`), which llama.cpp in-process cannot."""
    from flowrl.engines import llama_server  # lazy: the package's __init__ imports this module

    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine}: use one of {', '.join(ENGINES)}")
    if engine == "llama.cpp" and batched:
        raise ConfigError(
            "--engine llama.cpp decodes one sequence at a time with one merged adapter: use llama-server (several "
            "sequences per step, adapters per request) or transformers"
        )
    if engine == "llama.cpp" and not llama_cpp_available():
        raise ConfigError(f"--engine llama.cpp needs llama-cpp-python: {INSTALL_HINT}")
    if engine == "llama-server":
        llama_server.find_binary()  # one line naming the build when it is missing
    if engine != "auto":
        return engine
    if llama_server.available():
        return "llama-server"
    if not batched and llama_cpp_available():
        log.warning("generating with llama.cpp in-process, one sequence at a time: %s", llama_server.BUILD_HINT)
        return "llama.cpp"
    log.warning(
        "generating with transformers, several times slower on a CPU than llama-server: %s", llama_server.BUILD_HINT
    )
    return "transformers"
