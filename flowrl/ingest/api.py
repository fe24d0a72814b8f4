"""The library entry points: `ingest_paths` (into a store) and `CheckpointLoader` (traces in memory)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from flowrl.errors import IngestError
from flowrl.ingest.discover import Source
from flowrl.ingest.engine import LIVE_IDLE_S, Ingestor
from flowrl.ingest.summary import IngestSummary
from flowrl.ingest.upgrade import StoreUpgrader
from flowrl.store.files import TraceStore
from flowrl.trace.redact import Redactor
from flowrl.trace.schema import ExecutionTrace


class _Writer:
    """Writes traces to the store in batches: `TraceStore.write_many` syncs the filesystem once per batch
    instead of fsyncing every file, which is what bounds the write rate on a real disk."""

    def __init__(self, store: Any, batch: int = 256) -> None:
        self.store = store
        self.batch = batch
        self.buffer: list[ExecutionTrace] = []
        self.bulk = callable(getattr(store, "write_many", None))

    def put(self, trace: ExecutionTrace) -> None:
        if not self.bulk:
            self.store.write(trace)
            return
        self.buffer.append(trace)
        if len(self.buffer) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            batch, self.buffer = self.buffer, []
            self.store.write_many(batch)

    def close(self) -> None:
        self.flush()


def ingest_paths(
    paths: Iterable[Path | str],
    store: Any = None,
    *,
    redactor: Redactor | None = None,
    live_idle_s: float = LIVE_IDLE_S,
    on_file: Callable[[Source], None] | None = None,
    batch_size: int = 256,
) -> IngestSummary:
    """Ingest everything under `paths` into `store` (default: `TraceStore.default()`). Returns the summary.

    A run already stored from a poorer file (a checkpoint read before its obs file) is upgraded in place
    (`summary.upgraded`, see `flowrl.ingest.upgrade`). Raises IngestError for a path that does not exist
    and StoreError when the store cannot be written; every other problem is recorded in the summary and
    the rest is ingested."""
    store = store if store is not None else TraceStore.default()
    writer = _Writer(store, batch_size)
    upgrade = StoreUpgrader(store, before=writer.flush) if callable(getattr(store, "modify", None)) else None
    engine = Ingestor(exists=store.exists, upgrade=upgrade, redactor=redactor, live_idle_s=live_idle_s, on_file=on_file)
    t0 = time.perf_counter()
    try:
        for trace in engine.run([Path(p) for p in paths], exclude=[store.root]):
            writer.put(trace)
        writer.close()
    except BaseException:
        writer.close()  # what was read before a failure or Ctrl-C is still stored
        raise
    engine.summary.seconds = time.perf_counter() - t0
    return engine.summary


class CheckpointLoader:
    """Traces from FlowAgent checkpoints, obs and live files and rl_traces JSON, without a store.

        traces = CheckpointLoader("~/.data/main-vm/Agents").load()

    Every trace is masked (`flowrl.trace.redact.Redactor`) and de-duplicated within the call; `summary` tells
    what was read, skipped and rejected. `iter_traces()` streams instead of building a list."""

    def __init__(self, *paths: Path | str, redactor: Redactor | None = None, live_idle_s: float = LIVE_IDLE_S) -> None:
        if not paths:
            raise IngestError(
                "CheckpointLoader needs at least one path (a data dir, Agents/ dir, checkpoint dir or file)"
            )
        self.paths = [Path(p).expanduser() for p in paths]
        self.redactor = redactor
        self.live_idle_s = live_idle_s
        self.summary = IngestSummary()

    def iter_traces(self) -> Iterator[ExecutionTrace]:
        engine = Ingestor(redactor=self.redactor, live_idle_s=self.live_idle_s)
        self.summary = engine.summary
        yield from engine.run(self.paths)

    def load(self) -> list[ExecutionTrace]:
        return list(self.iter_traces())
