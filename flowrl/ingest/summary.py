"""What an ingest did: counts, skip reasons and rejected files."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MAX_LISTED = 1000


@dataclass
class Rejected:
    path: str
    reason: str


@dataclass
class IngestSummary:
    """What one ingest (or one watch session) did. `read == new + duplicate + skipped`."""

    files_read: int = 0
    read: int = 0
    new: int = 0
    duplicate: int = 0
    skipped: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    rejected_count: int = 0
    skip_reasons: Counter[str] = field(default_factory=Counter)
    new_by_source: Counter[str] = field(default_factory=Counter)
    masked: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Something was read (new or already stored)."""
        return self.files_read > 0

    def reject(self, path: Path | str, reason: str) -> None:
        self.rejected_count += 1
        if len(self.rejected) < _MAX_LISTED:
            self.rejected.append(Rejected(str(path), reason))

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped += n
        self.skip_reasons[reason] += n

    def to_dict(self) -> dict[str, Any]:
        return {"files_read": self.files_read, "read": self.read, "new": self.new, "duplicate": self.duplicate,
                "skipped": self.skipped, "rejected": self.rejected_count,
                "rejected_files": [{"path": r.path, "reason": r.reason} for r in self.rejected],
                "skip_reasons": dict(self.skip_reasons), "new_by_source": dict(self.new_by_source),
                "masked": self.masked, "seconds": round(self.seconds, 3)}
