"""`open_store`: the right store for a path or URL, so every command and API takes either layout.

The layouts are one table, `TABLE`; a store opens as the first that fits:
- the layout asked for (`layout="segments"`, `"json"`);
- for a URL with a scheme other than `file` (`s3://bucket/prefix`, `gs://...`, `memory://x`), the first that
  opens URLs: a `SegmentStore`;
- for a local folder, the first whose `holds` says the folder is one already (`segments/` in it: a
  `SegmentStore`, which reads the per-trace JSON files beside the segments too);
- otherwise the first, the default: a `TraceStore`, the per-trace JSON layout.

A new layout is its store class (a `flowrl.store.source.TraceSource`) and one `Layout` line in `TABLE`. Light on
purpose: a store's module (pyarrow and fsspec for segments) is imported only when a store of it opens.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.errors import ConfigError
from flowrl.store.files import TraceStore, default_root
from flowrl.store.index import is_url

if TYPE_CHECKING:
    from flowrl.store.segments.store import SegmentStore


@dataclass(frozen=True)
class Layout:
    """A store layout: `store` ("module:Class", imported when one opens) is made with the spec's text when it
    opens URLs (`urls`), else with the local folder, and with `options` only when it takes them; `holds` tells a
    local folder that already is one."""

    name: str
    store: str
    urls: bool = False
    takes_options: bool = False
    holds: Callable[[Path], bool] | None = None

    def open(self, text: str, local: Path, options: dict[str, Any]) -> Any:
        if options and not self.takes_options:
            raise ConfigError(f"{', '.join(options)}: not options of the {self.name} layout at {local}")
        module, _, name = self.store.partition(":")
        cls = getattr(importlib.import_module(module), name)
        return cls(text, **options) if self.urls else cls(local, **options)


TABLE: tuple[Layout, ...] = (  # the first is the default of a folder no layout holds
    Layout("json", "flowrl.store.files:TraceStore"),
    Layout("segments", "flowrl.store.segments.store:SegmentStore", urls=True, takes_options=True,
           holds=lambda folder: (folder / "segments").is_dir()),
)  # fmt: skip
LAYOUTS = tuple(layout.name for layout in TABLE)
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
    """A store for `spec` (default: `TraceStore.default()`'s folder). `options` go to a layout that takes them
    (`SegmentStore`: `writer_id`, `flush_rows`, `flush_seconds`)."""
    named = {entry.name: entry for entry in TABLE}
    if layout is not None and layout not in named:
        raise ConfigError(f"layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    text = store_spec(spec) if spec is not None else str(default_root())
    url = is_url(text)
    local = Path(text[len("file://") :] if text.startswith("file://") else text).expanduser()
    if layout is not None:
        chosen = named[layout]
    elif url:
        chosen = next(entry for entry in TABLE if entry.urls)
    else:
        chosen = next((entry for entry in TABLE if entry.holds is not None and entry.holds(local)), TABLE[0])
    if url and not chosen.urls:
        urls = " or ".join(f"'{entry.name}'" for entry in TABLE if entry.urls)
        raise ConfigError(f"{text}: the {chosen.name} layout needs a local folder; use layout {urls} for a URL")
    return chosen.open(text, local, options)
