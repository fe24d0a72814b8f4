"""Names in a segment store: writer ids, object names, partitions. Pure functions, no I/O.

An object is `{kind}/date=YYYY-MM-DD/{writer_id}-{seq:06d}-{rand}.{ext}`. Readers only ever take a name that
matches `OBJECT` in full; anything else under `segments/` or `sidecar/` (a temporary upload, a stray copy) is
reported and skipped. Two writers never produce one name: the writer id (host, process, random) is in it, the
sequence number counts within the writer, and 48 random bits are drawn per object; where the filesystem can
refuse to replace an object (local links, S3 `If-None-Match`), a name that exists is refused and redrawn.
"""

from __future__ import annotations

import os
import re
import secrets
import socket

from flowrl.errors import ConfigError
from flowrl.store.index import valid_day

SEGMENTS = "segments"
SIDECAR = "sidecar"
WRITER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
OBJECT = re.compile(
    r"^(?P<writer>[A-Za-z0-9][A-Za-z0-9_.\-]{0,63})-(?P<seq>\d{6,12})-(?P<rand>[0-9a-f]{12})\.(?P<ext>parquet|jsonl)$"
)
PARTITION = re.compile(r"^date=(?P<day>\d{4}-\d{2}-\d{2})$")
EXTENSIONS = {SEGMENTS: "parquet", SIDECAR: "jsonl"}


def default_writer_id() -> str:
    """`{hostname}-{pid}-{random}`, reduced to the safe characters: unique per process and per store object."""
    host = re.sub(r"[^A-Za-z0-9_.\-]", "_", socket.gethostname() or "host")[:40].strip("._-") or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def check_writer_id(writer_id: str) -> str:
    """`writer_id` when it is 1 to 64 of letters, digits, `_`, `.`, `-` (starting with a letter or digit)."""
    if not isinstance(writer_id, str) or not WRITER_ID.match(writer_id):
        raise ConfigError(
            f"writer id {writer_id!r}: use 1 to 64 letters, digits, '_', '.' and '-', starting with a letter or digit"
        )
    return writer_id


def object_name(writer_id: str, seq: int, ext: str) -> str:
    """A fresh object name: the writer, its sequence number and 48 random bits."""
    return f"{writer_id}-{seq:06d}-{secrets.token_hex(6)}.{ext}"


def partition(day: str) -> str:
    return f"date={day}"


def day_of_partition(name: str) -> str | None:
    """The day of a `date=YYYY-MM-DD` folder name naming a date that exists, else None."""
    m = PARTITION.match(name)
    return m.group("day") if m and valid_day(m.group("day")) else None


def parse_object(name: str, ext: str) -> tuple[str, int] | None:
    """`(writer_id, seq)` of a final object name with extension `ext`, else None (not the store's)."""
    m = OBJECT.match(name)
    if m is None or m.group("ext") != ext:
        return None
    return m.group("writer"), int(m.group("seq"))
