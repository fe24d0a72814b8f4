"""A segment store read a column set at a time: what a columnar dataset build iterates instead of traces.

`scan` follows a listing's order (`SegmentStore.iter_paths`: days in order; in a day, JSON files, then segment
rows by object name and row) and gives the rows of one segment together with the columns asked for. Rows that
must be read whole come as refs without columns: JSON files and segments written before the derived columns
(`flowrl.store.segments.derived`); the caller reads those with `SegmentStore.read_path`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flowrl.store.segments.catalog import Catalog, Ref, SegmentRows
from flowrl.store.segments.format import NotASegment


@dataclass
class ColumnRows:
    """Consecutive rows of a listing and, for a segment that holds them, the segment's asked columns as an Arrow
    table with the rows the listing gives (`index`, ascending); `table` None: read each ref whole. `refs` are
    the listing's strings (as `iter_paths` gives them), made when asked for."""

    made: Callable[[], list[str]]
    table: Any = None
    index: list[int] | None = None
    path: str = ""  # the segment's path on its filesystem
    location: str = ""  # and as messages name it
    _refs: list[str] | None = None

    @property
    def refs(self) -> list[str]:
        if self._refs is None:
            self._refs = self.made()
        return self._refs

    def select(self, names: list[str]) -> Any:
        """The listed rows' `names` columns (an Arrow table), in the refs' order."""
        assert self.table is not None and self.index is not None
        table = self.table.select(names)
        return table if len(self.index) == table.num_rows else table.take(self.index)


def scan(catalog: Catalog, hits: Iterator[Ref | SegmentRows], columns: list[str]) -> Iterator[ColumnRows]:
    """`hits` (`Catalog.winners`) as batches: a segment's rows with its columns, or consecutive JSON files."""
    files: list[Ref] = []
    for hit in hits:
        if isinstance(hit, Ref):
            files.append(hit)
            continue
        if files:
            yield _files(catalog, files)
            files = []
        yield _segment(catalog, hit, columns)
    if files:
        yield _files(catalog, files)


def _files(catalog: Catalog, refs: list[Ref]) -> ColumnRows:
    texts = [catalog.ref_text(ref) for ref in refs]
    return ColumnRows(lambda: texts)


def _segment(catalog: Catalog, hit: SegmentRows, columns: list[str]) -> ColumnRows:
    def made() -> list[str]:
        return [catalog.ref_text(hit.ref(row)) for row in hit.rows]

    try:
        table = catalog.columns(hit.path, columns)
    except (NotASegment, OSError):  # each row is read whole, and reported unreadable the usual way
        table = None
    if table is None:
        return ColumnRows(made)
    return ColumnRows(made, table, hit.rows, hit.path, catalog.root.display(hit.path))
