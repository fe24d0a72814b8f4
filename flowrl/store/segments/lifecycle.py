"""Nothing buffered is lost when the process ends, nor written twice by a forked child.

Every open `SegmentStore` is tracked (weakly): at interpreter exit each is flushed (`atexit`); in a child made by
`fork` each forgets the buffers it inherited (its parent writes them) and gets a fresh lock (another thread of
the parent may have held it).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any

log = logging.getLogger("flowrl.store.segments.store")
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def track(store: Any) -> None:
    _LIVE.add(store)


def untrack(store: Any) -> None:
    _LIVE.discard(store)


def _flush_all() -> None:
    for store in list(_LIVE):
        try:
            store.flush()
        except Exception:  # pragma: no cover - best effort at shutdown
            log.warning("flowrl: flushing %s at exit failed", store.url, exc_info=True)


def _forget_in_child() -> None:
    for store in list(_LIVE):
        store._lock = threading.RLock()
        store._catalog.lock = threading.RLock()
        store._traces, store._side, store._pending, store._timer = [], [], {}, None


atexit.register(_flush_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
