"""`promotions.jsonl`: the append-only record of every promotion decision, what is promoted now, and rollback.

One JSON object a line, never rewritten: each `flowrl promote` appends its decision (`action` "promote" or
"refuse"), each `--rollback` a "rollback" line. A line holds the time, the candidate, the model it would replace
(`replaced`; null: the base model), the eval JSON's path and sha256, the held-out set's fingerprint (`held_out`: a
hash of its sorted task ids) and the decision's figures. What is promoted now is the last promotion not undone by
a rollback (a stack: a rollback pops one). Appends go through `O_APPEND`, never through a link planted in the
file's place, and are synced before the call returns, so a crash leaves whole lines; a line that is not a record
is refused in one line naming the file and line, and nothing is appended after it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError

__all__ = ["ACTIONS", "FILE_NAME", "Entry", "History", "fingerprint", "sha256_of"]

FILE_NAME = "promotions.jsonl"
ACTIONS = ("promote", "refuse", "rollback")


def fingerprint(task_ids: Iterable[str]) -> str:
    """A held-out set's identity: the sha256 of its sorted task ids (16 hex digits)."""
    return hashlib.sha256("\n".join(sorted(task_ids)).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    action: str
    candidate: str | None
    replaced: str | None
    time: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    eval_path: str | None = None
    eval_sha256: str | None = None
    held_out: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class History:
    """The record at `path` (`promotions.jsonl`; created by the first append)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def entries(self) -> list[Entry]:
        if not self.path.exists():
            return []
        out = []
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                entry = Entry(**raw)
            except (ValueError, TypeError) as exc:
                raise FlowRLError(
                    f"{self.path}:{n} is not a promotion record ({exc}): move the file aside to start a new history"
                ) from exc
            if entry.action not in ACTIONS:
                raise FlowRLError(f"{self.path}:{n}: unknown action {entry.action!r} (use {', '.join(ACTIONS)})")
            out.append(entry)
        return out

    def promoted(self) -> list[str]:
        """The stack of promoted models, oldest first: each promotion pushes, each rollback pops."""
        stack: list[str] = []
        for entry in self.entries():
            if entry.action == "promote" and entry.candidate:
                stack.append(entry.candidate)
            elif entry.action == "rollback" and stack:
                stack.pop()
        return stack

    def current(self) -> str | None:
        """The model promoted now; None: none was (the base model serves)."""
        stack = self.promoted()
        return stack[-1] if stack else None

    def uses(self, held_out: str) -> int:
        """Decisions (promotions and refusals) taken on the held-out set with this fingerprint."""
        return sum(e.held_out == held_out and e.action in ("promote", "refuse") for e in self.entries())

    def append(self, entry: Entry) -> Entry:
        if entry.action not in ACTIONS:
            raise FlowRLError(f"unknown action {entry.action!r}: use {', '.join(ACTIONS)}")
        self.entries()  # a damaged record is refused before anything is added to it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FlowRLError(f"{self.path} is a symbolic link: not followed; remove it") from exc
            raise FlowRLError(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        try:
            os.write(fd, (json.dumps(entry.to_dict(), ensure_ascii=False) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return entry

    def rollback(self) -> tuple[str, str | None]:
        """Undo the last promotion: (the model taken back, the model promoted again; None: the base)."""
        stack = self.promoted()
        if not stack:
            raise FlowRLError(f"nothing to roll back: {self.path} records no promotion in force")
        undone = stack[-1]
        restored = stack[-2] if len(stack) > 1 else None
        self.append(Entry("rollback", candidate=restored, replaced=undone, reason=f"rolled back {undone}"))
        return undone, restored


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
