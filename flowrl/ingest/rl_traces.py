"""Trace JSON files: toolboxv2's rl module (`{data_dir}/rl_traces/YYYY-MM-DD/{trace_id}.json`) or another flowrl store.

Loaded with `flowrl.trace.schema.load_trace`, which upgrades toolboxv2's files (schema version 0: they get
`source="import"` and honest tool success). The file's own `trace_id` is kept, so importing the same
file twice adds nothing; a trace_id that cannot be a file name is replaced by a content id.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from flowrl.errors import IngestError, SchemaError, StoreError
from flowrl.ingest.ids import content_id
from flowrl.ingest.unpickler import read_bytes
from flowrl.store.files import _check_id
from flowrl.trace.load import load_trace
from flowrl.trace.schema import ExecutionTrace


class NotATrace(IngestError):
    """Valid JSON that is not a trace (ignored while walking a folder, reported when named)."""


def looks_like_trace(data: object) -> bool:
    return isinstance(data, dict) and "trace_id" in data and ("user_query" in data or "messages" in data)


def read_trace_file(path: Path, raw: bytes | None = None) -> ExecutionTrace:
    path = Path(path)
    raw = read_bytes(path) if raw is None else raw
    if not raw.strip():
        raise IngestError(f"{path}: empty file")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise IngestError(f"{path}: not valid JSON, truncated or corrupt ({exc})") from exc
    if not looks_like_trace(data):
        raise NotATrace(f"{path}: not a trace file (no trace_id / user_query)")
    assert isinstance(data, dict)
    if not _storable_id(data.get("trace_id")):
        data = {**data, "trace_id": content_id(raw)}
    try:
        return load_trace(data, origin=str(path))
    except SchemaError as exc:
        raise IngestError(str(exc)) from exc


def _storable_id(trace_id: object) -> bool:
    """Whether `trace_id` passes the store's own rule for ids that are file names."""
    if not isinstance(trace_id, str):
        return False
    try:
        _check_id(trace_id)
    except StoreError:
        return False
    return True
