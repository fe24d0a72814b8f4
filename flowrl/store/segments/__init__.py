"""Columnar segments over fsspec: the trace store for fleets and object storage (`SegmentStore`).

Layout, atomicity and the merge of side records: `flowrl.store.segments.store` (the API), `names` (object names and
why they never collide), `fs` (atomic puts, listings), `format` (the Parquet file), `sidecar` (patches and
outcomes), `catalog` (reading), `pushdown` (column filters), `compact` (per-trace JSON to segments). Importing
this package imports nothing of the store (`SegmentStore` is resolved on first use): `flowrl.store.index.is_url`
stays light, and neither numpy, pyarrow nor fsspec loads before a store is opened.
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports

_LAZY: dict[str, str] = {"SegmentStore": "flowrl.store.segments.store"}

__all__ = [*_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
