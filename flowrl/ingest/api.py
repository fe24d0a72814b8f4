"""The library entry points: `ingest_paths` (into a store) and `CheckpointLoader` (traces in memory)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from flowrl.errors import IngestError
from flowrl.ingest.discover import Source
from flowrl.ingest.engine import LIVE_IDLE_S, Ingestor
from flowrl.ingest.summary import IngestSummary
from flowrl.redact import Redactor
from flowrl.schema import ExecutionTrace


class _Writer:
    """Writes traces to the store on a few threads: each write is fsynced, and fsync waits on the disk,
    not the CPU, so overlapping them multiplies throughput. At most `max_pending` traces are in flight."""

    def __init__(self, store: Any, threads: int, max_pending: int = 64) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.store = store
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flowrl-ingest-write") if threads > 1 else None
        self.pending: deque[Any] = deque()
        self.max_pending = max_pending

    def put(self, trace: ExecutionTrace) -> None:
        if self.pool is None:
            self.store.write(trace)
            return
        self.pending.append(self.pool.submit(self.store.write, trace))
        while len(self.pending) >= self.max_pending or (self.pending and self.pending[0].done()):
            self.pending.popleft().result()  # re-raises a StoreError from the worker

    def close(self) -> None:
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)


def ingest_paths(paths: Iterable[Path | str], store: Any = None, *, redactor: Redactor | None = None,
                 live_idle_s: float = LIVE_IDLE_S, on_file: Callable[[Source], None] | None = None,
                 write_threads: int = 8) -> IngestSummary:
    """Ingest everything under `paths` into `store` (default: `TraceStore.default()`). Returns the summary.

    Raises IngestError for a path that does not exist and StoreError when the store cannot be written;
    every other problem is recorded in the summary and the rest is ingested."""
    from flowrl.store import TraceStore

    store = store if store is not None else TraceStore.default()
    engine = Ingestor(exists=store.exists, redactor=redactor, live_idle_s=live_idle_s, on_file=on_file)
    writer = _Writer(store, write_threads)
    t0 = time.perf_counter()
    try:
        for trace in engine.run([Path(p) for p in paths], exclude=[store.root]):
            writer.put(trace)
    finally:
        writer.close()
    engine.summary.seconds = time.perf_counter() - t0
    return engine.summary


class CheckpointLoader:
    """Traces from FlowAgent checkpoints, obs and live files and rl_traces JSON, without a store.

        traces = CheckpointLoader("~/.data/main-vm/Agents").load()

    Every trace is masked (`flowrl.redact.Redactor`) and de-duplicated within the call; `summary` tells
    what was read, skipped and rejected. `iter_traces()` streams instead of building a list."""

    def __init__(self, *paths: Path | str, redactor: Redactor | None = None, live_idle_s: float = LIVE_IDLE_S) -> None:
        if not paths:
            raise IngestError("CheckpointLoader needs at least one path (a data dir, Agents/ dir, checkpoint dir or file)")
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
