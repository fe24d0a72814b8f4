"""Obs run files and live files by run id, and which part of a run a checkpoint turn is."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from flowrl.errors import IngestError
from flowrl.ingest.checkpoint import ChatTurn
from flowrl.ingest.ids import answer_key, norm
from flowrl.ingest.obs import LIVE_FILE_RE, RUN_FILE_RE, RunView, read_live, read_obs_run
from flowrl.ingest.transcript import Segment


def stat_sig(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def run_id_of(path: Path) -> str | None:
    m = RUN_FILE_RE.match(path.name) or LIVE_FILE_RE.match(path.name)
    return m.group(1) if m else None


class RunIndex:
    """Obs run files and live files by run id, parsed on demand (small LRU, refreshed when a file changes)."""

    def __init__(self, cache_size: int = 32) -> None:
        self._paths: dict[str, set[Path]] = {}
        self._cache: OrderedDict[Path, tuple[tuple[int, int] | None, RunView | None]] = OrderedDict()
        self._cache_size = cache_size
        self.generation = 0  # bumps whenever a file is added, changed or removed

    def add(self, path: Path, *, changed: bool = False) -> None:
        """Know about a run file (`changed`: its content may differ from what was read before)."""
        run_id = run_id_of(path)
        if run_id is None:
            return
        paths = self._paths.setdefault(run_id, set())
        if path not in paths or changed:
            paths.add(path)
            self.generation += 1

    def discard(self, path: Path) -> None:
        run_id = run_id_of(path)
        if run_id and path in self._paths.get(run_id, set()):
            self._paths[run_id].discard(path)
            self._cache.pop(path, None)
            self.generation += 1

    def view(self, path: Path, raw: bytes | None = None) -> RunView:
        """Parse (or reuse) one run file. Raises IngestError."""
        sig = stat_sig(path)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == sig and sig is not None and raw is None:
            self._cache.move_to_end(path)
            if cached[1] is None:
                raise IngestError(f"{path}: unreadable (see its own report)")
            return cached[1]
        try:
            run = read_live(path, raw) if path.name.endswith(".jsonl") else read_obs_run(path, raw)
        except IngestError:
            self._remember(path, sig, None)
            raise
        self._remember(path, sig, run)
        return run

    def _remember(self, path: Path, sig: tuple[int, int] | None, run: RunView | None) -> None:
        self._cache[path] = (sig, run)
        self._cache.move_to_end(path)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def get(self, run_id: str, agent: str, session_id: str) -> RunView | None:
        """The run of a checkpoint turn: obs run file first, then a live file; None when neither is readable."""
        for path in sorted(self._paths.get(run_id, ()), key=lambda p: (p.name.endswith(".jsonl"), str(p))):
            try:
                run = self.view(path)
            except IngestError:
                continue
            if (run.agent and run.agent != agent) or (run.session_id and run.session_id != session_id):
                continue
            return run
        return None


def match_segment(run: RunView, turn: ChatTurn) -> Segment | None:
    """Which part of the run a checkpoint turn is: by answer, else (first turn only) by query."""
    key = answer_key(turn.answer)
    hits = [s for s in run.segments if s.answer is not None and answer_key(s.answer) == key]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        return None if turn.ambiguous_head else next((s for s in hits if s.index == turn.occurrence), None)
    first = run.segments[0] if run.segments else None
    if first is not None and turn.occurrence == 0 and not turn.ambiguous_head and norm(first.query) == norm(turn.query):
        return first
    return None
