"""A store layout is its class and one `Layout` line in `flowrl.store.opener.TABLE`."""

from __future__ import annotations

import pytest

from flowrl.errors import ConfigError
from flowrl.store import opener
from flowrl.store.files import TraceStore
from flowrl.store.opener import TABLE, Layout, open_store


class MarkedStore(TraceStore):
    """A made-up layout: a JSON store in a folder that holds a `MARKED` file."""


def test_one_layout_line_is_opened_by_name_and_by_what_the_folder_holds(tmp_path, monkeypatch):
    line = Layout("marked", f"{__name__}:MarkedStore", holds=lambda folder: (folder / "MARKED").is_file())
    monkeypatch.setattr(opener, "TABLE", (*TABLE, line))
    folder = tmp_path / "store"
    folder.mkdir()
    assert type(open_store(folder)) is TraceStore  # the default: no layout holds the folder yet
    (folder / "MARKED").write_text("")
    assert type(open_store(folder)) is MarkedStore
    assert type(open_store(tmp_path / "other", layout="marked")) is MarkedStore
    with pytest.raises(ConfigError, match="the marked layout needs a local folder; use layout 'segments'"):
        open_store("memory://x", layout="marked")
    with pytest.raises(ConfigError, match="flush_rows: not options of the marked layout"):
        open_store(folder, flush_rows=3)
