"""What a segment store's root holds, kept current by listing it: the reading half of `SegmentStore`.

Segments and side objects are immutable, so each is opened once per process (a listing reads only the objects
that are new since the last); per-trace JSON files (the `TraceStore` layout, read too) may be rewritten or
removed, so they are listed afresh each time. Which copy is a trace: the newest of that id over every segment
row (`written_ns`) and JSON file (its mtime, on a local root; 0 elsewhere), a segment winning a tie: a store
being compacted holds both, and a JSON file rewritten after it was compacted is newer than its segment copy.
Everything that is not the store's (a file named like a segment that is not one, a wrong schema, a stray
object, a link) is reported through `skip`, in every listing that meets it, and never read as a trace.
"""

from __future__ import annotations

import os
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import SchemaError
from flowrl.store.files import trace_from_json
from flowrl.store.index import day_dirs, trace_files, valid_day
from flowrl.store.outcomes import ids_with_outcomes
from flowrl.store.segments import names
from flowrl.store.segments.format import NotASegment, Segment
from flowrl.store.segments.fs import Root
from flowrl.store.segments.sidecar import Record
from flowrl.store.segments.sideview import SideView
from flowrl.trace.schema import ExecutionTrace

Skip = Callable[[str, str], None]
Keep = Callable[[Segment, str], list[bool] | None]
_SEGMENT_REF = re.compile(r"^(?P<location>.*\.parquet)#(?P<row>\d+)$")
_OPEN_SEGMENTS = 8
_DECODED_GROUPS = 4  # a group is up to `ROW_GROUP_ROWS` traces' JSON


@dataclass(frozen=True, order=True)
class Ref:
    """Where one trace's stored copy is: a segment row (`row` >= 0) or a JSON file (`row` -1). Orders by rank:
    (written time in ns, 1 for a segment or 0 for JSON, location)."""

    rank: tuple[int, int, str]
    path: str = field(compare=False)
    row: int = field(compare=False)
    day: str = field(compare=False)


@dataclass
class ScanStats:
    """What listings cost, for tests and benchmarks: segment files opened, `trace` row groups decoded."""

    segments_opened: int = 0
    row_groups_read: int = 0


@dataclass(frozen=True)
class SegmentRows:
    """The winning rows of one segment under a day (ascending), as `Catalog.winners` gives them."""

    path: str
    day: str
    rows: list[int]
    written: array  # the segment's written_ns, by row

    def ref(self, row: int) -> Ref:
        return Ref((self.written[row], 1, self.path), self.path, row, self.day)


@dataclass
class _SegmentIds:
    day: str
    ids: list[str]
    written: array  # written_ns of each row (0 when unknown)
    number: int  # the segment's number in `Catalog._paths`


class Catalog:
    """The index of one root. Thread-safe: one lock around listing and decoding."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.lock = threading.RLock()
        self.view = SideView()
        self.stats = ScanStats()
        self._segments: dict[str, _SegmentIds] = {}
        self._bad: dict[str, str] = {}
        self._side_seen: set[str] = set()
        self.legacy_outcome_ids: set[str] = set()  # ids with `.outcomes/{id}.jsonl` under a local root
        self._paths: list[str] = []  # segment number -> path (a removed segment's number is not reused)
        # trace id -> its newest segment row as a slot, number << 32 | row: an int, not a `Ref`, per id
        self._seg_best: dict[str, int] = {}
        # segments with an id that another segment or a JSON file also holds: their winners are found row by row
        self._contested: set[int] = set()
        self._json: dict[str, Ref] = {}  # trace id -> JSON file (ids no segment holds are the winners)
        self._json_contested: set[int] = set()  # segments with an id that a JSON file holds too
        self._open: OrderedDict[str, tuple[Any, Segment]] = OrderedDict()
        self._groups: OrderedDict[tuple[str, int], list[bytes]] = OrderedDict()

    # -- refresh -------------------------------------------------------------------------------------
    def refresh(self, skip: Skip) -> None:
        """List the root again: open new segments and side objects, re-list JSON files."""
        with self.lock:
            self._refresh_segments(skip)
            self._refresh_sidecar(skip)
            self._json = self._list_json(skip)
            self._json_contested = {self._seg_best[tid] >> 32 for tid in self._json.keys() & self._seg_best.keys()}
            if self.root.local:
                self.legacy_outcome_ids = ids_with_outcomes(Path(self.root.path))

    def settle(self, path: str, data: bytes, records: list[Record]) -> None:
        """This process put its pending `records` as the side object `path` holding `data` (not to be read again)."""
        with self.lock:
            self._side_seen.add(path)
            self.view.settle(records, self.root.display(path), data)

    def _objects(self, kind: str, skip: Skip) -> Iterator[tuple[str, str]]:
        """`(day, path)` of every object under `{root}/{kind}` with a final name; the rest go to `skip`."""
        ext = names.EXTENSIONS[kind]
        for day, folder in self.root.walk_partitions(kind, skip):
            where = self.root.display(folder.path)
            if day is None:
                skip(where, f"{where}: not a date=YYYY-MM-DD partition of {kind}/, skipped")
                continue
            folders, files = self.root.listdir(folder.path, skip)
            for sub in folders:
                skip(
                    self.root.display(sub.path), f"{self.root.display(sub.path)}: a folder inside a partition, skipped"
                )
            for f in sorted(files, key=lambda e: e.name):
                if names.parse_object(f.name, ext) is None:
                    where = self.root.display(f.path)
                    skip(where, f"{where}: not a {kind} object name (writer-seq-random.{ext}), skipped")
                else:
                    yield day, f.path

    def _refresh_segments(self, skip: Skip) -> None:
        listed = set()
        for day, path in self._objects(names.SEGMENTS, skip):
            listed.add(path)
            if path in self._segments:
                continue
            if path not in self._bad:
                try:
                    segment = self._segment(path)
                    cols = segment.columns(["trace_id", "written_ns"])
                    written = array("q", [int(ns or 0) for ns in cols["written_ns"]])
                    ids = self._segments[path] = _SegmentIds(day, cols["trace_id"], written, len(self._paths))
                    self._paths.append(path)
                    self._add_best(path, ids)
                    continue
                except (NotASegment, OSError) as exc:
                    self._bad[path] = str(exc) if isinstance(exc, NotASegment) else f"{path}: cannot read: {exc}"
            skip(self.root.display(path), self._bad[path])
        gone = set(self._segments) - listed
        if gone:  # removed by hand: the index is rebuilt without them
            for path in gone:
                del self._segments[path]
            self._seg_best, self._contested = {}, set()
            for path, ids in self._segments.items():
                self._add_best(path, ids)

    def _add_best(self, path: str, ids: _SegmentIds) -> None:
        best, base, written = self._seg_best, ids.number << 32, ids.written
        for row, tid in enumerate(ids.ids):
            slot = best.get(tid)
            if slot is None:
                best[tid] = base | row
                continue
            self._contested.update((slot >> 32, ids.number))  # a second copy of the id
            if self._ref(slot).rank < (written[row], 1, path):
                best[tid] = base | row

    def _ref(self, slot: int) -> Ref:
        path, row = self._paths[slot >> 32], slot & 0xFFFFFFFF
        ids = self._segments[path]
        return Ref((ids.written[row], 1, path), path, row, ids.day)

    def _refresh_sidecar(self, skip: Skip) -> None:
        for _day, path in self._objects(names.SIDECAR, skip):
            if path in self._side_seen:
                continue
            where = self.root.display(path)
            try:
                data = self.root.read(path)
            except OSError as exc:
                skip(where, f"{where}: cannot read: {exc}")
                continue
            self._side_seen.add(path)
            self.view.add_object(where, data, skip)

    def _list_json(self, skip: Skip) -> dict[str, Ref]:
        """The per-trace JSON files under `{root}/YYYY-MM-DD/`, by the id their name gives."""
        out: dict[str, Ref] = {}
        if self.root.local:

            def local_skip(path: Path, message: str) -> None:
                skip(str(path), message)

            for day in day_dirs(Path(self.root.path), local_skip):
                for f in trace_files(day, local_skip):
                    try:
                        mtime = os.lstat(f).st_mtime_ns
                    except OSError:  # removed meanwhile
                        continue
                    out[f.stem] = Ref((mtime, 0, str(f)), str(f), -1, day.name)
            return out
        folders, _files = self.root.listdir(self.root.path, skip)
        for folder in folders:
            if valid_day(folder.name):
                for entry in self.root.listdir(folder.path, skip)[1]:
                    if entry.name.endswith(".json"):
                        out[entry.name[: -len(".json")]] = Ref((0, 0, entry.path), entry.path, -1, folder.name)
        return out

    # -- lookups -------------------------------------------------------------------------------------
    def find(self, trace_id: str) -> Ref | None:
        with self.lock:
            return self._winner(trace_id)

    def _winner(self, trace_id: str) -> Ref | None:
        slot, js = self._seg_best.get(trace_id), self._json.get(trace_id)
        seg = None if slot is None else self._ref(slot)
        if seg is None or js is None:
            return seg or js
        return max(seg, js)

    def count(self) -> int:
        with self.lock:
            return len(self._seg_best.keys() | self._json.keys())

    def json_files(self) -> list[tuple[str, Ref, bool]]:
        """Every JSON file as `(trace_id, ref, current)`: `current` when it is the copy read of its trace, not
        one a newer segment row supersedes (what compaction copies, and what it may remove)."""
        with self.lock:
            return sorted(((tid, r, self._winner(tid) is r) for tid, r in self._json.items()), key=lambda x: x[0])

    def segment_ids(self) -> dict[str, Ref]:
        """Every trace id some segment holds, with its newest row."""
        with self.lock:
            return {tid: self._ref(slot) for tid, slot in self._seg_best.items()}

    def days(self) -> list[str]:
        with self.lock:
            return sorted({ids.day for ids in self._segments.values()} | {ref.day for ref in self._json.values()})

    def winners(self, day: str, keep: Keep | None = None) -> Iterator[Ref | SegmentRows]:
        """The winning copies filed under `day`: JSON files by name (a `Ref` each), then each segment's winning rows
        (`SegmentRows`), by object name. `keep(segment, location)` may narrow a segment's rows (column pushdown);
        None keeps them all. A segment with no id that another copy holds (the common case) is listed without a
        look at each row."""
        with self.lock:
            json_refs = sorted(
                (r for tid, r in self._json.items() if r.day == day and self._winner(tid) is r),
                key=lambda r: r.path,
            )
            segments = sorted(p for p, ids in self._segments.items() if ids.day == day)
        yield from json_refs
        for path in segments:
            with self.lock:
                ids = self._segments.get(path)
                if ids is None:
                    continue
                mask = keep(self._segment(path), self.root.display(path)) if keep is not None else None
                rows = range(len(ids.ids)) if mask is None else [row for row, ok in enumerate(mask) if ok]
                if ids.number in self._contested or ids.number in self._json_contested:
                    rows = [row for row in rows if self._wins(ids, row)]
            if rows:
                yield SegmentRows(path, ids.day, list(rows), ids.written)

    def _wins(self, ids: _SegmentIds, row: int) -> bool:
        """Whether a segment's row is the copy read of its trace (no newer row or JSON file of the id)."""
        tid, slot = ids.ids[row], ids.number << 32 | row
        if self._seg_best.get(tid) != slot:
            return False
        js = self._json.get(tid)
        return js is None or js < self._ref(slot)

    # -- decoding ------------------------------------------------------------------------------------
    def ref_text(self, ref: Ref) -> str:
        where = self.root.display(ref.path)
        return where if ref.row < 0 else f"{where}#{ref.row}"

    def parse_ref(self, text: str) -> Ref:
        """The `Ref` of a string `ref_text` made (what `SegmentStore.iter_paths` yields)."""
        m = _SEGMENT_REF.match(str(text))
        location = m.group("location") if m else str(text)
        path = location if self.root.local else self.root.fs._strip_protocol(location)
        return Ref((0, 1 if m else 0, path), path, int(m.group("row")) if m else -1, "")

    def load(self, ref: Ref) -> ExecutionTrace:
        """The stored trace `ref` points at, without side records. SchemaError names the object."""
        where = self.ref_text(ref)
        if ref.row < 0:
            try:
                raw = self.root.read(ref.path)
            except OSError as exc:
                raise SchemaError(f"{where}: cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
            return trace_from_json(raw, where, Path(ref.path.rsplit("/", 1)[-1]))
        with self.lock:
            try:
                segment = self._segment(ref.path)
                group = segment.group_of(ref.row)
                rows = self._group(ref.path, segment, group)
                raw = rows[ref.row - segment.row_groups[group]]
            except (NotASegment, OSError, IndexError) as exc:
                raise SchemaError(f"{where}: cannot read: {exc}") from exc
        return trace_from_json(raw, where, None)

    def columns(self, path: str, names: list[str]) -> Any:
        """Whole columns of a segment that holds them all, as an Arrow table (None for one written without them,
        as segment-v1). NotASegment or OSError when it cannot be read."""
        with self.lock:
            segment = self._segment(path)
            return segment.table(names) if segment.derived else None

    def _segment(self, path: str) -> Segment:
        hit = self._open.get(path)
        if hit is not None:
            self._open.move_to_end(path)
            return hit[1]
        fh = self.root.open(path)
        try:
            segment = Segment(fh, self.root.display(path))
        except BaseException:
            fh.close()
            raise
        self.stats.segments_opened += 1
        self._open[path] = (fh, segment)
        while len(self._open) > _OPEN_SEGMENTS:
            _old, (old_fh, _seg) = self._open.popitem(last=False)
            old_fh.close()
        return segment

    def _group(self, path: str, segment: Segment, group: int) -> list[bytes]:
        key = (path, group)
        rows = self._groups.get(key)
        if rows is None:
            rows = self._groups[key] = segment.trace_rows(group)
            self.stats.row_groups_read += 1
            while len(self._groups) > _DECODED_GROUPS:
                self._groups.popitem(last=False)
        else:
            self._groups.move_to_end(key)
        return rows

    def close(self) -> None:
        with self.lock:
            for fh, _segment in self._open.values():
                fh.close()
            self._open.clear()
            self._groups.clear()
