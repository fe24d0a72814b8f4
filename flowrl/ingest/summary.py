"""What an ingest did: counts, skip reasons and rejected files."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.ingest.times import printable

_MAX_LISTED = 1000


@dataclass
class Rejected:
    path: str
    reason: str


@dataclass
class IngestSummary:
    """What one ingest (or one watch session) did. `read == new + upgraded + duplicate + skipped`.

    `upgraded`: stored traces a richer file upgraded in place (`flowrl.ingest.upgrade`). `notes`: odd things
    that stopped nothing (a checkpoint name with an impossible time), by what was done about them."""

    files_read: int = 0
    read: int = 0
    new: int = 0
    upgraded: int = 0
    duplicate: int = 0
    skipped: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    rejected_count: int = 0
    skip_reasons: Counter[str] = field(default_factory=Counter)
    new_by_source: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    masked: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Something was read (new or already stored)."""
        return self.files_read > 0

    def reject(self, path: Path | str, reason: str) -> None:
        self.rejected_count += 1
        if len(self.rejected) < _MAX_LISTED:  # printable: a file name need not be UTF-8, a terminal wants it
            self.rejected.append(Rejected(printable(str(path)), printable(reason)))

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped += n
        self.skip_reasons[reason] += n

    def note(self, reason: str, n: int = 1) -> None:
        self.notes[reason] += n

    def to_dict(self) -> dict[str, Any]:
        return {
            "files_read": self.files_read,
            "read": self.read,
            "new": self.new,
            "upgraded": self.upgraded,
            "duplicate": self.duplicate,
            "skipped": self.skipped,
            "rejected": self.rejected_count,
            "rejected_files": [{"path": r.path, "reason": r.reason} for r in self.rejected],
            "skip_reasons": dict(self.skip_reasons),
            "new_by_source": dict(self.new_by_source),
            "notes": dict(self.notes),
            "masked": self.masked,
            "seconds": round(self.seconds, 3),
        }
