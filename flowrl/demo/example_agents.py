"""The example agent for `flowrl improve` and `flowrl eval --agent example`: one factory, one sandbox.

`ExampleAgents(model_dir)` is a context manager; called with a `Policy` it returns an `ExampleAgent` whose
local backend runs the base model with the policy's adapter (merged in) at the policy's temperature. Backends
are cached per (adapter, temperature), and the code sandbox is shared by every agent it makes.

`engine` picks the backend: `llama.cpp` (`LlamaCppBackend`: a GGUF of the policy, 4-6x faster on a CPU, one
call at a time), `transformers` (`TransformersBackend`: batches concurrent calls), or `auto`: llama.cpp when
llama-cpp-python is installed, else transformers, said once in the log either way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.improve.loop import Policy

log = logging.getLogger(__name__)
ENGINES = ("auto", "llama.cpp", "transformers")


def pick_engine(engine: str) -> str:
    """`engine`, with `auto` made concrete (and the choice logged)."""
    from flowrl.demo.llama_backend import INSTALL_HINT, llama_cpp_available

    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine}: use one of {', '.join(ENGINES)}")
    if engine == "llama.cpp" and not llama_cpp_available():
        raise ConfigError(f"--engine llama.cpp needs llama-cpp-python: {INSTALL_HINT}")
    if engine != "auto":
        return engine
    if llama_cpp_available():
        log.info("generating with llama.cpp (llama-cpp-python is installed)")
        return "llama.cpp"
    log.warning("generating with transformers, 4-6x slower on a CPU than llama.cpp: %s", INSTALL_HINT)
    return "transformers"


class ExampleAgents:
    def __init__(
        self, model_dir: str | Path, *, max_new_tokens: int = 64, batch_size: int = 8, engine: str = "auto"
    ) -> None:
        self.model_dir = Path(model_dir)
        self.engine = pick_engine(engine)
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self._sandbox: Any = None
        self._backends: dict[tuple[str | None, float, int], Any] = {}

    def __enter__(self) -> ExampleAgents:
        from flowrl.rewards.sandbox import Sandbox

        self._sandbox = Sandbox(workers=1).__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._sandbox is not None:
            self._sandbox.__exit__(*exc)
        self._backends.clear()

    @property
    def concurrency(self) -> int:
        """Agent runs worth running at once: llama.cpp decodes one call at a time, and one run at a time keeps
        the whole conversation in its KV cache (2 runs: 40 against 49 new tokens/s); transformers batches up to
        `batch_size` calls."""
        return 1 if self.engine == "llama.cpp" else self.batch_size

    def backend(self, policy: Policy) -> Any:
        key = (str(policy.adapter) if policy.adapter else None, policy.temperature, policy.seed)
        if key not in self._backends:
            self._backends.clear()  # one model in memory at a time
            kwargs: dict[str, Any] = {
                "adapter": policy.adapter,
                "max_new_tokens": self.max_new_tokens,
                "temperature": policy.temperature,
                "seed": policy.seed,
            }
            if self.engine == "llama.cpp":
                from flowrl.demo.llama_backend import LlamaCppBackend

                self._backends[key] = LlamaCppBackend(self.model_dir, **kwargs)
            else:
                from flowrl.demo.backend import TransformersBackend

                self._backends[key] = TransformersBackend(self.model_dir, batch_size=self.batch_size, **kwargs)
        return self._backends[key]

    def __call__(self, policy: Policy) -> Any:
        from flowrl.demo.agent import ExampleAgent

        if self._sandbox is None:
            raise RuntimeError("use ExampleAgents as a context manager (it owns the code sandbox)")
        return ExampleAgent(self.backend(policy), sandbox=self._sandbox, seed=policy.seed)


def example_tasks(train_tasks: int, eval_tasks: int, *, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """`train_tasks` and `eval_tasks` tasks of the generated suite, from its two disjoint parts."""
    from flowrl.demo import suite as tasks_suite

    tasks = tasks_suite.suite(seed=seed)
    train, held_out = tasks_suite.split(tasks, held_out=max(eval_tasks, 150), seed=seed)
    return list(train)[:train_tasks], list(held_out)[:eval_tasks]


def example_grade(task: Any, answer: str) -> bool:
    from flowrl.demo import suite as tasks_suite

    return bool(tasks_suite.grade(task, answer))


def example_adapter(train_tasks: int = 400, seed: int = 0) -> Any:
    """The example agent for online GRPO (`flowrl train --method grpo --agent example`): an `ExampleAgent` per
    rollout on the policy's backend, its tools executed (`exec_code` in one shared sandbox, started on the first
    rollout), on the training part of the generated suite, each task's answer its reference."""
    from flowrl.demo.agent import ExampleAgent
    from flowrl.rewards.sandbox import Sandbox
    from flowrl.train.agent_rollout import AgentAdapter

    sandbox: dict[str, Any] = {}

    def make_agent(backend: Any) -> Any:
        if "box" not in sandbox:
            sandbox["box"] = Sandbox(workers=1).__enter__()
        return ExampleAgent(backend, sandbox=sandbox["box"], seed=seed)

    def close() -> None:
        if "box" in sandbox:
            sandbox.pop("box").__exit__(None, None, None)

    train, _held_out = example_tasks(train_tasks, 0, seed=seed)
    return AgentAdapter(make_agent=make_agent, tasks=train, name="example agent", close=close)
