"""`TraceSource`: the one interface every reader and writer of a store uses.

`TraceStore` (a folder of per-trace JSON, `flowrl.store.files`) and `SegmentStore` (columnar segments over fsspec,
`flowrl.store.segments`) are both one; a reader asks `isinstance(x, TraceSource)`, never which layout it has. A
layout's extra capability is its own method, asked for by name where it is used (`scan_columns`: a columnar scan,
`flowrl.data.columnar`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from flowrl.store.files import ReadProblems, TraceFilter
    from flowrl.trace.outcomes import HostOutcome
    from flowrl.trace.schema import ExecutionTrace


@runtime_checkable
class TraceSource(Protocol):
    """Scan with filters, load, label, record outcomes, update."""

    @property
    def root(self) -> Any: ...  # a Path, or a remote store's URL

    @property
    def shared(self) -> bool: ...  # another process that opens it sees it (workers may read it)

    @property
    def problems(self) -> ReadProblems: ...  # what the open operation (or the latest listing) skipped

    def operation(self) -> AbstractContextManager[ReadProblems]: ...

    # reading
    def iter_paths(self, flt: TraceFilter | None = None) -> Iterator[Any]: ...
    def count_paths(self, flt: TraceFilter | None = None) -> int: ...
    def listed_outcomes(self) -> set[str] | None: ...  # ids with host outcomes, listed once; None: merged on read
    def read_path(self, path: Any, *, outcome_ids: set[str] | None = None) -> ExecutionTrace: ...
    def iter_traces(self, flt: TraceFilter | None = None, **filters: Any) -> Iterator[ExecutionTrace]: ...
    def get(self, trace_id: str) -> ExecutionTrace: ...
    def outcomes(self, trace_id: str) -> list[HostOutcome]: ...

    # writing
    def write(self, trace: ExecutionTrace) -> Any: ...
    def write_many(self, traces: list[ExecutionTrace]) -> list[Any]: ...
    def update(self, trace: ExecutionTrace) -> Any: ...
    def modify(self, trace_id: str, change: Callable[[ExecutionTrace], object]) -> ExecutionTrace: ...
    def label(self, trace_id: str, label: bool, notes: str = "") -> ExecutionTrace: ...
    def record_outcome(self, trace_id: str, outcome: HostOutcome | None = None, **fields: Any) -> HostOutcome: ...
    def flush(self) -> None: ...  # what is buffered is durable when it returns
