"""A segment store read a column set at a time: what a columnar dataset build iterates instead of traces.

`scan` follows a listing's order (`SegmentStore.iter_paths`: days in order; in a day, JSON files, then segment
rows by object name and row) and gives the rows of one segment together with the columns asked for. Rows that
must be read whole come as refs without columns: JSON files and segments written before the derived columns
(`flowrl.segments.derived`); the caller reads those with `SegmentStore.read_path`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flowrl.segments.catalog import Catalog, Ref
from flowrl.segments.format import NotASegment


@dataclass
class ColumnRows:
    """Consecutive rows of a listing: their refs (as `iter_paths` gives them) and, for a segment that holds
    them, the segment's asked columns as an Arrow table with the rows the refs stand for (`index`, ascending);
    `table` None: read each ref whole."""

    refs: list[str]
    table: Any = None
    index: list[int] | None = None
    path: str = ""  # the segment's path on its filesystem
    location: str = ""  # and as messages name it

    def lists(self, names: list[str]) -> dict[str, list[Any]]:
        """The listed rows' values of `names` as Python lists, in the refs' order."""
        assert self.table is not None and self.index is not None
        table = self.table.select(names)
        if len(self.index) != table.num_rows:
            table = table.take(self.index)
        return {name: table.column(name).to_pylist() for name in names}


def scan(catalog: Catalog, refs: Iterator[Ref], columns: list[str]) -> Iterator[ColumnRows]:
    batch: list[Ref] = []
    for ref in refs:
        if batch and (ref.path != batch[0].path and not (ref.row < 0 and batch[0].row < 0)):
            yield _rows(catalog, batch, columns)
            batch = []
        batch.append(ref)
    if batch:
        yield _rows(catalog, batch, columns)


def _rows(catalog: Catalog, batch: list[Ref], columns: list[str]) -> ColumnRows:
    refs = [catalog.ref_text(ref) for ref in batch]
    if batch[0].row < 0:
        return ColumnRows(refs)
    try:
        table = catalog.columns(batch[0].path, columns)
    except (NotASegment, OSError):  # each row is read whole, and reported unreadable the usual way
        table = None
    if table is None:
        return ColumnRows(refs)
    return ColumnRows(refs, table, [ref.row for ref in batch], batch[0].path, catalog.root.display(batch[0].path))
