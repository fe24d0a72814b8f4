"""Where each trace of a `TraceStore` is: `{trace_id: path}`, built by one listing and kept fresh.

The first lookup lists every day folder once. The store's own writes add to the index (`added`). A
lookup that misses lists the folders again only when the store changed since the last listing: every
flowrl writer, in any process, passes its file through `.staging`, so that folder's mtime moves on each
write; the root's moves when a day folder appears, and the newest day folder's when a writer that skips
`.staging` (toolboxv2's rl module) adds today's file. An mtime within `RACY_NS` of now may hide a second
write in the same clock tick (git's "racy index" problem), so it counts as changed. A file another
program adds to an older day folder is seen by the next `TraceStore`. A hit whose file is gone (deleted
by hand) lists the folders again too.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

DATE_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}$")
RACY_NS = 50_000_000


def day_dirs(root: Path) -> list[Path]:
    """The `YYYY-MM-DD` folders under `root`, unsorted."""
    try:
        return [p for p in root.iterdir() if p.is_dir() and DATE_DIR.match(p.name)]
    except FileNotFoundError:
        return []


class TraceIndex:
    """`{trace_id: path}` for one store root; thread-safe."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.listings = 0  # full listings done, for tests and curiosity
        self._paths: dict[str, Path] | None = None
        self._mark: tuple[int, ...] | None = None
        self._newest_day: Path | None = None
        self._lock = threading.Lock()

    def find(self, trace_id: str) -> Path | None:
        with self._lock:
            if self._paths is None:
                self._list()
            path = self._paths.get(trace_id)  # type: ignore[union-attr]
            if path is not None and path.is_file():
                return path
            if path is None and self._mark is not None and self._stamp(self._newest_day) == self._mark:
                return None  # nothing was written since the listing
            self._list()
            return self._paths.get(trace_id)  # type: ignore[union-attr]

    def added(self, trace_id: str, path: Path) -> None:
        """Record this process's write of `path` (a trace stored under two days is found in the newest)."""
        with self._lock:
            if self._paths is None:
                return
            known = self._paths.get(trace_id)
            if known is None or known.parent.name <= path.parent.name:
                self._paths[trace_id] = path

    def _list(self) -> None:
        days = sorted(day_dirs(self.root))
        newest = days[-1] if days else None
        mark = self._stamp(newest)  # taken before the listing: a write during it shows as a change
        paths: dict[str, Path] = {}
        for day in days:  # oldest first, so the newest day wins
            try:
                names = os.listdir(day)
            except FileNotFoundError:
                continue
            for name in names:
                if name.endswith(".json") and not name.startswith("."):
                    paths[name[:-5]] = day / name
        self._paths, self._mark, self._newest_day = paths, mark, newest
        self.listings += 1

    def _stamp(self, newest_day: Path | None) -> tuple[int, ...] | None:
        """mtimes of `.staging`, the root and the newest day folder; None when one is too recent to trust."""
        stamps = tuple(_mtime_ns(p) for p in (self.root / ".staging", self.root, newest_day))
        if any(s > time.time_ns() - RACY_NS for s in stamps):
            return None
        return stamps


def _mtime_ns(path: Path | None) -> int:
    if path is None:
        return -1
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1
