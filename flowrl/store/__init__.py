"""The trace stores: one `TraceSource` interface over two layouts.

- `files`: `TraceStore`, one JSON file per trace under dated folders, written atomically; `index` (what a
  listing may open), `outcomes` (the host's outcomes as append-only side records);
- `segments`: `SegmentStore`, date-partitioned columnar segments over fsspec, for fleets and object storage;
- `opener`: `open_store(path_or_url)`, the right store for a path or URL.

The names below are resolved on first use, so importing this package imports neither layout.
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "TraceStore": "flowrl.store.files",
    "TraceFilter": "flowrl.store.files",
    "ReadProblem": "flowrl.store.files",
    "TRACE_ID": "flowrl.store.files",
    "SegmentStore": "flowrl.store.segments",
    "open_store": "flowrl.store.opener",
    "TraceSource": "flowrl.store.source",
}

__all__ = [*_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
