"""Times and names read from files that someone else wrote: the one place ingest parses them.

A file name, a pickled `timestamp` or a logged time may say something impossible (month 13, 30 February,
hour 25, `"soon"`) or hold bytes that are not UTF-8. Nothing here raises on that: a time that cannot be is
None, so the caller falls back to the next source (the file's contents, then its modification time) and
says so once; text that JSON cannot hold is escaped.
"""

from __future__ import annotations

import os
import re
from datetime import date, datetime
from pathlib import Path
from typing import Any

_ISO_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}")


def time_text(value: Any) -> str | None:
    """A time as it was written (datetime/date as ISO, a string unchanged), for ids: never validated, so
    an id computed from it stays what it always was."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day).isoformat()
    if isinstance(value, str) and value:
        return value
    return None


def valid_time(value: Any) -> str | None:
    """An ISO time that exists (None for anything else). A string that starts `YYYY-MM-DD` is kept as written;
    another ISO form (`20261122T100000`) is rewritten as `YYYY-MM-DDTHH:MM:SS`, since the store files a trace
    under the date its timestamp starts with."""
    text = time_text(value)
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return text if _ISO_DAY.match(text) else parsed.isoformat()


def name_time(stamp: str, fmt: str = "%Y%m%d_%H%M%S") -> str | None:
    """The time a file name gives (`20261122_164945`), or None when it names no real time."""
    try:
        return datetime.strptime(stamp, fmt).isoformat()
    except ValueError:
        return None


def epoch_time(epoch: Any) -> str | None:
    """A Unix time as local ISO time; None for anything that is not a positive, representable number."""
    if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and epoch > 0:
        try:
            return datetime.fromtimestamp(epoch).isoformat()
        except (OverflowError, OSError, ValueError):
            return None
    return None


def file_time(path: Path) -> str | None:
    """The file's modification time (None when it cannot be read)."""
    try:
        return epoch_time(os.stat(path).st_mtime)
    except OSError:
        return None


def printable(text: str) -> str:
    """`text` with what UTF-8 cannot hold escaped: a file name's undecodable bytes (which Python keeps as lone
    surrogates) become `\\xff`, other lone surrogates `\\udxxx`. Unchanged when it is valid already."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> tuple[Any, bool]:
    """`value` (JSON-shaped: dicts, lists, strings, ...) with every string `printable`, and whether anything
    had to change."""
    if isinstance(value, str):
        safe = printable(value)
        return safe, safe is not value
    if isinstance(value, dict):
        changed = False
        out = {}
        for k, v in value.items():
            key, k_changed = json_safe(k) if isinstance(k, str) else (k, False)
            out[key], v_changed = json_safe(v)
            changed = changed or k_changed or v_changed
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        items = [json_safe(v) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
        return value, False
    return value, False
