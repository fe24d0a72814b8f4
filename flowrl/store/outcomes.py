"""The host's outcomes on disk: append-only side records beside the traces.

Layout: `{root}/.outcomes/{trace_id}.jsonl`, one JSON object per line (a `flowrl.trace.outcomes.HostOutcome` plus its
`trace_id`). A line is appended with `O_APPEND` and fsynced (the folder too when the file is new), and never
rewritten: a correction is a new line. The trace file itself is never touched, so re-scoring (which rewrites
it) cannot lose an outcome, and an outcome may be recorded before its trace is written (it is read whenever the
trace is). Lines over `MAX_LINE` bytes are refused; the file is never opened through a link.

Reading skips, and reports through `skip`, whatever is not an outcome: a line that is not JSON, not an object,
for another trace, or not a valid outcome; a link or FIFO in place of the file.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
from pydantic import ValidationError

from flowrl.store.index import read_regular_file, real_folder, sync_folder, write_synced
from flowrl.trace.outcomes import HostOutcome

OUTCOMES = ".outcomes"
MAX_LINE = 64 * 1024

Skip = Callable[[Path, str], None]


def outcome_file(root: Path, trace_id: str) -> Path:
    return root / OUTCOMES / f"{trace_id}.jsonl"


def append_outcomes(root: Path, trace_id: str, outcomes: Iterable[HostOutcome]) -> int:
    """Append `outcomes` to the trace's side file, durably. Returns how many lines were written."""
    lines = b"".join(_line(trace_id, o) for o in outcomes)
    if not lines:
        return 0
    root.mkdir(parents=True, exist_ok=True)
    folder, _created = real_folder(root, OUTCOMES)
    path = folder / f"{trace_id}.jsonl"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    new = not os.path.lexists(path)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link in place of an outcomes file, not followed", str(path)) from exc
        raise
    write_synced(fd, lines)
    if new:
        sync_folder(folder)
    return lines.count(b"\n")


def _line(trace_id: str, outcome: HostOutcome) -> bytes:
    data = {"trace_id": trace_id, **outcome.model_dump(mode="json", exclude_none=True)}
    line = orjson.dumps(data) + b"\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"an outcome of {len(line)} bytes is over the {MAX_LINE}-byte limit of one record")
    return line


def read_outcomes(root: Path, trace_id: str, skip: Skip | None = None) -> list[HostOutcome]:
    """The trace's outcomes in the order they were recorded; [] when it has none."""
    path = outcome_file(root, trace_id)
    if path.parent.is_symlink():
        _skip(skip, path.parent, f"{path.parent}: a symbolic link in place of the outcomes folder, not followed")
        return []
    try:
        raw = read_regular_file(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        _skip(skip, path, f"{path}: {exc.strerror or exc}")
        return []
    out = []
    lines = raw.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            if number == len(lines) and not raw.endswith(b"\n"):
                continue  # a line still being appended by another process
            _skip(skip, path, f"{where}: not JSON")
            continue
        if not isinstance(data, dict) or data.get("trace_id") != trace_id:
            _skip(skip, path, f"{where}: not an outcome of trace {trace_id}")
            continue
        data.pop("trace_id")
        try:
            out.append(HostOutcome.model_validate(data))
        except ValidationError as exc:
            _skip(skip, path, f"{where}: not a valid outcome ({exc.errors()[0].get('msg')})")
    return out


def ids_with_outcomes(root: Path) -> set[str]:
    """The ids of every trace that has a side file (one listing; a missing folder means none)."""
    if (root / OUTCOMES).is_symlink():
        return set()  # reported when a trace's outcomes are read (`read_outcomes`)
    try:
        with os.scandir(root / OUTCOMES) as entries:
            return {e.name[:-6] for e in entries if e.name.endswith(".jsonl")}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _skip(skip: Skip | None, path: Path, message: str) -> None:
    if skip is not None:
        skip(path, message)
