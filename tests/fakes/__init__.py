"""Fakes for tests: agents and helpers that need no network, no model and no GPU."""

from __future__ import annotations

from typing import Any

from flowrl.store.files import TraceStore


def stored(store: TraceStore | Any) -> list[dict[str, Any]]:
    """Every trace in `store` as a dict, oldest first (timestamp order)."""
    store = store if isinstance(store, TraceStore) else TraceStore(store)
    return sorted((t.to_dict() for t in store.iter_traces()), key=lambda d: d["timestamp"])


def flushed(hook: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Flush a hook and return what its store holds."""
    assert hook.flush(timeout), f"flush failed: {hook.stats}"
    return stored(hook.store)
