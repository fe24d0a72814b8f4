"""`open_store`: the right store for a path or URL, so every command and API takes either layout.

- a URL with a scheme other than `file` (`s3://bucket/prefix`, `gs://...`, `memory://x`): a `SegmentStore`;
- a local folder that already holds `segments/`, or any spec with `layout="segments"`: a `SegmentStore`
  (it reads the per-trace JSON files beside the segments too);
- otherwise (`layout=None` or `"json"`): a `TraceStore`, the per-trace JSON layout, unchanged.

Light on purpose: pyarrow and fsspec are imported only when a `SegmentStore` is opened.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.errors import ConfigError
from flowrl.store.files import TraceStore, default_root
from flowrl.store.segments.fs import is_url

if TYPE_CHECKING:
    from flowrl.store.segments.store import SegmentStore

LAYOUTS = ("json", "segments")
# `Path("s3://bucket/x")` is `s3:/bucket/x`: a URL that went through a `Path` (a typer option) is mended
_FOLDED_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+):/(?!/)")


def store_spec(spec: str | os.PathLike[str]) -> str:
    """The text of a store spec, with a URL's `//` put back if a `Path` folded it."""
    text = os.fspath(spec)
    if isinstance(spec, Path):
        text = _FOLDED_URL.sub(lambda m: f"{m.group('scheme')}://", text)
    return text


def open_store(
    spec: str | os.PathLike[str] | None = None, *, layout: str | None = None, **options: Any
) -> TraceStore | SegmentStore:
    """A store for `spec` (default: `TraceStore.default()`'s folder). `options` go to `SegmentStore`
    (`writer_id`, `flush_rows`, `flush_seconds`)."""
    if layout is not None and layout not in LAYOUTS:
        raise ConfigError(f"layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    text = store_spec(spec) if spec is not None else str(default_root())
    url = is_url(text)
    if layout == "json" and url:
        raise ConfigError(f"{text}: the per-trace JSON layout needs a local folder; use layout 'segments' for a URL")
    local = Path(text[len("file://") :] if text.startswith("file://") else text).expanduser()
    if layout == "segments" or url or (layout is None and (local / "segments").is_dir()):
        # lazy: numpy and the segment stack load for a segment store only
        from flowrl.store.segments.store import SegmentStore

        return SegmentStore(text, **options)
    if options:
        raise ConfigError(f"{', '.join(options)}: options of a segment store, not of the JSON layout at {local}")
    return TraceStore(local)
