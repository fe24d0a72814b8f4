"""Compaction: the per-trace JSON files of a store into Parquet segments, in place or into another root.

**In place** (`out=None`): every JSON file that is the current copy of its trace is read, written into new
segments beside it, and the segments are verified by opening the root afresh and reading back every id (each
row decoded, its `trace_id` checked) and the count. Only then are the JSON files removed, each only if it is
unchanged since it was read (same mtime and size): a file rewritten meanwhile is newer than its segment copy,
so it stays and stays the one read. A JSON file an earlier (interrupted) run already copied, which a newer
segment row supersedes, is verified and removed the same way. Side records (`.outcomes/`, `sidecar/`) stay
where they are.

**Into another root** (`out`): every trace as read now (side records merged) is written there, its host
outcomes as side records; the source is not touched.

**Interrupted at any point, nothing is lost or half-written**: segments are put atomically (`flowrl.store.segments.fs`)
and every reader reads both layouts, the newest copy of an id winning; no JSON file is removed before the
segments holding its trace were read back; a second run copies only the JSON files that are still the current
copy of their trace and removes the rest once verified, so it neither loses nor duplicates what the first did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from flowrl.errors import SchemaError, StoreError
from flowrl.store.files import ReadProblems
from flowrl.store.segments.catalog import Ref
from flowrl.store.segments.store import SegmentStore
from flowrl.trace.schema import ExecutionTrace

BATCH = 5000


@dataclass
class CompactSummary:
    """What a compaction did: traces copied into segments, JSON files removed or kept, files not readable."""

    copied: int = 0
    removed: int = 0
    kept_changed: list[str] = field(default_factory=list)
    problems: ReadProblems = field(default_factory=ReadProblems)
    target: str = ""


def compact(
    root: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    keep_json: bool = False,
    writer_id: str | None = None,
    batch: int = BATCH,
) -> CompactSummary:
    """Convert the store at `root` (see the module docstring). StoreError when verification fails (nothing is
    removed then)."""
    source = SegmentStore(root, writer_id=writer_id, flush_rows=max(1, batch))
    if out is not None:
        return _copy_out(source, SegmentStore(out, writer_id=writer_id, flush_rows=max(1, batch)))
    summary = CompactSummary(target=source.url)
    catalog = source._catalog
    with source.operation() as problems:
        catalog.refresh(source._skipper(problems))
        todo: list[tuple[Ref, tuple[int, int], str]] = []
        for trace_id, ref, current in catalog.json_files():
            try:
                stamp = _stamp(ref.path) if source._root.local else (0, 0)
                if current:
                    trace = catalog.load(ref)
                    source.write(trace)
                    summary.copied += 1
                    trace_id = trace.trace_id
            except (SchemaError, OSError) as exc:
                source._skipper(problems)(ref.path, str(exc))  # a broken file stays as it is
                continue
            todo.append((ref, stamp, trace_id))  # copied now, or by an earlier run that was interrupted
        source.close()
        summary.problems = problems
    _verify(root, {trace_id for _ref, _stamp, trace_id in todo})
    if keep_json or not source._root.local:
        return summary
    for ref, stamp, _trace_id in todo:
        try:
            if _stamp(ref.path) != stamp:
                summary.kept_changed.append(ref.path)
                continue
            os.unlink(ref.path)
            summary.removed += 1
        except FileNotFoundError:
            continue
    return summary


def _stamp(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_mtime_ns, st.st_size


def _verify(root: str | os.PathLike[str], expected: set[str]) -> None:
    """Open `root` afresh and check that segments hold every id in `expected`, each row decoding to its id."""
    fresh = SegmentStore(root, writer_id="verify")
    catalog = fresh._catalog
    catalog.refresh(lambda _where, _message: None)
    held = catalog.segment_ids()
    missing = expected - held.keys()
    if missing:
        raise StoreError(
            f"compaction of {fresh.url}: {len(missing)} traces not found in the new segments (e.g. "
            f"{sorted(missing)[0]}); nothing was removed: run `flowrl compact` again"
        )
    for trace_id in expected:
        try:
            trace = catalog.load(held[trace_id])
        except SchemaError as exc:
            raise StoreError(f"compaction of {fresh.url}: {exc}; nothing was removed") from exc
        if trace.trace_id != trace_id:
            raise StoreError(f"compaction of {fresh.url}: a row for {trace_id} holds {trace.trace_id}; nothing removed")
    catalog.close()


def _copy_out(source: SegmentStore, dest: SegmentStore) -> CompactSummary:
    summary = CompactSummary(target=dest.url)
    written: set[str] = set()
    with source.operation() as problems:
        for trace in source.iter_traces():
            outcomes = list(trace.outcomes)
            dest.write(_without_outcomes(trace))
            if outcomes:
                dest.record_outcomes(trace.trace_id, outcomes)
            written.add(trace.trace_id)
        summary.problems = problems
    dest.close()
    summary.copied = len(written)
    _verify(dest.url if not dest._root.local else Path(dest._root.path), written)
    return summary


def _without_outcomes(trace: ExecutionTrace) -> ExecutionTrace:
    trace.outcomes = []  # never part of the stored row: they go to the side records
    return trace
