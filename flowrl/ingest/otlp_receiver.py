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

from flowrl.errors import ConfigError, FlowRLError, IngestError
from flowrl.ingest.engine import Ingestor
from flowrl.ingest.openai_logs import Parsed
from flowrl.ingest.otlp import Span, from_protobuf, spans_of, traces_from_spans
from flowrl.redact import Redactor

log = logging.getLogger(__name__)

DEFAULT_PORT = 4318  # OTLP/HTTP's
MAX_BODY = 64 * 1024 * 1024
PENDING_S = 60.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ReceiverStats:
    requests: int = 0
    bad_requests: int = 0
    spans: int = 0
    written: int = 0
    duplicates: int = 0
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
            stale = [t for t, (seen, _) in self._waiting.items() if now - seen > self.pending_s and t not in touched]
            batches = [self._waiting.pop(t)[1] for t in (*ready, *stale)]
        for batch in batches:
            self._store(batch)

    def sweep(self) -> None:
        """Give up on traces whose root span did not come within `pending_s` (counted as skipped)."""
        with self._lock:
            now = self._clock()
            stale = [t for t, (seen, _) in self._waiting.items() if now - seen > self.pending_s]
            batches = [self._waiting.pop(t)[1] for t in stale]
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


def make_server(
    receiver: OTLPReceiver, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, allow_remote: bool = False
) -> ThreadingHTTPServer:
    """The HTTP server (not started: `serve_forever()`); port 0 picks a free one (`server.server_address`)."""
    if host not in LOCAL_HOSTS and not allow_remote:
        raise ConfigError(
            f"--host {host}: serve-otlp listens on 127.0.0.1; pass --allow-remote to listen on {host} "
            "(anyone who can reach it can write into the store)"
        )

    class Handler(BaseHTTPRequestHandler):
        server_version = "flowrl-otlp"

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path.split("?")[0].rstrip("/") != "/v1/traces":
                self._reply(HTTPStatus.NOT_FOUND, b"only POST /v1/traces is served here", "text/plain")
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
            try:
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
