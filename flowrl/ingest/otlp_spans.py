"""OTLP trace exports as spans: the JSON mapping (hex or base64 ids, typed attribute values) and protobuf, read
into `Span`s with their attributes as plain values. `flowrl.ingest.otlp` turns spans into agent runs.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import IngestError
from flowrl.ingest import langfuse

_HEX = re.compile(r"^[0-9a-fA-F]+$")
_STATUS_ERROR = (2, "STATUS_CODE_ERROR")


# ---------------------------------------------------------------------------------------------
# OTLP JSON -> spans


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start: int  # unix nanoseconds
    end: int
    attrs: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    error: str | None  # the status message of a span with status ERROR
    resource: dict[str, Any]
    children: list[Span] = field(default_factory=list)

    @property
    def op(self) -> str:
        return str(self.attrs.get("gen_ai.operation.name") or "")

    @property
    def oi_kind(self) -> str:
        return str(self.attrs.get("openinference.span.kind") or "").upper()

    @property
    def lf_kind(self) -> str:
        return langfuse.kind(self.attrs)

    @property
    def duration_ms(self) -> float | None:
        return round((self.end - self.start) / 1e6, 3) if self.end >= self.start > 0 else None


def any_value(value: Any) -> Any:
    """An OTLP `AnyValue` (JSON mapping) as a Python value."""
    if not isinstance(value, dict):
        return value
    for key, conv in (("stringValue", str), ("boolValue", bool), ("doubleValue", float)):
        if key in value:
            return conv(value[key])
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return attributes((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    return {str(kv.get("key")): any_value(kv.get("value")) for kv in items if isinstance(kv, dict)}


def otel_id(value: Any) -> str:
    """A trace or span id as lowercase hex (the Collector writes hex, protobuf's JSON mapping base64)."""
    if not isinstance(value, str) or not value:
        return ""
    if _HEX.match(value) and len(value) in (16, 32):
        return value.lower()
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value


def spans_of(doc: Any) -> list[Span]:
    """The spans of one `TracesData` / `ExportTraceServiceRequest` JSON document."""
    out: list[Span] = []
    if not isinstance(doc, dict):
        return out
    for rs in doc.get("resourceSpans") or doc.get("resource_spans") or []:
        if not isinstance(rs, dict):
            continue
        resource = attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or rs.get("scope_spans") or []:
            for s in (ss or {}).get("spans") or []:
                if not isinstance(s, dict):
                    continue
                status = s.get("status") or {}
                attrs = attributes(s.get("attributes"))
                events = [
                    (str(e.get("name") or ""), attributes(e.get("attributes")))
                    for e in s.get("events") or []
                    if isinstance(e, dict)
                ]
                out.append(
                    Span(
                        trace_id=otel_id(s.get("traceId") or s.get("trace_id")),
                        span_id=otel_id(s.get("spanId") or s.get("span_id")),
                        parent_id=otel_id(s.get("parentSpanId") or s.get("parent_span_id")),
                        name=str(s.get("name") or ""),
                        start=int(s.get("startTimeUnixNano") or s.get("start_time_unix_nano") or 0),
                        end=int(s.get("endTimeUnixNano") or s.get("end_time_unix_nano") or 0),
                        attrs=attrs,
                        events=events,
                        error=(str(status.get("message") or "error") if status.get("code") in _STATUS_ERROR else None)
                        or langfuse.error(attrs),
                        resource=resource,
                    )
                )
    return out


def sniff(head: bytes) -> bool:
    return b'"resourceSpans"' in head or b'"resource_spans"' in head


def documents(path: Path, raw: bytes) -> tuple[list[Any], int]:
    """The JSON documents of the file, and how many lines could not be read."""
    if path.suffix in (".pb", ".binpb", ".protobuf"):
        return [from_protobuf(path, raw)], 0
    try:
        return [orjson.loads(raw)], 0
    except orjson.JSONDecodeError:
        pass
    docs, bad = [], 0
    for line in raw.splitlines():
        if line.strip():
            try:
                docs.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                bad += 1
    return docs, bad


def from_protobuf(path: Path, raw: bytes) -> Any:
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError as exc:
        raise IngestError(
            f"{path}: OTLP protobuf needs the opentelemetry-proto package (pip install opentelemetry-proto)"
        ) from exc
    msg = ExportTraceServiceRequest()  # the same wire format as TracesData (field 1: resource_spans)
    try:
        msg.ParseFromString(raw)
    except DecodeError as exc:
        raise IngestError(f"{path}: not an OTLP protobuf trace export ({exc})") from exc
    return MessageToDict(msg)  # bytes ids come back base64: otel_id reads them
