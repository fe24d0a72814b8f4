"""docs/capture.md must not go stale: every option and every counter is documented."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from flowrl.capture import CaptureStats
from flowrl.capture.hook import OPTIONS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "capture.md").read_text(encoding="utf-8")


def _table_names(heading: str) -> set[str]:
    section = DOC.split(heading, 1)[1].split("\n## ", 1)[0]
    return {name for row in re.findall(r"^\| ([^|]+) \|", section, re.M) for name in re.findall(r"`(\w+)`", row)}


def test_every_option_is_documented() -> None:
    assert _table_names("## Options") >= set(OPTIONS), set(OPTIONS) - _table_names("## Options")


def test_every_counter_is_documented() -> None:
    fields = {f.name for f in dataclasses.fields(CaptureStats)}
    assert _table_names("## `Hook`") >= fields, fields - _table_names("## `Hook`")
