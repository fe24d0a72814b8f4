"""A third-party training method in one file: SFT on each task's earliest good run (for tests/test_methods.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from flowrl.data.base import BuildStats, Loader, TraceInfo
from flowrl.data.sft import SFTDatasetBuilder


@dataclass(kw_only=True)
class FirstGoodSFTBuilder(SFTDatasetBuilder):
    method: ClassVar[str] = "first-good-sft"

    def group_rows(self, members: list[TraceInfo], load: Loader, stats: BuildStats) -> Iterator[dict[str, Any]]:
        good = sorted((m for m in members if m.label), key=lambda m: m.timestamp)[:1]
        self.select = "label"
        yield from super().group_rows(good, load, stats)
