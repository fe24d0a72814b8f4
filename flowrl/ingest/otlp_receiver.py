"""`flowrl serve-otlp`: an OTLP/HTTP trace receiver on localhost that writes agent runs into the store.

    flowrl serve-otlp --store traces/                       # listens on http://127.0.0.1:4318
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python my_app.py   # the app sets nothing else

`POST /v1/traces` takes an `ExportTraceServiceRequest` as OTLP JSON (`application/json`) or protobuf
(`application/x-protobuf`, needs the `otel` extra), gzip-compressed or not, and answers as OTLP/HTTP asks (200 with
an empty response of the same encoding; 400 for a body that is not one, 415 for another content type, 413 for a
body over `MAX_BODY`). Spans are read by `flowrl.ingest.otlp` (the same conventions as `flowrl ingest`).

An exporter sends a run's spans in several requests (a `BatchSpanProcessor` exports spans as they end: the run's
root span last), so spans wait here, per OTel trace, until the trace's root span has arrived; a trace whose root
never comes is dropped after `pending_s` seconds without a new span, counted as skipped. Every trace is masked
(`Redactor`) and de-duplicated like an ingested one (`Ingestor`: the same run sent twice is stored once).

Langfuse: `POST /api/public/otel/v1/traces` is the same as `/v1/traces` (where the Langfuse SDK v3 exports its
observations), and `POST /api/public/ingestion` takes the SDK's score batches (JSON `{"batch": [{"type":
"score-create", ...}]}`), answered as Langfuse does (207 with a status per event). A score becomes a host outcome
of the run of its OTel trace (`flowrl.ingest.langfuse`): of a run received here or already in the store, or of one
whose spans are still waiting (the score waits with them, and is dropped and counted with them). So an
application with `LANGFUSE_HOST=http://127.0.0.1:4318` (any keys) delivers its runs and their scores here.

The server binds 127.0.0.1 unless told otherwise; another address is refused without `allow_remote`.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import FlowRLError, IngestError
from flowrl.ingest import langfuse
from flowrl.ingest.engine import Ingestor
from flowrl.ingest.openai_logs import Parsed
from flowrl.ingest.otlp import traces_from_spans
from flowrl.ingest.otlp_spans import Span, from_protobuf, spans_of
from flowrl.localhost import check_host
from flowrl.trace.redact import Redactor

log = logging.getLogger(__name__)

DEFAULT_PORT = 4318  # OTLP/HTTP's
MAX_BODY = 64 * 1024 * 1024
PENDING_S = 60.0
TRACE_PATHS = ("/v1/traces", "/api/public/otel/v1/traces")
INGESTION_PATH = "/api/public/ingestion"
_RUNS_KEPT = 10_000  # OTel trace id -> runs, for the scores that come after their trace


@dataclass
class ReceiverStats:
    requests: int = 0
    bad_requests: int = 0
    spans: int = 0
    written: int = 0
    duplicates: int = 0
    scores: int = 0  # Langfuse scores recorded as host outcomes
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


class OTLPReceiver:
    """The receiver's state, apart from HTTP: spans waiting per OTel trace, and the store they end in."""

    def __init__(
        self,
        store: Any,
        *,
        redactor: Redactor | None = None,
        pending_s: float = PENDING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.pending_s = pending_s
        self.stats = ReceiverStats()
        self._engine = Ingestor(exists=store.exists, redactor=redactor)
        self._waiting: dict[str, tuple[float, list[Span]]] = {}
        self._scores: dict[str, tuple[float, list[langfuse.Score]]] = {}  # scores waiting for their trace
        self._runs: dict[str, list[tuple[str, str]]] = {}  # OTel trace id -> runs received here
        self._lock = threading.Lock()
        self._clock = clock

    def receive(self, body: bytes, content_type: str, encoding: str = "") -> None:
        """One export request. IngestError (a 400) when the body is not an OTLP trace export."""
        if encoding.strip().lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError) as exc:
                raise IngestError(f"a gzip body that does not decompress ({exc})") from exc
        kind = content_type.split(";")[0].strip().lower()
        if kind == "application/x-protobuf":
            doc = from_protobuf(Path("<request>"), body)
        else:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise IngestError(f"a body that is not JSON ({exc})") from exc
        if not isinstance(doc, dict):
            raise IngestError("a JSON body that is not an ExportTraceServiceRequest object")
        spans = spans_of(doc)
        with self._lock:
            self.stats.requests += 1
            self.stats.spans += len(spans)
            now = self._clock()
            touched = set()
            for span in spans:
                waiting = self._waiting.get(span.trace_id, (now, []))[1]
                waiting.append(span)
                self._waiting[span.trace_id] = (now, waiting)  # the clock restarts with each new span
                touched.add(span.trace_id)
            ready = [t for t in touched if any(not s.parent_id for s in self._waiting[t][1])]
            batches = [self._waiting.pop(t)[1] for t in ready] + self._take_stale(now)
        for batch in batches:
            self._store(batch)

    def receive_scores(self, body: bytes, encoding: str = "") -> list[str]:
        """One Langfuse ingestion batch: its scores recorded (or waiting for their trace). Returns the ids of the
        events read. IngestError (a 400) when the body is not an ingestion batch."""
        if encoding.strip().lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError) as exc:
                raise IngestError(f"a gzip body that does not decompress ({exc})") from exc
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise IngestError(f"a body that is not JSON ({exc})") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("batch"), list):
            raise IngestError('a JSON body that is not a Langfuse ingestion batch ({"batch": [...]})')
        got = langfuse.scores_of(doc)
        with self._lock:
            self.stats.requests += 1
            for reason in [*got.skipped, *got.notes]:
                self.stats.skip(reason)
            unknown = {s.trace_id for s in got.scores if s.trace_id not in self._runs}
            unknown -= set(self._waiting)  # their spans are here, waiting for the root: the scores wait too
        found = langfuse.store_runs(self.store)(unknown) if unknown else {}
        with self._lock:
            for tid, runs in found.items():
                self._remember(tid, runs)
            known = {s.trace_id: self._runs[s.trace_id] for s in got.scores if s.trace_id in self._runs}
            per, lost = langfuse.outcomes_for(got.scores, known)
            now = self._clock()
            for s in lost:
                self._scores.setdefault(s.trace_id, (now, []))[1].append(s)
        self._record(per)
        return got.event_ids

    def _remember(self, otel_id: str, runs: list[tuple[str, str]]) -> None:
        known = self._runs.setdefault(otel_id, [])
        known.extend(r for r in runs if r not in known)
        while len(self._runs) > _RUNS_KEPT:  # the oldest first (dicts keep insertion order)
            self._runs.pop(next(iter(self._runs)))

    def _record(self, per: dict[str, list[langfuse.Score]]) -> None:
        if per:
            n = langfuse.record(self.store, per)
            with self._lock:
                self.stats.scores += n

    def _take_stale(self, now: float) -> list[list[Span]]:
        """The spans of the traces without a new span for `pending_s` (under the lock; a trace that just got a
        span is never one), taken out of the waiting room."""
        stale = [t for t, (seen, _) in self._waiting.items() if now - seen > self.pending_s]
        return [self._waiting.pop(t)[1] for t in stale]

    def sweep(self) -> None:
        """Give up on traces whose root span did not come within `pending_s`, and on scores whose trace did not
        come (counted as skipped)."""
        with self._lock:
            now = self._clock()
            batches = self._take_stale(now)
            lost = [
                t for t, (seen, _) in self._scores.items() if now - seen > self.pending_s and t not in self._waiting
            ]
            for t in lost:
                for _ in self._scores.pop(t)[1]:
                    self.stats.skip(langfuse.NOT_STORED)
        for batch in batches:
            self._store(batch)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _store(self, spans: list[Span]) -> None:
        parsed = Parsed()
        traces_from_spans(spans, "otlp-http", parsed)
        for reason in parsed.skipped:
            self.stats.skip(reason)
        fresh = list(self._engine.ingest_parsed(parsed))
        self.stats.duplicates += len(parsed.traces) - len(fresh)
        for trace in fresh:
            self.store.write(trace)
            self.stats.written += 1
        with self._lock:
            otel_ids = set()
            for tid, trace in parsed.traces:
                meta = trace.metadata.get("otlp") or {}
                otel_ids.add(str(meta.get("trace_id")))
                self._remember(str(meta.get("trace_id")), [(tid, str(meta.get("span_id") or ""))])
            scores = [s for t in otel_ids if t in self._scores for s in self._scores.pop(t)[1]]
            runs = {t: self._runs[t] for t in otel_ids if t in self._runs}
        if scores:
            per, lost = langfuse.outcomes_for(scores, runs)
            self._record(per)
            with self._lock:
                for _ in lost:
                    self.stats.skip(langfuse.NOT_STORED)


def make_server(
    receiver: OTLPReceiver, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, allow_remote: bool = False
) -> ThreadingHTTPServer:
    """The HTTP server (not started: `serve_forever()`); port 0 picks a free one (`server.server_address`)."""
    check_host(host, allow_remote, "serve-otlp", "anyone who can reach it can write into the store")

    class Handler(BaseHTTPRequestHandler):
        server_version = "flowrl-otlp"

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            path = self.path.split("?")[0].rstrip("/")
            if path not in (*TRACE_PATHS, INGESTION_PATH):
                self._reply(
                    HTTPStatus.NOT_FOUND,
                    b"only POST /v1/traces (or /api/public/otel/v1/traces) and /api/public/ingestion are served here",
                    "text/plain",
                )
                return
            ctype = self.headers.get("Content-Type", "application/json")
            if ctype.split(";")[0].strip().lower() not in ("application/json", "application/x-protobuf"):
                self._reply(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE, b"use application/json or application/x-protobuf", "text/plain"
                )
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, b"body too large or without a length", "text/plain")
                return
            body = self.rfile.read(length)
            event_ids: list[str] = []
            try:
                if path == INGESTION_PATH:
                    event_ids = receiver.receive_scores(body, self.headers.get("Content-Encoding", ""))
                else:
                    receiver.receive(body, ctype, self.headers.get("Content-Encoding", ""))
            except FlowRLError as exc:
                with receiver._lock:
                    receiver.stats.bad_requests += 1
                log.warning("flowrl serve-otlp: refused a request: %s", exc)
                self._reply(HTTPStatus.BAD_REQUEST, str(exc).encode(), "text/plain")
                return
            except Exception as exc:  # flowrl's own failure: the exporter retries, the server goes on
                log.warning("flowrl serve-otlp: a request failed: %r", exc, exc_info=True)
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"flowrl failed on this request", "text/plain")
                return
            if path == INGESTION_PATH:  # what Langfuse answers, and its SDK reads: a status per event
                ok = [{"id": i, "status": 201} for i in event_ids]
                self._reply(HTTPStatus.MULTI_STATUS, orjson.dumps({"successes": ok, "errors": []}), "application/json")
                return
            protobuf = ctype.startswith("application/x-protobuf")
            self._reply(HTTPStatus.OK, b"" if protobuf else b"{}", ctype.split(";")[0])

        def _reply(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
            log.debug("flowrl serve-otlp: " + format, *args)

    return ThreadingHTTPServer((host, port), Handler)


__all__ = ["DEFAULT_PORT", "OTLPReceiver", "ReceiverStats", "make_server"]
