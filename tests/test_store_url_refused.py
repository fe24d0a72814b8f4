"""`TraceStore("s3://bucket/traces")` used to write into a local folder named `s3:` without a word (issue 39):
it is refused in one line that names the segment store's opener; `open_store` takes the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl.errors import ConfigError
from flowrl.store.files import TraceStore


def test_a_url_is_refused_and_nothing_is_written_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("s3://bucket/traces", "memory://traces", "gs://b/t"):
        with pytest.raises(ConfigError, match="open_store") as err:
            TraceStore(url)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no "s3:" folder
    assert TraceStore(tmp_path / "x").root == tmp_path / "x"  # folders still open
