"""`CaptureOptions`: what `hook_into_agent` accepts, declared once.

Each field is one keyword of `hook_into_agent(agent, store, **options)`, with its default. `CHECKS` turns what a
caller gave into the stored value (ConfigError names the option); the fields that depend on the agent (`adapter`
"auto", `agent_name`) are resolved by the hook, which knows its adapters. A re-hook compares what it is given
with the stored values through the same checks (`hook._differences`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from flowrl.capture import clients as clients_table
from flowrl.capture.registration import (
    DEFAULT_EXIT_TIMEOUT,
    DEFAULT_IO_THREADS,
    DEFAULT_MAX_CHARS,
    DEFAULT_QUEUE_SIZE,
)
from flowrl.errors import ConfigError
from flowrl.trace.schema import SOURCES

DEFAULT_MAX_EVENTS = 10_000


@dataclass(frozen=True)
class CaptureOptions:
    """One hook's options (see `hook_into_agent` for each one's meaning)."""

    adapter: str = "auto"  # "auto", or a name in `hook.ADAPTERS`
    run_methods: tuple[str, ...] | None = None  # None: the adapter's defaults
    tool_methods: tuple[str, ...] | None = None
    llm_methods: tuple[str, ...] | None = None
    mask: Callable[[str], str] | None = None
    redact: bool = True
    max_events_per_run: int = DEFAULT_MAX_EVENTS
    max_chars: int | None = DEFAULT_MAX_CHARS
    queue_size: int = DEFAULT_QUEUE_SIZE
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT
    io_threads: int = DEFAULT_IO_THREADS
    agent_name: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: str = "live"
    on_trace: Callable[[Any], None] | None = None
    llm_clients: tuple[str, ...] | str = "auto"  # stored checked: the client names

    def writer(self) -> dict[str, Any]:
        """The options of the store's collector (`collector.attach`)."""
        return {
            "io_threads": self.io_threads,
            "mask": self.mask,
            "queue_size": self.queue_size,
            "redact": self.redact,
            "max_chars": self.max_chars,
            "exit_timeout": self.exit_timeout,
        }

    @property
    def clients(self) -> tuple[str, ...]:
        """The LLM client libraries to patch (`llm_clients`, checked)."""
        return client_names(self.llm_clients) if isinstance(self.llm_clients, str) else self.llm_clients


NAMES: tuple[str, ...] = tuple(f.name for f in fields(CaptureOptions))


def check_names(given: Iterable[str], what: str = "hook_into_agent") -> None:
    unknown = sorted(set(given) - set(NAMES))
    if unknown:
        raise ConfigError(f"unknown option(s) for {what}: {', '.join(unknown)} (known: {', '.join(sorted(NAMES))})")


def method_names(value: Any, option: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    names = tuple(value)
    if not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ConfigError(f"{option} must be a list of method names, got {value!r}")
    return names


def client_names(value: Any) -> tuple[str, ...]:
    """The `llm_clients` option: "auto" (every client library flowrl knows that is importable), a list of
    names (`clients.CLIENTS`), or None/[] (none)."""
    if value == "auto":
        return clients_table.auto_clients()
    if value is None or value is False:
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        names = list(value)
    except TypeError:
        raise ConfigError(f"llm_clients must be 'auto' or a list of names, not {value!r}") from None
    unknown = [n for n in names if n not in clients_table.CLIENTS]
    if unknown:
        raise ConfigError(
            f"llm_clients: unknown client(s) {unknown!r} (known: {', '.join(clients_table.CLIENTS)}, or 'auto')"
        )
    missing = [n for n in names if not clients_table.importable(n)]
    if missing:
        raise ConfigError(f"llm_clients: {', '.join(missing)} cannot be imported here (install it, or leave it out)")
    return tuple(dict.fromkeys(names))


def _max_events(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"max_events_per_run must be a non-negative integer, not {value!r}")
    return value


def _callable(option: str, takes: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and not callable(value):
            raise ConfigError(f"{option} must be a callable {takes}")
        return value

    return check


def _source(value: Any) -> str:
    if value not in SOURCES:
        raise ConfigError(f"source {value!r}: use one of {', '.join(SOURCES)}")
    return str(value)


def _seconds(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"hook_into_agent: exit_timeout must be a number of seconds, not {value!r}") from None


# option -> what a given value is stored as; an option without a check is stored as given (the collector checks
# queue_size, io_threads and max_chars when it attaches the hook)
CHECKS: dict[str, Callable[[Any], Any]] = {
    "run_methods": lambda v: method_names(v, "run_methods"),
    "tool_methods": lambda v: method_names(v, "tool_methods"),
    "llm_methods": lambda v: method_names(v, "llm_methods"),
    "mask": _callable("mask", "taking and returning a str"),
    "redact": bool,
    "max_events_per_run": _max_events,
    "exit_timeout": _seconds,
    "metadata": lambda v: dict(v or {}),
    "source": _source,
    "on_trace": _callable("on_trace", "taking the written ExecutionTrace"),
    "llm_clients": client_names,
}


def checked(name: str, value: Any) -> Any:
    """`value` of option `name` as a hook stores it (ConfigError when it cannot be one)."""
    check = CHECKS.get(name)
    return check(value) if check is not None else value


def capture_options(given: Mapping[str, Any]) -> CaptureOptions:
    """The options `given` (a subset of `NAMES`), checked, over the defaults. `adapter` and `agent_name` are
    stored as given: the hook resolves them for its agent."""
    defaults = CaptureOptions()
    values = {name: checked(name, given.get(name, getattr(defaults, name))) for name in NAMES}
    return CaptureOptions(**values)
