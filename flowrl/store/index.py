"""The folder under a `TraceStore`: what a listing may open, how a file gets in safely, and where each trace is.

The store's folder may hold anything (a copied store, a hand edit, another user), so nothing here trusts it.

**Listing.** A store holds real `YYYY-MM-DD` folders named after a date that exists, each holding regular
`{trace_id}.json` files; names starting with a dot (`.staging`, lock and watch-state files) are the store's
own and are passed over. Anything else a listing meets is never opened or followed: a folder with another
or an impossible name (`2026-13-45`), a symbolic link (even one that points back inside: a link may lead
anywhere, and the store holds no copies), a FIFO (opening one blocks until a writer comes), a socket, a
device, a folder named `*.json`, a stray file beside the day folders. Each is handed to the caller's
`skip(path, message)`: `TraceStore` records it in the operation's `ReadProblems`. Regular files without
`.json` in a day folder are not the store's and are passed over silently, as before.
`read_regular_file` reads one file the same way: never through a link, never blocking on a FIFO.

**Writing** (`atomic_write_bytes`, `put_files`). Each file is staged in `.staging`, made durable (an fsync,
or one `syncfs` for a batch), renamed into place, and then every touched folder is fsynced once (the root
too when a folder was created), so a trace acknowledged is a trace kept across a power cut. `.staging` and
the day folder are checked right before use: a symbolic link in place of one is replaced by a real folder
(only the link is removed, never what it points to), so no write leaves the root. Replacing rather than
refusing: a refusal would drop a live capture's trace, and a linked folder is invisible to readers anyway.
Staged files left by a crash or a failed batch are removed by `clean_staging` once they are older than
`STALE_STAGING_S`: by age, because a younger one may belong to a writer in another process.

**Index.** The first lookup lists every day folder once. The store's own writes add to the index (`added`). A
lookup that misses lists the folders again only when the store changed since the last listing: every
flowrl writer, in any process, passes its file through `.staging`, so that folder's mtime moves on each
write; the root's moves when a day folder appears, and the newest day folder's when a writer that skips
`.staging` (toolboxv2's rl module) adds today's file. An mtime within `RACY_NS` of now may hide a second
write in the same clock tick (git's "racy index" problem), so it counts as changed. A file another
program adds to an older day folder is seen by the next `TraceStore`. A hit whose file is gone (deleted
by hand) lists the folders again too.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path

from flowrl.errors import StoreError

log = logging.getLogger(__name__)

DATE_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}$")
RACY_NS = 50_000_000
STAGING = ".staging"
SEGMENT_FOLDERS = ("segments", "sidecar")
STALE_STAGING_S = 3600
"""Age after which a staging file is a leftover: a live write stages, syncs and renames within seconds."""

Skip = Callable[[Path, str], None]
"""Told of each entry a listing passes over: its path and a message that names it and says what to do."""


def is_url(spec: str | os.PathLike[str]) -> bool:
    """A URL with a scheme other than `file` (`s3://`, `memory://`, `gs://`): not a local folder."""
    text = os.fspath(spec)
    scheme, sep, _rest = text.partition("://")
    return bool(sep) and len(scheme) > 1 and scheme.isascii() and scheme.replace("+", "").isalnum() and scheme != "file"


def valid_day(name: str) -> bool:
    """`YYYY-MM-DD` naming a date that exists (not `2026-13-45`, `2024-02-30` or `0000-01-01`)."""
    if not DATE_DIR.match(name):
        return False
    try:
        date.fromisoformat(name)
    except ValueError:
        return False
    return True


def day_dirs(root: Path, skip: Skip | None = None) -> list[Path]:
    """The real day folders under `root`, unsorted; every other visible entry goes to `skip`."""
    days = []
    for entry in _entries(root, skip):
        if entry.is_dir(follow_symlinks=False) and valid_day(entry.name):
            days.append(Path(entry.path))
        elif entry.name in SEGMENT_FOLDERS and entry.is_dir(follow_symlinks=False):
            continue  # the columnar layout beside this one (`flowrl.store.segments`), read by a SegmentStore
        elif skip is not None:
            skip(Path(entry.path), f"{entry.path}: {_not_ours(entry, 'a day folder (YYYY-MM-DD, a real date)')}")
    return days


def trace_files(day: Path, skip: Skip | None = None) -> list[Path]:
    """The regular `*.json` files of one day folder, by name; links and non-regular entries go to `skip`."""
    files = []
    for entry in sorted(_entries(day, skip), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            if entry.name.endswith(".json"):
                files.append(Path(entry.path))
        elif skip is not None:
            skip(Path(entry.path), f"{entry.path}: {_not_ours(entry, 'a trace file')}")
    return files


def is_regular(path: Path) -> bool:
    """A regular file, not through a link."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _entries(folder: Path, skip: Skip | None) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return [e for e in it if not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):  # removed meanwhile, or no store yet
        return []
    except OSError as exc:
        if skip is not None:
            skip(folder, f"{folder}: cannot list: {exc.strerror or exc}: check its permissions")
        return []


def _not_ours(entry: os.DirEntry[str], wanted: str) -> str:
    if entry.is_symlink():
        return "a symbolic link, not followed (a link can lead out of the store): move what it points to here"
    if entry.is_dir(follow_symlinks=False):
        return f"a folder that is not {wanted}, skipped: move it out of the store"
    if entry.is_file(follow_symlinks=False):
        return f"a file that is not {wanted}, skipped: move it out of the store"
    return "not a regular file (a FIFO, socket or device), never opened: remove it from the store"


def atomic_write_bytes(path: Path, data: bytes, staging: Path | None = None, *, within: Path | None = None) -> None:
    """Write `data` to `path` via a fsynced temp file in `staging` (same filesystem), rename it into place and
    fsync the folder: the file is whole and on disk, name included, when this returns.

    With `within` (a store root): `path` is `within/{folder}/{name}` and the staging folder `within/.staging`;
    both folders are checked as `write_many` checks them (a link in their place is replaced)."""
    path = Path(path)
    if within is not None:
        if path.parent.parent != within:
            raise ValueError(f"{path} is not a file in a folder directly under {within}")
        put_files(within, [(path.parent.name, path.name, data)], bulk=False)
        return
    staging = staging or path.parent
    staging.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _stage(staging, path.name, data, fsync=True)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    sync_folder(path.parent)


def put_files(root: Path, items: Iterable[tuple[str, str, bytes]], bulk: bool) -> None:
    """Store each `(folder, name, data)` under `root`: stage it, make the data durable (an fsync each, or one
    `syncfs` for all with `bulk`), rename each into place, then fsync every touched folder once and the root
    when a folder was created. A failure removes every staged file not yet renamed."""
    root.mkdir(parents=True, exist_ok=True)
    folders: dict[str, Path] = {}
    created = False

    def folder(name: str) -> Path:
        nonlocal created
        if name not in folders:
            folders[name], new = real_folder(root, name)
            created = created or new
        return folders[name]

    staging = folder(STAGING)
    staged: list[tuple[str, str, str]] = []
    moved = 0
    try:
        for day, name, data in items:
            staged.append((_stage(staging, name, data, fsync=not bulk), day, name))
        if bulk and staged:
            _syncfs(staging)
        for tmp, day, name in staged:
            os.replace(tmp, folder(day) / name)
            moved += 1
    except BaseException:
        for tmp, _, _ in staged[moved:]:
            _unlink(tmp)
        raise
    for day in dict.fromkeys(day for _, day, _ in staged):
        sync_folder(folders[day])
    if created:
        sync_folder(root)


def real_folder(root: Path, name: str) -> tuple[Path, bool]:
    """`root/name` as a real folder, created when missing (True then). A symbolic link in its place is replaced by
    a folder, since writing through it would leave the root; only the link is removed, never what it points to.
    Anything else there (a file) is an error that names it."""
    path = root / name
    for _ in range(3):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
                return path, True
            continue
        if stat.S_ISDIR(mode):
            return path, False
        if not stat.S_ISLNK(mode):
            raise StoreError(f"cannot write into {path}: it is not a folder: move it out of the store")
        target = os.readlink(path)
        os.unlink(path)
        log.warning(
            "flowrl: %s was a symbolic link to %s; replaced it by a folder so that no write leaves %s "
            "(nothing at %s was touched)",
            path,
            target,
            root,
            target,
        )
    raise StoreError(f"{path} keeps changing while flowrl writes there: check what else writes into {root}")


def _stage(staging: Path, name: str, data: bytes, fsync: bool) -> str:
    """A new temp file in `staging` holding `data` (mode 0600; created exclusively, never through a link)."""
    fd, tmp = tempfile.mkstemp(dir=staging, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def write_synced(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, fsync it and close it (closed on an error too)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that names renamed into it survive a power cut. Windows has no folder handle to sync;
    a filesystem that refuses (EINVAL) makes renames as durable as it makes them."""
    if os.name == "nt":  # pragma: no cover - Windows
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _syncfs(path: Path) -> None:
    """Flush every dirty page of the filesystem holding `path` (Linux `syncfs`; elsewhere `os.sync`)."""
    import ctypes
    import ctypes.util

    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if getattr(libc, "syncfs", None) is None or libc.syncfs(fd) != 0:
            os.sync()
    except OSError:
        os.sync()
    finally:
        os.close(fd)


def clean_staging(staging: Path, older_than_s: float = STALE_STAGING_S) -> int:
    """Remove the leftover temp files (`.*.tmp`) in `staging` older than `older_than_s`; return how many.

    By age, not existence: a younger one may be a writer's in another process, about to be renamed. Never
    follows a link (a linked staging folder is not cleaned); errors are ignored (a read-only store stays)."""
    try:
        fd = os.open(staging, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return 0
    removed, deadline = 0, time.time() - older_than_s
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it if e.name.startswith(".") and e.name.endswith(".tmp")]
        for name in names:
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime < deadline:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
    except (OSError, TypeError, NotImplementedError):  # TypeError: no scandir of a folder handle here
        pass
    finally:
        os.close(fd)
    if removed:
        log.info("flowrl: removed %d stale staging files from %s", removed, staging)
    return removed


def read_regular_file(path: Path, *, follow_links: bool = False) -> bytes:
    """The bytes of `path`, a regular file, opened without blocking and (unless `follow_links`) without following
    a link: a link, FIFO, socket, device or folder raises OSError instead (opening a FIFO to read waits for a
    writer forever). Readers of files outside a store (ingest) may pass `follow_links=True`."""
    nofollow = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)
    flags = os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP, "a symbolic link, not followed (a link can lead out of the store)", str(path)
            ) from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket, device or folder)", str(path))
        with open(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def open_lock(path: Path) -> int:
    """The lock file's descriptor, never through a link (a link there is removed: the lock would create its target)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    os.unlink(path)
    return os.open(path, flags, 0o644)


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
            if path is not None and is_regular(path):
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
            for path in trace_files(day):
                paths[path.stem] = path
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
