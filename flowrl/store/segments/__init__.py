"""Columnar segments over fsspec: the trace store for fleets and object storage (`SegmentStore`).

Layout, atomicity and the merge of side records: `flowrl.store.segments.store` (the API), `names` (object names and
why they never collide), `fs` (atomic puts, listings), `format` (the Parquet file), `sidecar` (patches and
outcomes), `catalog` (reading), `pushdown` (column filters), `compact` (per-trace JSON to segments). Importing
this package imports neither pyarrow nor fsspec; opening a store does.
"""

from __future__ import annotations

from flowrl.store.segments.store import SegmentStore

__all__ = ["SegmentStore"]
