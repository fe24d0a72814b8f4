"""A segment store's root over fsspec: resolve a URL, put an object atomically without replacing one, list.

**Atomic puts, never a replacement.** A local root stages the bytes in `{root}/.staging` (fsynced), then
`os.link`s the staged file to its final name, which fails when that name exists, and fsyncs the folder: a reader
sees the whole object or none, and a name is never reused. An object store gets one whole-object PUT
(`pipe_file`; S3 PUT is atomic, so a listing never shows part of an object) with `mode="create"` (S3
`If-None-Match: *`), so an existing object is refused, not replaced; a filesystem that cannot refuse still gets
a name no other writer draws (see `flowrl.store.segments.names`).

**Listings are fresh and hostile-safe.** Cached listings are dropped before each one (s3fs caches them), links
and anything that is not a regular file or folder are reported, never opened; local files are read with
`read_regular_file` (no link followed, no FIFO opened).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.store.index import STAGING, is_url, read_regular_file, sync_folder, write_synced
from flowrl.store.segments.names import day_of_partition

Skip = Callable[[str, str], None]
"""Told of each entry a listing passes over: its location and a message naming it and what to do."""


class RootURL(str):
    """A remote store's root as its URL; `is_dir()` says whether anything is stored there, as `Path.is_dir` does
    for a local root (callers such as `flowrl score` check the root that way)."""

    _exists: Callable[[], bool]

    def __new__(cls, url: str, exists: Callable[[], bool]) -> RootURL:
        obj = super().__new__(cls, url)
        obj._exists = exists
        return obj

    def is_dir(self) -> bool:
        return self._exists()


@dataclass(frozen=True)
class Entry:
    """One listed object: its fsspec path, its name and its size."""

    path: str
    name: str
    size: int


class Root:
    """The folder or prefix a segment store lives under, and the filesystem it is on."""

    def __init__(self, spec: str | os.PathLike[str]) -> None:
        from fsspec.core import url_to_fs

        text = os.fspath(spec)
        if text.startswith("file://"):
            text = text[len("file://") :]
        if not is_url(text):
            text = str(Path(text).expanduser().absolute())
        self.fs: Any
        self.fs, self.path = url_to_fs(text)
        self.path = self.path.rstrip("/")
        self.local = "file" in protocols(self.fs)
        self.url = self.path if self.local else self.fs.unstrip_protocol(self.path)

    def join(self, *parts: str) -> str:
        return "/".join([self.path, *parts])

    def display(self, path: str) -> str:
        """How a location is named in messages: a local path, or the full URL."""
        return path if self.local else self.fs.unstrip_protocol(path)

    # -- writing -----------------------------------------------------------------------------------
    def put_new(self, folder: str, make_name: Callable[[], str], data: bytes) -> str:
        """Store `data` as a new object in `folder` (relative to the root) under a name from `make_name`,
        drawing another name if one exists. Returns the object's fsspec path."""
        for _attempt in range(8):
            name = make_name()
            path = self.join(folder, name)
            try:
                if self.local:
                    self._put_local(Path(path), data)
                else:
                    self._put_remote(path, data)
                return path
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no free object name after 8 draws", self.join(folder))

    def _put_local(self, path: Path, data: bytes) -> None:
        staging = Path(self.path) / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = staging / f"{path.name}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags, 0o644)
        try:
            write_synced(fd, data)
            try:
                os.link(tmp, path)  # refuses an existing name, unlike os.replace
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links: the random name keeps it unique
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        sync_folder(path.parent)

    def _put_remote(self, path: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            raise
        except (TypeError, NotImplementedError):  # an fsspec filesystem without exclusive puts
            self.fs.pipe_file(path, data)
        except OSError as exc:
            if "PreconditionFailed" in str(exc) or "412" in str(exc):
                raise FileExistsError(errno.EEXIST, "object exists", path) from exc
            raise

    def remove(self, path: str) -> None:
        self.fs.rm_file(path)

    # -- reading -----------------------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        if self.local:
            return read_regular_file(Path(path))
        data = self.fs.cat_file(path)
        return bytes(data)

    def open(self, path: str) -> Any:
        """A binary file object to read `path`: a local regular file opened without following a link or
        blocking on a FIFO; an object through fsspec (ranged reads, so unread column chunks are not fetched)."""
        if not self.local:
            return self.fs.open(path, "rb")
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket, device or folder)", path)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def exists(self) -> bool:
        try:
            return bool(self.fs.isdir(self.path))
        except OSError:
            return False

    def listdir(self, path: str, skip: Skip | None) -> tuple[list[Entry], list[Entry]]:
        """`(folders, files)` directly in `path`, fresh; links and special files go to `skip`. A missing
        folder lists as empty."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        folders, files = [], []
        for info in entries:
            full = str(info.get("name", "")).rstrip("/")
            name = full.rsplit("/", 1)[-1]
            if not name or full == path:
                continue
            if info.get("islink"):
                _tell(skip, self.display(full), "a symbolic link, never followed: remove it from the store")
            elif info.get("type") == "directory":
                folders.append(Entry(full, name, 0))
            elif info.get("type") == "file":
                files.append(Entry(full, name, int(info.get("size") or 0)))
            elif skip is not None:
                _tell(skip, self.display(full), "not a regular file (a FIFO, socket or device), never opened")
        return folders, files

    def walk_partitions(self, kind: str, skip: Skip | None) -> Iterator[tuple[str | None, Entry]]:
        """`(day or None, folder)` for each entry under `{root}/{kind}` (None: not a `date=` partition)."""
        folders, files = self.listdir(self.join(kind), skip)
        for f in files:
            _tell(skip, self.display(f.path), f"a file outside any date= folder of {kind}/, skipped")
        for folder in folders:
            yield day_of_partition(folder.name), folder


def _tell(skip: Skip | None, where: str, message: str) -> None:
    if skip is not None:
        skip(where, f"{where}: {message}")


def protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
