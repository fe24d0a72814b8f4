"""Restricted unpickling of FlowAgent checkpoints.

Pickle runs code: any class or function a pickle names is imported and may be called while it loads. So
checkpoints are never read with `pickle.load`. `RestrictedUnpickler.find_class` answers only the globals
listed in `ALLOWED` and refuses everything else with `UnsafePickleError`, naming the file and the class.
The refusal happens when the pickle *names* the global, before anything could call it, so a hostile
pickle (one whose `__reduce__` returns `os.system`, `subprocess.Popen`, `builtins.eval`, ...) stops there.

The allow-list (docs/reference/flowagent-0.1.28.md §3.1 and §3.7):

| pickled global | what flowrl gives the pickle |
|---|---|
| `toolboxv2.mods.isaa.base.Agent.checkpoint_manager.AgentCheckpoint` | `V2Checkpoint`, a plain stand-in that \
only stores its state |
| `toolboxv2.mods.isaa.base.Agent.types.AgentCheckpoint` (V1) | `V1Checkpoint`, the same kind of stand-in |
| `toolboxv2.mods.isaa.base.Agent.vfs_v2.FileBackingType` | `FileBackingType`, a stand-in holding the enum value |
| `datetime.datetime`, `datetime.date`, `datetime.time`, `datetime.timedelta`, `datetime.timezone` | the real classes |
| `builtins.set`, `builtins.frozenset`, `builtins.complex` | the real types |
| `builtins.bytes`, `builtins.bytearray` | wrappers that refuse an integer size (no `bytes(10**12)`) |
| `collections.OrderedDict` | the real class |
| `_codecs.encode` (how protocol 2 stores bytes) | a wrapper that only accepts the `latin1` codec |

Nothing from toolboxv2 is imported, and no project code runs: the stand-ins receive the instance
`__dict__` that dataclass pickles carry. Persistent ids are refused too (the C unpickler's default).
"""

from __future__ import annotations

import _codecs
import collections
import datetime
import io
import os
import pickle
import stat
from pathlib import Path
from typing import Any

from flowrl.errors import IngestError, UnsafePickleError

V2_CLASS = ("toolboxv2.mods.isaa.base.Agent.checkpoint_manager", "AgentCheckpoint")
V1_CLASS = ("toolboxv2.mods.isaa.base.Agent.types", "AgentCheckpoint")
FILE_BACKING_CLASS = ("toolboxv2.mods.isaa.base.Agent.vfs_v2", "FileBackingType")


class PickledObject:
    """Stand-in for a pickled dataclass: keeps the state, has no behaviour."""

    class_path = ""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            dict_state, slot_state = state
            for part in (dict_state, slot_state):
                if isinstance(part, dict):
                    self.__dict__.update(part)
            return
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state


class V2Checkpoint(PickledObject):
    class_path = ".".join(V2_CLASS)


class V1Checkpoint(PickledObject):
    class_path = ".".join(V1_CLASS)


class FileBackingType:
    """Stand-in for vfs_v2.FileBackingType (an Enum pickled as `FileBackingType(value)`)."""

    _NAMES = {1: "MEMORY", 2: "SHADOW", 3: "MODIFIED"}

    def __init__(self, value: Any) -> None:
        self.value = value
        self.name = self._NAMES.get(value, str(value)) if isinstance(value, int) else str(value)

    def __repr__(self) -> str:
        return f"FileBackingType.{self.name}"


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r} is not allowed")
    return _codecs.encode(obj, encoding, errors)


def _sized_refused(kind: type) -> Any:
    def make(*args: Any) -> Any:
        if any(isinstance(a, int) for a in args):
            raise pickle.UnpicklingError(f"{kind.__name__}(<int>) is not allowed in a checkpoint")
        return kind(*args)

    make.__name__ = kind.__name__
    return make


ALLOWED: dict[tuple[str, str], Any] = {
    V2_CLASS: V2Checkpoint,
    V1_CLASS: V1Checkpoint,
    FILE_BACKING_CLASS: FileBackingType,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytes"): _sized_refused(bytes),
    ("builtins", "bytearray"): _sized_refused(bytearray),
}


class RestrictedUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only the globals in `ALLOWED`."""

    def __init__(self, file: Any, *, origin: str = "<pickle>") -> None:
        super().__init__(file)
        self.origin = origin

    def find_class(self, module: str, name: str) -> Any:
        target = ALLOWED.get((module, name))
        if target is None:
            raise UnsafePickleError(
                f"{self.origin}: refused to load class {module}.{name}: it is not on the FlowAgent checkpoint "
                f"allow-list (a checkpoint holds only AgentCheckpoint, datetime and builtins)"
            )
        return target


def loads_restricted(data: bytes, *, origin: str = "<pickle>") -> Any:
    """Unpickle `data` with the allow-list. Raises UnsafePickleError or IngestError (never anything else)."""
    if not data:
        raise IngestError(f"{origin}: empty file")
    try:
        return RestrictedUnpickler(io.BytesIO(data), origin=origin).load()
    except UnsafePickleError:
        raise
    except EOFError as exc:
        raise IngestError(f"{origin}: truncated pickle (ran out of input)") from exc
    except RecursionError as exc:
        raise IngestError(f"{origin}: corrupt pickle (nesting too deep)") from exc
    except MemoryError as exc:
        raise IngestError(f"{origin}: corrupt pickle (asks for more memory than available)") from exc
    except Exception as exc:  # UnpicklingError, ValueError, TypeError, KeyError, ... from corrupt data
        raise IngestError(f"{origin}: truncated or corrupt pickle ({type(exc).__name__}: {exc})") from exc


def load_restricted(path: Path) -> Any:
    """Read and unpickle one file with the allow-list."""
    return loads_restricted(read_bytes(path), origin=str(path))


def read_bytes(path: Path) -> bytes:
    """Read a whole regular file; one that vanishes, cannot be read or is something else (a FIFO, a device:
    reading those could block for ever) raises IngestError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise IngestError(f"{path}: vanished before it could be read") from exc
    except IsADirectoryError as exc:
        raise IngestError(f"{path}: is a directory, not a file") from exc
    except OSError as exc:
        raise IngestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            if stat.S_ISDIR(mode):
                raise IngestError(f"{path}: is a directory, not a file")
            raise IngestError(f"{path}: not a regular file (a FIFO, socket or device is never read)")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read()
    except OSError as exc:
        raise IngestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    finally:
        if fd >= 0:
            os.close(fd)
