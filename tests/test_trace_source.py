"""One `TraceSource` interface over both store layouts (issue 35: `data/pipeline.py` told them apart with
`hasattr`, `getattr` and `isinstance` checks)."""

from __future__ import annotations

import inspect
from pathlib import Path

from flowrl.data.base import BuildStats, DatasetFilter
from flowrl.data.pipeline import _Source
from flowrl.data.synthetic import synthetic_trace
from flowrl.store import SegmentStore, TraceSource, TraceStore
from flowrl.store.outcomes import ids_with_outcomes


def test_both_layouts_are_a_trace_source(tmp_path: Path) -> None:
    folder = TraceStore(tmp_path / "json")
    segments = SegmentStore(str(tmp_path / "seg"))
    try:
        assert isinstance(folder, TraceSource) and isinstance(segments, TraceSource)
        assert not isinstance([synthetic_trace(0)], TraceSource)
        traces = [synthetic_trace(i) for i in range(5)]
        for store in (folder, segments):
            store.write_many(traces)
            store.flush()
            assert store.count_paths() == 5 == sum(1 for _ in store.iter_paths())
        folder.record_outcome(traces[0].trace_id, success=True)
        assert folder.listed_outcomes() == ids_with_outcomes(folder.root) == {traces[0].trace_id}
        assert segments.listed_outcomes() is None  # merged as each trace is read
    finally:
        segments.close()


def test_the_pipeline_reads_a_trace_source_without_asking_its_layout() -> None:
    code = inspect.getsource(_Source)
    assert "hasattr" not in code and "getattr" not in code and "isinstance(source, TraceStore)" not in code
    src = _Source([synthetic_trace(0)], DatasetFilter(), BuildStats())
    assert src.store is None and src.total() == 1
