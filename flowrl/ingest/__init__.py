"""Ingest FlowAgent's on-disk state into the trace store: checkpoints (V2 and V1), obs run and live
files, and rl_traces JSON; `watch` keeps doing it as FlowAgent writes them.

    from flowrl.ingest import CheckpointLoader, ingest_paths
    traces = CheckpointLoader(data_dir).load()            # traces, masked and de-duplicated
    summary = ingest_paths([data_dir], TraceStore(root))  # the same, written to a store

See docs/ingest.md for what is read from where, the unpickler's allow-list and the dedup rules.
"""

from flowrl.ingest.api import CheckpointLoader, ingest_paths
from flowrl.ingest.engine import Ingestor
from flowrl.ingest.summary import IngestSummary, Rejected
from flowrl.ingest.unpickler import ALLOWED, RestrictedUnpickler, load_restricted
from flowrl.ingest.watch import Watcher, watch

__all__ = [
    "ALLOWED",
    "CheckpointLoader",
    "IngestSummary",
    "Ingestor",
    "Rejected",
    "RestrictedUnpickler",
    "Watcher",
    "ingest_paths",
    "load_restricted",
    "watch",
]
