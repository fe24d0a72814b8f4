"""The ingest engine: sources in, de-duplicated and masked traces out, one file at a time.

Order matters for joins: checkpoints are read first (oldest file first), each user turn joined by its run
id to the obs run file or live file of the same run; then obs runs and live files, whose segments
already taken from a checkpoint turn collapse into that trace by id; trace JSON files stream through as
they are found.

A trace id met again is a duplicate, unless the new file is richer than what the id was built from (an
obs file read after the checkpoint of the same run): with an `upgrade` callback (`upgrade.StoreUpgrader`)
the stored trace is then upgraded in place (`flowrl.ingest.upgrade`).

Nothing a file holds or is named stops the engine: what cannot be read is reported as rejected, odd
but readable things (an impossible time in a name) are counted in `summary.notes` and logged once.

Memory: one file is held at a time. What grows is the map of trace ids already seen (one short string
and a small int per distinct trace), one fingerprint per (agent, session), and a small cache of parsed
obs runs.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import FlowRLError, IngestError, StoreError
from flowrl.ingest.build import from_chat, from_segment, rejoined
from flowrl.ingest.checkpoint import ChatTurn, Checkpoint, split_turns
from flowrl.ingest.checkpoint_read import load_checkpoint
from flowrl.ingest.discover import CHECKPOINT, LANGFUSE, LIVE, OBS, TRACE, Source, iter_sources, reader
from flowrl.ingest.ids import interrupted_id, turn_id
from flowrl.ingest.openai_logs import Parsed
from flowrl.ingest.rl_traces import NotATrace, read_trace_file
from flowrl.ingest.runs import RunIndex, match_segment, run_id_of, stat_sig
from flowrl.ingest.summary import IngestSummary
from flowrl.ingest.times import file_time, json_safe, printable, valid_time
from flowrl.ingest.upgrade import transcript_rank
from flowrl.trace.facts import trace_facts
from flowrl.trace.redact import Redactor
from flowrl.trace.schema import ExecutionTrace
from flowrl.trace.schema import Source as TraceSource

log = logging.getLogger(__name__)

LIVE_IDLE_S = 300.0  # a live file untouched this long belongs to an interrupted run

# upgrade(trace_id, rank, make) -> bool: replace the stored trace by make(stored) when rank is richer
Upgrade = Callable[[str, int, Callable[[ExecutionTrace], ExecutionTrace]], bool]
Make = Callable[[ExecutionTrace], ExecutionTrace]

BAD_TIMESTAMP = "trace whose timestamp is no real time (the file's modification time was used)"
NOT_UTF8 = "text that is not valid UTF-8 (a file name, or inside the file) was escaped"


class NotReady(IngestError):
    """The file is still being written (a live file of a running run); try again later."""


def _fingerprint(messages: list[Any]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for m in messages:
        if isinstance(m, dict):
            h.update(str(m.get("role")).encode())
            h.update(b"\x1e")
            c = m.get("content")
            h.update(c.encode("utf-8", "surrogatepass") if isinstance(c, str) else repr(c).encode())
        h.update(b"\x1f")
    return h.digest()


@dataclass
class _SessionSeen:
    fingerprint: bytes
    generation: int
    read: int
    skip_reasons: Counter[str]


class Ingestor:
    """Turns sources into new traces. `exists(trace_id)` (the store's) makes re-runs add nothing;
    `upgrade` (`upgrade.StoreUpgrader`) lets a richer file upgrade a stored trace instead of being dropped."""

    def __init__(
        self,
        *,
        exists: Callable[[str], bool] | None = None,
        upgrade: Upgrade | None = None,
        redactor: Redactor | None = None,
        live_idle_s: float = LIVE_IDLE_S,
        clock: Callable[[], float] = time.time,
        on_file: Callable[[Source], None] | None = None,
    ) -> None:
        self.summary = IngestSummary()
        self.runs = RunIndex()
        # trace id -> how rich (`upgrade.richness`) what is stored under it is known to be, at least
        self.seen: dict[str, int] = {}
        self.redactor = redactor if redactor is not None else Redactor()
        self.live_idle_s = live_idle_s
        self._exists = exists
        self._upgrade = upgrade
        self._current: Path | None = None  # the file being read
        self._clock = clock
        self._on_file = on_file
        self._sessions: dict[tuple[str, str], _SessionSeen] = {}

    # -- driving ----------------------------------------------------------------------------------
    def run(self, paths: Iterable[Path], exclude: Iterable[Path] = ()) -> Iterator[ExecutionTrace]:
        """Discover and ingest everything under `paths` (IngestError for a path that does not exist)."""
        t0 = time.perf_counter()
        pending: list[Source] = []
        for src in iter_sources(paths, exclude):
            if src.kind == TRACE or reader(src.kind) is not None:
                yield from self.process([src])
            else:
                if src.kind in (OBS, LIVE):
                    self.runs.add(src.path)
                pending.append(src)
        yield from self.process(pending)
        self.summary.seconds += time.perf_counter() - t0

    def process(self, sources: Iterable[Source]) -> Iterator[ExecutionTrace]:
        """Ingest sources (checkpoints first, oldest first; then obs, live, traces). Problems are recorded."""
        rank = {CHECKPOINT: 0, OBS: 1, LIVE: 2, TRACE: 3, LANGFUSE: 5}  # scores: after their traces

        def order(s: Source) -> tuple[int, str]:
            return rank.get(s.kind, 3 if reader(s.kind) is not None else 4), str(s.path)

        for src in sorted(sources, key=order):
            try:
                yield from self.ingest_source(src)
            except NotReady as exc:
                self.summary.skip(str(exc).split(": ", 1)[-1])
            except NotATrace as exc:
                if src.explicit:
                    self.summary.reject(src.path, str(exc))
                else:
                    log.debug("flowrl: ignoring %s", exc)
            except IngestError as exc:  # the summary carries it (`rejected`): `flowrl ingest` prints it once
                self.summary.reject(src.path, str(exc))
                log.info("flowrl: rejected %s", printable(str(exc)))
        self.summary.masked = self.redactor.stats.masked

    def ingest_source(self, src: Source, raw: bytes | None = None) -> Iterator[ExecutionTrace]:
        """One source (`raw`: its bytes, already read); raises IngestError (NotReady: try later) or, when
        the store cannot be written, StoreError. A failure of flowrl's own on a file is an IngestError too,
        so one strange file never stops an ingest or a watch."""
        if self._on_file is not None:
            self._on_file(src)
        if src.problem:
            raise IngestError(src.problem)
        self._current = src.path
        try:
            yield from self._read(src, raw)
        except FlowRLError:
            raise
        except Exception as exc:
            log.warning("flowrl: reading %s failed", printable(str(src.path)), exc_info=True)
            raise IngestError(
                f"{src.path}: flowrl failed on this file ({type(exc).__name__}: {exc}); the rest "
                f"is ingested; please report it with the file"
            ) from exc

    def _read(self, src: Source, raw: bytes | None) -> Iterator[ExecutionTrace]:
        if src.kind == CHECKPOINT:
            yield from self._checkpoint(load_checkpoint(src.path, raw))
        elif src.kind in (OBS, LIVE):
            self.runs.add(src.path, changed=raw is not None)
            yield from self._run_file(src.path, raw)
        elif src.kind == TRACE:
            trace = read_trace_file(src.path, raw)
            self.summary.files_read += 1
            self.summary.read += 1
            out = self._offer(trace.trace_id, lambda: trace)
            if out is not None:
                yield out
        elif (read := reader(src.kind)) is not None:
            yield from self.ingest_parsed(read(src.path, raw))
        elif src.kind == LANGFUSE:
            self._langfuse_scores(src.path, raw)
        else:
            raise IngestError(f"{src.path}: not a file flowrl reads")

    # -- checkpoints ------------------------------------------------------------------------------
    def _checkpoint(self, cp: Checkpoint) -> Iterator[ExecutionTrace]:
        self.summary.files_read += 1
        for note in cp.notes:
            self._note(note)
        for history in cp.sessions:
            key = (cp.agent, history.session_id)
            fp = _fingerprint(history.messages)
            seen = self._sessions.get(key)
            if seen is not None and seen.fingerprint == fp and seen.generation == self.runs.generation:
                # The same session as in an earlier snapshot, with nothing new to join it to.
                n_skipped = sum(seen.skip_reasons.values())
                self.summary.read += seen.read
                self.summary.duplicate += seen.read - n_skipped
                for reason, n in seen.skip_reasons.items():
                    self.summary.skip(reason, n)
                continue
            read0, reasons0 = self.summary.read, Counter(self.summary.skip_reasons)
            for turn in split_turns(history):
                trace = self._turn(cp, turn)
                if trace is not None:
                    yield trace
            self._sessions[key] = _SessionSeen(
                fp, self.runs.generation, self.summary.read - read0, self.summary.skip_reasons - reasons0
            )

    def _turn(self, cp: Checkpoint, turn: ChatTurn) -> ExecutionTrace | None:
        self.summary.read += 1
        if turn.answer is None:
            self._skip("user message without an answer after it (a sidecar question, or a commit in progress)")
            return None
        run = self.runs.get(turn.run_id, cp.agent, turn.session_id) if turn.run_id else None
        seg = match_segment(run, turn) if run is not None else None
        if run is not None and seg is not None and seg.query is not None:
            query = seg.query
            tid = turn_id(
                cp.agent, turn.session_id, turn.run_id, query, seg.answer if seg.answer is not None else turn.answer
            )
            return self._offer(
                tid,
                lambda: from_segment(
                    run,
                    seg,
                    trace_id=tid,
                    source="checkpoint",
                    query=query,
                    answer=turn.answer,
                    checkpoint=cp,
                    turn=turn,
                ),
                rank=transcript_rank(run.transcript_source),
            )
        if turn.run_id is not None and turn.occurrence > 0:
            self._skip(
                "auto-resumed turn whose follow-up query is only in its obs/live file, which is gone "
                "(chat_history repeats the original query)"
            )
            return None
        slot = turn.run_id or (f"ts:{turn.timestamp}" if turn.timestamp else "")
        tid = turn_id(cp.agent, turn.session_id, slot, turn.query, turn.answer, 0 if turn.run_id else turn.occurrence)
        if turn.run_id is not None and turn.ambiguous_head and not self._known(tid):
            self._skip(
                "oldest turn of a history cut at max_history: without its obs file it cannot be told "
                "from an auto-resumed turn"
            )
            return None
        return self._offer(tid, lambda: from_chat(turn, cp, trace_id=tid), rank=transcript_rank("chat_history"))

    # -- obs runs and live files ------------------------------------------------------------------
    def _run_file(self, path: Path, raw: bytes | None = None) -> Iterator[ExecutionTrace]:
        if path.name.endswith(".jsonl"):
            run_id = run_id_of(path)
            if run_id and (path.parent / f"run_{run_id}.json").exists():
                self.summary.skip("live file of a run that has its run file")
                return
            sig = stat_sig(path)
            if sig is None:
                raise IngestError(f"{path}: vanished before it could be read")
            if self._clock() - sig[1] / 1e9 < self.live_idle_s:
                raise NotReady(f"{path}: live file of a run still in progress")
        run = self.runs.view(path, raw)
        self.summary.files_read += 1
        last = len(run.segments) - 1
        for seg in run.segments:
            self.summary.read += 1
            if seg.query is None:
                self._skip("auto-resumed part of a run without the follow-up user message")
                continue
            finished = run.finished or (seg.answer is not None and seg.index < last)
            source: TraceSource
            if finished:
                tid = turn_id(run.agent, run.session_id, run.run_id, seg.query, seg.answer)
                source = "obs" if run.kind == "obs" else "live-file"
            else:
                tid = interrupted_id(run.agent, run.session_id, run.run_id, seg.query)
                source = "live-file"
            trace = self._offer(
                tid,
                partial(from_segment, run, seg, trace_id=tid, source=source, query=seg.query, answer=None),
                rank=transcript_rank(run.transcript_source),
                rebuild=partial(rejoined, run=run, seg=seg, source=source),
            )
            if trace is not None:
                yield trace

    # -- OTLP traces and OpenAI-format logs (flowrl.ingest.otlp, flowrl.ingest.openai_logs) ----------
    def ingest_parsed(self, parsed: Parsed) -> Iterator[ExecutionTrace]:
        """The new traces of a reader's `Parsed` (a file, or an OTLP request): masked and de-duplicated like every
        ingested trace; its skips and notes counted in `summary`."""
        self.summary.files_read += 1
        for note in parsed.notes:
            self._note(note)
        for reason in parsed.skipped:
            self.summary.read += 1
            self._skip(reason)
        for tid, trace in parsed.traces:
            self.summary.read += 1
            out = self._offer(tid, lambda trace=trace: trace)  # type: ignore[misc]
            if out is not None:
                yield out

    def _langfuse_scores(self, path: Path, raw: bytes | None) -> None:
        """A Langfuse scores file: its scores become host outcomes of the stored runs they name (the store comes
        with the `upgrade` callback, `StoreUpgrader`; without a store they are skipped)."""
        from flowrl.ingest import langfuse  # lazy: the package's __init__ imports this module

        got = langfuse.read_scores(path, raw)
        self.summary.files_read += 1
        for note in got.notes:
            self._note(note)
        for reason in got.skipped:
            self._skip(reason)
        store = getattr(self._upgrade, "store", None)
        if store is None:
            self.summary.skip("Langfuse score not recorded: scores become host outcomes in a store", len(got.scores))
            return
        before = getattr(self._upgrade, "before", None)
        if before is not None:
            before()  # the traces read so far are on disk, where the lookup finds them
        recorded, lost = langfuse.record_scores(store, got.scores)
        if lost:
            self.summary.skip(langfuse.NOT_STORED, len(lost))
        if recorded:
            self.summary.note("Langfuse score recorded as a host outcome (source langfuse)", recorded)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _skip(self, reason: str) -> None:
        self.summary.skip(reason)

    def _note(self, reason: str) -> None:
        """Something odd that did not stop anything: counted, and logged the first time."""
        if reason not in self.summary.notes:
            log.warning("flowrl: %s: %s (logged once; the summary counts them)", printable(str(self._current)), reason)
        self.summary.note(reason)

    def _known(self, trace_id: str) -> bool:
        """Already ingested: in this run, or in the store."""
        return self._known_rank(trace_id) is not None

    def _known_rank(self, trace_id: str) -> int | None:
        """How rich the trace already stored (or yielded) under `trace_id` is at least; None: not known."""
        rank = self.seen.get(trace_id)
        if rank is None and self._exists is not None and self._exists(trace_id):
            rank = self.seen[trace_id] = 0  # a lower bound: the upgrade reads the stored trace to be sure
        return rank

    def _prepare(self, trace: ExecutionTrace) -> ExecutionTrace:
        """Mask, make storable (JSON holds no lone surrogates; a timestamp names a real day) and add facts."""
        data = self.redactor.redact(trace.model_dump(mode="json"))
        try:
            orjson.dumps(data)
        except orjson.JSONEncodeError:
            data, changed = json_safe(data)
            if changed:
                self._note(NOT_UTF8)
        trace = ExecutionTrace.model_validate(data)
        timestamp = valid_time(trace.timestamp)
        if timestamp is None:
            self._note(BAD_TIMESTAMP)
            timestamp = (file_time(self._current) if self._current is not None else None) or datetime.now().isoformat()
        trace.timestamp = timestamp
        trace.facts = trace_facts(trace)  # from the redacted fields: a task key never holds a secret
        return trace

    def _offer(
        self, trace_id: str, build: Callable[[], ExecutionTrace], *, rank: int = 0, rebuild: Make | None = None
    ) -> ExecutionTrace | None:
        """The trace to store under `trace_id`, or None: a duplicate, an upgrade done in place, or a skip.

        `rank`: how rich `build()` is (`upgrade.richness`); `rebuild(stored)`: the same trace built for an
        id already stored (default `build()`)."""
        known = self._known_rank(trace_id)
        if known is not None:
            if rank > known and self._upgrade is not None:
                self._try_upgrade(trace_id, rank, rebuild or (lambda _stored: build()))
            else:
                self.summary.duplicate += 1
            return None
        try:
            trace = self._prepare(build())
        except Exception as exc:  # a malformed record must not stop the ingest
            log.warning("flowrl: could not build trace %s: %s", trace_id, exc, exc_info=True)
            self.summary.skip(f"could not build a trace ({type(exc).__name__})")
            return None
        self.seen[trace_id] = rank
        self.summary.new += 1
        self.summary.new_by_source[trace.source] += 1
        return trace

    def _try_upgrade(self, trace_id: str, rank: int, rebuild: Make) -> None:
        assert self._upgrade is not None
        try:
            changed = self._upgrade(trace_id, rank, lambda stored: self._prepare(rebuild(stored)))
        except StoreError:
            raise
        except Exception as exc:  # as for a new trace: a malformed record is skipped
            log.warning("flowrl: could not upgrade trace %s: %s", trace_id, exc, exc_info=True)
            self.summary.skip(f"could not build a trace ({type(exc).__name__})")
            return
        self.seen[trace_id] = max(rank, self.seen.get(trace_id, 0))
        if changed:
            self.summary.upgraded += 1
        else:
            self.summary.duplicate += 1
