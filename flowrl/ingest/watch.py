"""`flowrl watch`: ingest checkpoints and obs files as FlowAgent writes them.

* Events come from watchdog (inotify on Linux; a polling observer when inotify cannot start). Created,
  modified, moved-to and closed files under the watched paths are noted; the handler only queues paths,
  the work happens on the caller's thread.
* A file is read once it is complete: its size and mtime have not changed between two looks and its
  mtime is at least `debounce` seconds old, or inotify reported it closed after writing. FlowAgent
  rewrites checkpoint and obs files in place (plain `open(..., "w")`), so a file that still fails to
  parse shortly after a change is retried a few times before it is reported.
* A full rescan every `rescan_interval` seconds catches what events missed (inotify queue overflow,
  watch limits) and re-checks live files of runs that may have been interrupted.
* State: `{store}/.flowrl-watch-state.json` maps each file read to (size, mtime_ns, sha256), written
  atomically after each batch. After a restart, unchanged files are not read again; new and changed ones
  are; a changed file whose content hash is the same is only re-stamped. Traces already in the store are
  never written twice (content ids), whatever the state file says; a richer file for a stored run (its obs
  file after its checkpoint) upgrades that trace in place (`flowrl.ingest.upgrade`). A path that is not
  valid UTF-8 is keyed by its bytes (`bytes:<hex>`), since JSON cannot hold it.
* One watcher per store: `{store}/.flowrl-watch.lock` (flock) refuses a second one; a store at a URL keeps its
  lock and state in a local folder (`watch_home`), and a segment store is flushed before the state is saved.
* `run()` stops when its `stop` event is set (the CLI sets it on SIGINT/SIGTERM), saves the state and
  returns the summary; `run_once()` is one pass for cron.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import IngestError
from flowrl.ingest.discover import (
    CHECKPOINT,
    LIVE,
    OBS,
    TRACE,
    Source,
    classify,
    classify_explicit,
    iter_sources,
    resolve_roots,
)
from flowrl.ingest.engine import LIVE_IDLE_S, Ingestor, NotReady
from flowrl.ingest.rl_traces import NotATrace
from flowrl.ingest.runs import stat_sig
from flowrl.ingest.summary import IngestSummary
from flowrl.ingest.times import printable
from flowrl.ingest.unpickler import read_bytes
from flowrl.ingest.upgrade import StoreUpgrader
from flowrl.store.files import TraceStore, atomic_write_bytes, default_root
from flowrl.store.index import STAGING, open_lock
from flowrl.trace.redact import Redactor

log = logging.getLogger(__name__)

STATE_NAME = ".flowrl-watch-state.json"
LOCK_NAME = ".flowrl-watch.lock"
STATE_VERSION = 1
_RETRIES = 3


def state_key(path: Path) -> str:
    """The state file's key for `path`: the path itself, or `bytes:<hex>` when it is not valid UTF-8 (a name
    with undecodable bytes; no absolute path starts like that)."""
    text = str(path)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "bytes:" + os.fsencode(text).hex()


@dataclass
class _Pending:
    sig: tuple[int, int] | None = None
    closed_sig: tuple[int, int] | None = None
    attempts: int = 0
    not_before: float = 0.0


class _Handler:
    """watchdog handler: queue (event, path) pairs for the main loop; never does work itself."""

    def __init__(self, events: queue.SimpleQueue) -> None:
        self.events = events

    def dispatch(self, event: Any) -> None:
        kind = event.event_type
        if event.is_directory:
            if kind in ("created", "moved"):
                self.events.put(("rescan", None))
            return
        if kind == "moved":
            self.events.put(("deleted", os.fsdecode(event.src_path)))
            self.events.put(("changed", os.fsdecode(event.dest_path)))
        elif kind in ("created", "modified"):
            self.events.put(("changed", os.fsdecode(event.src_path)))
        elif kind == "closed":
            self.events.put(("closed", os.fsdecode(event.src_path)))
        elif kind == "deleted":
            self.events.put(("deleted", os.fsdecode(event.src_path)))


def watch_home(store: Any) -> Path:
    """The local folder of a watcher's state and lock: a local store's root; for a store at a URL (`s3://`), a
    folder per URL beside the default store (`{default}/.watch/{hash of the URL}`): one watcher per store on a
    machine; watchers on other hosts write segments under their own writer ids."""
    root = store.root
    if isinstance(root, Path):
        return root
    digest = hashlib.blake2b(str(root).encode(), digest_size=8).hexdigest()
    return default_root() / ".watch" / digest


class Watcher:
    """Watch `paths` and ingest into `store`. Use `run(stop)` as a service or `run_once()` from cron."""

    def __init__(
        self,
        paths: Iterable[Path | str],
        store: TraceStore | None = None,
        *,
        debounce: float = 0.5,
        rescan_interval: float = 30.0,
        live_idle_s: float = LIVE_IDLE_S,
        redactor: Redactor | None = None,
        state_path: Path | None = None,
        on_message: Callable[[str], None] | None = None,
    ) -> None:
        self.paths = [Path(p).expanduser() for p in paths]
        self.dirs, self.files = resolve_roots(self.paths)  # raises IngestError for a missing path
        self.store = store if store is not None else TraceStore.default()
        self.debounce = debounce
        self.rescan_interval = rescan_interval
        self.engine = Ingestor(
            exists=self.store.exists, upgrade=StoreUpgrader(self.store), redactor=redactor, live_idle_s=live_idle_s
        )
        self.home = watch_home(self.store)
        self.state_path = state_path or self.home / STATE_NAME
        self.files_state: dict[str, list[Any]] = {}
        self._pending: dict[Path, _Pending] = {}
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._on_message = on_message
        self._lock_fh: Any = None
        self._dirty = False
        self._store_root = Path(os.path.abspath(self.home))

    @property
    def summary(self) -> IngestSummary:
        return self.engine.summary

    # -- state ------------------------------------------------------------------------------------
    def _load_state(self) -> None:
        try:
            data = orjson.loads(self.state_path.read_bytes())
            files = data.get("files") if isinstance(data, dict) and data.get("version") == STATE_VERSION else None
            self.files_state = files if isinstance(files, dict) else {}
        except FileNotFoundError:
            self.files_state = {}
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning(
                "flowrl: %s is unreadable (%s); every file is read again (the store still refuses duplicates)",
                self.state_path,
                exc,
            )
            self.files_state = {}

    def save_state(self) -> None:
        """Remember which files are read, once what was read from them is stored: a segment store's buffered
        traces are put first, so the state never names a file whose traces a crash could still lose."""
        self.store.flush()
        data = {"version": STATE_VERSION, "files": self.files_state}
        staging = self.home / STAGING  # a local store's own staging folder
        staging.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.state_path, orjson.dumps(data), staging)
        self._dirty = False

    def _acquire(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no lock, one watcher per store is up to the user
            log.warning("flowrl: no file locking on this platform; run one watcher per store")
            return
        fh = os.fdopen(open_lock(self.home / LOCK_NAME), "r+")  # never through a link planted in its place
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            raise IngestError(
                f"another `flowrl watch` is already using the store {self.store.root}: "
                f"stop it first, or give this one its own --store"
            ) from exc
        self._lock_fh = fh

    def _release(self) -> None:
        if self._lock_fh is not None:
            import fcntl

            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # -- noticing files ---------------------------------------------------------------------------
    def _kind(self, path: Path) -> str | None:
        absolute = Path(os.path.abspath(path))
        if absolute in self.files:
            try:
                return classify_explicit(absolute)
            except IngestError:
                return None
        if any(d in absolute.parents for d in self.dirs) and self._store_root not in absolute.parents:
            return classify(absolute)
        return None

    def scan(self) -> None:
        """Note every file under the watched paths that differs from the state; forget vanished ones."""
        present: set[str] = set()
        try:
            sources = list(iter_sources(self.paths, exclude=[self._store_root]))
        except (IngestError, OSError) as exc:  # a watched folder was removed: keep watching the rest
            log.warning("flowrl: rescan failed: %s", exc)
            return
        for src in sources:
            if src.problem:
                continue
            path = Path(os.path.abspath(src.path))
            present.add(state_key(path))
            if src.kind in (OBS, LIVE):
                self.engine.runs.add(path)
            self._note(path)
        for key in list(self.files_state):
            if key not in present:
                del self.files_state[key]
                self._dirty = True

    def _note(self, path: Path, closed: bool = False) -> None:
        sig = stat_sig(path)
        if sig is None:
            return
        recorded = self.files_state.get(state_key(path))
        if recorded is not None and tuple(recorded[:2]) == sig and path not in self._pending:
            return
        pending = self._pending.setdefault(path, _Pending())
        if closed:
            pending.closed_sig = sig

    def _forget(self, path: Path) -> None:
        self._pending.pop(path, None)
        if self.files_state.pop(state_key(path), None) is not None:
            self._dirty = True
        self.engine.runs.discard(path)

    def _drain_events(self) -> bool:
        rescan = False
        while True:
            try:
                kind, raw_path = self._events.get_nowait()
            except queue.Empty:
                return rescan
            if kind == "rescan":
                rescan = True
                continue
            path = Path(os.path.abspath(raw_path))
            if self._kind(path) is None:
                continue
            if kind == "deleted":
                self._forget(path)
                continue
            if self._kind(path) in (OBS, LIVE):
                self.engine.runs.add(path)  # so a checkpoint read in the same batch can join it
            self._note(path, closed=(kind == "closed"))

    # -- reading files ----------------------------------------------------------------------------
    def _ready(self) -> list[Path]:
        now = time.time()
        ready = []
        for path, pending in list(self._pending.items()):
            sig = stat_sig(path)
            if sig is None:
                self._forget(path)
                continue
            if now < pending.not_before:
                continue
            stable = sig == pending.sig
            pending.sig = sig
            if pending.closed_sig == sig or (stable and now - sig[1] / 1e9 >= self.debounce):
                ready.append(path)
        return ready

    def process_ready(self) -> int:
        """Read every complete pending file. Returns how many new traces were written."""
        ready = self._ready()
        if not ready:
            return 0
        rank = {CHECKPOINT: 0, OBS: 1, LIVE: 2, TRACE: 3}
        kinds = {p: self._kind(p) for p in ready}
        if any(p not in kinds and self._kind(p) == OBS for p in self._pending):
            # An obs run file is still being written: read checkpoints once it is, so their turns join it.
            ready = [p for p in ready if kinds[p] != CHECKPOINT]
        new_before = self.summary.new
        for path in sorted(ready, key=lambda p: (rank.get(kinds[p] or "", 4), str(p))):
            kind = kinds[path]
            if kind is not None:
                self._read_one(path, kind)
        if self._dirty:
            self.save_state()
        return self.summary.new - new_before

    def _read_one(self, path: Path, kind: str) -> None:
        pending = self._pending[path]
        sig = pending.sig
        try:
            raw = read_bytes(path)
        except IngestError:
            self._forget(path)
            return
        digest = hashlib.sha256(raw).hexdigest()
        recorded = self.files_state.get(state_key(path))
        if recorded is not None and len(recorded) > 2 and recorded[2] == digest:
            self._done(path, sig, digest)  # touched, not changed
            return
        src = Source(kind, path, explicit=Path(os.path.abspath(path)) in self.files)
        new_before, dup_before, up_before = self.summary.new, self.summary.duplicate, self.summary.upgraded
        try:
            for trace in self.engine.ingest_source(src, raw):
                self.store.write(trace)
        except NotReady:
            del self._pending[path]  # a live file of a running run: the next rescan looks again
            return
        except NotATrace as exc:
            if src.explicit:
                self.summary.reject(path, str(exc))
        except IngestError as exc:
            if sig is not None and time.time() - sig[1] / 1e9 < 10.0 and pending.attempts < _RETRIES:
                pending.attempts += 1  # probably still being written in place: look again shortly
                pending.not_before = time.time() + max(self.debounce, 0.2)
                pending.closed_sig = None
                return
            self.summary.reject(path, str(exc))
            log.warning("flowrl: rejected %s", printable(str(exc)))
        self.summary.masked = self.engine.redactor.stats.masked
        self._done(path, sig, digest)
        if self._on_message is not None:
            new = self.summary.new - new_before
            dup = self.summary.duplicate - dup_before
            up = self.summary.upgraded - up_before
            self._on_message(
                printable(f"{path}: {new} new, " + (f"{up} upgraded, " if up else "") + f"{dup} already stored")
            )

    def _done(self, path: Path, sig: tuple[int, int] | None, digest: str) -> None:
        self._pending.pop(path, None)
        if sig is not None:
            self.files_state[state_key(path)] = [sig[0], sig[1], digest]
            self._dirty = True

    # -- running ----------------------------------------------------------------------------------
    def run_once(self, max_wait: float | None = None) -> IngestSummary:
        """One pass: read every new or changed complete file, wait briefly for ones being written."""
        t0 = time.perf_counter()
        self._acquire()
        try:
            self._load_state()
            self.scan()
            deadline = time.time() + (max_wait if max_wait is not None else max(4 * self.debounce, 2.0))
            while self._pending:
                self.process_ready()
                if not self._pending or time.time() >= deadline:
                    break
                time.sleep(min(0.1, self.debounce / 2 or 0.05))
            for _ in self._pending:
                self.summary.skip("still being written when --once ended (read on the next run)")
            if self._dirty:
                self.save_state()
        finally:
            self._release()
        self.summary.seconds += time.perf_counter() - t0
        return self.summary

    def run(self, stop: threading.Event, *, poll: float = 0.1, ready: threading.Event | None = None) -> IngestSummary:
        """Watch until `stop` is set. `ready` is set once the observer runs and the first scan is done."""
        t0 = time.perf_counter()
        self._acquire()
        observer = None
        try:
            self._load_state()
            observer = self._start_observer()
            self.scan()
            if ready is not None:
                ready.set()
            last_scan = time.monotonic()
            while not stop.is_set():
                rescan = self._drain_events()
                if rescan or time.monotonic() - last_scan >= self.rescan_interval:
                    self.scan()
                    last_scan = time.monotonic()
                self.process_ready()
                stop.wait(poll)
        finally:
            if observer is not None:
                observer.stop()
                observer.join(timeout=5)
            try:
                if self._dirty:
                    self.save_state()
            finally:
                self._release()
            self.summary.seconds += time.perf_counter() - t0
        return self.summary

    def _start_observer(self) -> Any:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
        from watchdog.observers.polling import PollingObserver

        class Handler(_Handler, FileSystemEventHandler):
            """The handler as the type watchdog's `schedule` takes (the base's methods are unused)."""

        handler = Handler(self._events)
        targets = [(d, True) for d in self.dirs] + [(f.parent, False) for f in self.files]
        for cls in (Observer, PollingObserver):
            observer = cls()
            try:
                for target, recursive in targets:
                    observer.schedule(handler, str(target), recursive=recursive)
                observer.start()
                return observer
            except OSError as exc:  # inotify limits, unsupported filesystem
                log.warning(
                    "flowrl: %s could not start (%s); trying the polling observer", type(observer).__name__, exc
                )
        raise IngestError("cannot watch the given paths: neither inotify nor polling could start")


def watch(
    paths: Iterable[Path | str],
    store: TraceStore | None = None,
    *,
    once: bool = False,
    stop: threading.Event | None = None,
    **options: Any,
) -> IngestSummary:
    """Watch `paths` and ingest into `store` until `stop` is set (or one pass with `once=True`)."""
    watcher = Watcher(paths, store, **options)
    if once:
        return watcher.run_once()
    return watcher.run(stop if stop is not None else threading.Event())
