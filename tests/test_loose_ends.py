"""Issue 15, "contract breaks and loose ends", one test each (the store-problems one guards the per-operation
record issue 13 introduced; the others failed on main)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.data import DatasetFilter
from flowrl.errors import ConfigError
from flowrl.store.files import TraceFilter, TraceStore
from flowrl.trace.load import upgrade
from flowrl.trace.schema import ExecutionTrace

ROOT = Path(__file__).resolve().parents[1]


def test_upgrade_leaves_its_input_untouched() -> None:
    """The v0 -> v1 step set `success: False` on the caller's own tool-call dicts."""
    old = {
        "trace_id": "t1",
        "user_query": "q",
        "final_response": "a",
        "tool_calls": [{"tool_name": "x", "result": "Error: boom", "success": True, "arguments": {"a": 1}}],
        "messages": [{"role": "user", "content": "q"}],
    }
    before = copy.deepcopy(old)
    new = upgrade(old)
    assert old == before
    assert new["tool_calls"][0]["success"] is False


def test_one_filter_concept_that_checks_its_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`flowrl traces ls --source bogus` exited 0 with "0 traces": TraceFilter did not check, DatasetFilter did."""
    TraceStore(tmp_path).write(ExecutionTrace(user_query="q"))
    assert main(["traces", "ls", "--source", "bogus", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "source 'bogus'" in err and len(err.strip().splitlines()) == 1
    for bad in ({"source": "bogus"}, {"label_source": "robot"}, {"min_reward": 0.9, "max_reward": 0.1}):
        with pytest.raises(ConfigError):
            TraceFilter(**bad)
        with pytest.raises(ConfigError):
            DatasetFilter(**bad)
    assert isinstance(DatasetFilter(), TraceFilter)


def test_store_problems_are_the_latest_listings_not_every_one_ever(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(user_query="q", timestamp="2026-11-20T10:00:00"))
    bad = tmp_path / "2026-11-20" / "bad.json"
    for i in range(3):
        bad.write_text("{not json" + " " * i)
        list(store.iter_traces())
        assert len(store.problems) == 1
    bad.unlink()
    list(store.iter_traces())
    assert len(store.problems) == 0


def test_the_hooks_folder_holds_only_drop_ins() -> None:
    """hooks/flowrl_rl_tools.py held 256 lines of logic; its logic is flowrl.rl_tools now."""
    from flowrl import rl_tools

    path = ROOT / "hooks" / "flowrl_rl_tools.py"
    spec = importlib.util.spec_from_file_location("flowrl_rl_tools_dropin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.register_rl_tools is rl_tools.register_rl_tools and module.RLTools is rl_tools.RLTools
    assert len(path.read_text().splitlines()) < 30


def test_docstrings_cite_files_in_the_repo() -> None:
    """Docstrings cited "reference §7" and "peers.md §3", documents that were not in the repo."""
    cited = set()
    for path in (ROOT / "flowrl").rglob("*.py"):
        text = path.read_text()
        assert "peers.md" not in text, path
        if "reference §" in text or "reference flowagent" in text:
            cited.add(path)
        if "docs/reference/flowagent-0.1.28.md" in text:
            assert (ROOT / "docs" / "reference" / "flowagent-0.1.28.md").is_file()
    assert not cited, cited
