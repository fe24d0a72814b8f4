"""Generated docs must match the code: regenerate with `python -m flowrl.docgen`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.docgen import DOCS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(DOCS))
def test_generated_doc_is_current(name: str) -> None:
    committed = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert committed == DOCS[name](), f"docs/{name} is stale: run `python -m flowrl.docgen`"


def test_import_flowrl_stays_light() -> None:
    code = (
        "import sys, flowrl, flowrl.store.files, flowrl.trace.redact, flowrl.capture; "
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_every_public_name_resolves() -> None:
    import flowrl

    for name in flowrl.__all__:
        assert getattr(flowrl, name) is not None, name
