"""The store against a hostile or damaged folder (issue 13): impossible dates, files without an id, FIFOs,
symbolic links, stale staging files and directory fsyncs. Reading never crashes or hangs: whatever is not a
trace is skipped and named in the operation's problems. Writing never leaves the root."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from flowrl.cli import main
from flowrl.data.synthetic import write_synthetic_store
from flowrl.errors import SchemaError, StoreError
from flowrl.report.metrics import store_metrics
from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import score_store
from flowrl.store.files import STALE_STAGING_S, TraceFilter, TraceStore
from flowrl.store.index import valid_day
from flowrl.trace.schema import ExecutionTrace

IMPOSSIBLE = ("2026-13-45", "2024-02-30", "0000-01-01")


def _trace(trace_id: str, day: str = "2026-11-21") -> ExecutionTrace:
    return ExecutionTrace(trace_id=trace_id, user_query="2+2?", final_response="4", timestamp=f"{day}T10:00:00")


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run `fn` in a thread; fail (instead of hanging the suite) when it does not return in time."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _release(fifo: Path) -> None:
    """Unblock a reader stuck opening `fifo` (so a failing test leaves no thread behind)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _dirs(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir()}


# -- impossible dates ------------------------------------------------------------------------------
@pytest.mark.parametrize("day", IMPOSSIBLE)
def test_an_impossible_date_is_stored_under_a_real_day_with_its_timestamp_kept(tmp_path: Path, day: str) -> None:
    store = TraceStore(tmp_path)
    path = store.write(_trace("odd", day))
    assert day not in _dirs(tmp_path)
    assert path.parent.parent == tmp_path and valid_day(path.parent.name)  # the day it was written
    assert json.loads(path.read_text())["timestamp"] == f"{day}T10:00:00"  # the original is kept
    [many] = store.write_many([_trace("odd2", day)])
    assert day not in _dirs(tmp_path) and valid_day(many.parent.name)
    assert {t.trace_id for t in store.iter_traces()} == {"odd", "odd2"} and store.problems == []
    assert store.get("odd").timestamp == f"{day}T10:00:00"


def test_a_store_with_impossible_and_foreign_folders_still_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = TraceStore(write_synthetic_store(tmp_path / "s", 20, n_tasks=4))
    for name in (*IMPOSSIBLE, "notes"):
        (store.root / name).mkdir()
        (store.root / name / "x.json").write_text(json.dumps(_trace("x").to_dict()))
    (store.root / "README").write_text("hello")
    assert len(list(store.iter_traces())) == 20
    assert sorted(p.path.name for p in store.problems) == sorted([*IMPOSSIBLE, "notes", "README"])
    assert all(p.path.name in p.message for p in store.problems)
    assert len(list(store.iter_traces(since="2026-01-01", until="2026-12-31"))) == 20
    assert store.count() == 20 and store.find("x") is None

    assert main(["traces", "ls", "--store", str(store.root)]) == 0
    captured = capsys.readouterr()
    assert "20 traces" in captured.out and "2026-13-45" in captured.err
    out = tmp_path / "ds"
    assert main(["build-dataset", "-m", "kto", "--out", str(out), "--store", str(store.root), "-q"]) == 0
    assert "2024-02-30" in capsys.readouterr().err
    metrics = store_metrics(store)
    assert metrics.traces == 20 and len(metrics.unreadable) == 5


def test_filters_on_a_trace_with_an_impossible_date_do_not_crash() -> None:
    assert TraceFilter().day_ok("2026-13-45")  # DatasetPipeline filters traces given in memory by their own date
    assert not TraceFilter(since=date(2026, 1, 1)).day_ok("2026-13-45")


# -- files without a trace_id ----------------------------------------------------------------------
class _Half(Reward):
    name = "half"

    def score_batch(self, traces: Any) -> list[RewardResult]:
        return [RewardResult(0.5) for _ in traces]


def test_a_file_without_trace_id_is_known_by_its_file_name(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    day = tmp_path / "2026-11-21"
    day.mkdir()
    (day / "noid.json").write_text("{}")
    first, second = list(store.iter_traces()), list(store.iter_traces())
    assert [t.trace_id for t in first] == [t.trace_id for t in second] == ["noid"]
    assert store.get("noid").trace_id == "noid"
    engine = RewardEngine({"half": _Half()}, {"half": 1.0})
    for _ in range(3):  # `flowrl score` rewrites the same file, never a new copy
        summary = score_store(store, engine, rescore_all=True, workers=1)
        assert summary.failed == 0 and summary.problems == []
        assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json")) == ["2026-11-21/noid.json"]
    stored = json.loads((day / "noid.json").read_text())
    assert stored["trace_id"] == "noid" and stored["rewards"] == {"half": 0.5}


def test_a_file_without_trace_id_and_an_unusable_name_is_skipped_and_counted(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    day = tmp_path / "2026-11-21"
    day.mkdir()
    (day / "no id here.json").write_text("{}")
    assert list(store.iter_traces()) == []
    [problem] = store.problems
    assert problem.path.name == "no id here.json" and "trace_id" in problem.message
    with pytest.raises(SchemaError, match="trace_id"):
        store.read_path(day / "no id here.json")


# -- FIFOs and other non-regular files ------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_json_is_skipped_never_opened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = TraceStore(tmp_path / "s")
    store.write(_trace("good"))
    fifo = store.root / "2026-11-21" / "pipe.json"
    os.mkfifo(fifo)
    (store.root / "2026-11-21" / "dir.json").mkdir()
    try:

        def listing() -> tuple[list[str], list[str]]:  # problems are per thread: read them in the same one
            return [t.trace_id for t in store.iter_traces()], sorted(p.path.name for p in store.problems)

        assert _within(10, listing) == (["good"], ["dir.json", "pipe.json"])
        assert _within(10, lambda: main(["traces", "ls", "--store", str(store.root)])) == 0
        assert "pipe.json" in capsys.readouterr().err
        with pytest.raises(SchemaError, match="not a regular file"):
            _within(10, lambda: store.read_path(fifo))
        assert _within(10, lambda: store.find("pipe")) is None
        assert _within(10, lambda: store.count()) == 1
    finally:
        _release(fifo)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_ingest_into_a_store_holding_a_fifo_does_not_hang(tmp_path: Path) -> None:
    from flowrl.ingest import ingest_paths

    store = TraceStore(tmp_path / "s")
    store.write(_trace("good"))
    fifo = store.root / "2026-11-21" / "pipe.json"
    os.mkfifo(fifo)
    source = tmp_path / "src" / "2026-11-22"
    source.mkdir(parents=True)
    (source / "new.json").write_text(json.dumps(_trace("new", "2026-11-22").to_dict()))
    try:
        summary = _within(30, lambda: ingest_paths([tmp_path / "src"], store))
        assert summary.new == 1 and store.exists("new")
    finally:
        _release(fifo)


# -- symbolic links ----------------------------------------------------------------------------------
def _outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    return out


def test_a_symlinked_day_folder_never_takes_a_write_out_of_the_root(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    store = TraceStore(tmp_path / "s")
    store.root.mkdir()
    (store.root / "2026-11-21").symlink_to(outside, target_is_directory=True)
    path = store.write(_trace("a"))
    store.write_many([_trace("b"), _trace("c", "2026-11-22")])
    (store.root / "2026-11-22").rename(store.root / "moved")
    (store.root / "2026-11-22").symlink_to(outside, target_is_directory=True)
    store.write_many([_trace("d", "2026-11-22")])
    assert list(outside.iterdir()) == []
    assert path == store.root / "2026-11-21" / "a.json" and path.is_file()
    for day in ("2026-11-21", "2026-11-22"):
        assert not (store.root / day).is_symlink() and (store.root / day).is_dir()
    assert {t.trace_id for t in store.iter_traces()} == {"a", "b", "d"}


def test_a_symlinked_staging_folder_never_takes_a_write_out_of_the_root(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    store = TraceStore(tmp_path / "s")
    store.root.mkdir()
    (store.root / ".staging").symlink_to(outside, target_is_directory=True)
    store.write(_trace("a"))
    (store.root / ".staging").rmdir()
    (store.root / ".staging").symlink_to(outside, target_is_directory=True)
    store.write_many([_trace("b")])
    (store.root / ".staging").rmdir()
    (store.root / ".staging").symlink_to(outside, target_is_directory=True)
    store.label("a", True, "fine")
    assert list(outside.iterdir()) == []
    assert not store.staging.is_symlink() and store.get("a").label is True
    assert {t.trace_id for t in store.iter_traces()} == {"a", "b"}


def test_reading_never_follows_a_link_out_of_the_root(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    (outside / "secret.json").write_text(json.dumps(_trace("secret").to_dict()))
    store = TraceStore(tmp_path / "s")
    store.write(_trace("good"))
    (store.root / "2026-11-20").symlink_to(outside, target_is_directory=True)
    (store.root / "2026-11-21" / "linked.json").symlink_to(outside / "secret.json")
    assert [t.trace_id for t in store.iter_traces()] == ["good"]
    assert sorted(p.path.name for p in store.problems) == ["2026-11-20", "linked.json"]
    assert store.find("secret") is None and store.find("linked") is None
    with pytest.raises(SchemaError):
        store.read_path(store.root / "2026-11-21" / "linked.json")


def test_a_file_where_a_day_folder_should_be_is_a_clear_error(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "s")
    store.root.mkdir()
    (store.root / "2026-11-21").write_text("not a folder")
    with pytest.raises(StoreError, match="2026-11-21"):
        store.write(_trace("a"))
    assert (store.root / "2026-11-21").read_text() == "not a folder"


# -- staging ------------------------------------------------------------------------------------------
def _staged(store: TraceStore, name: str, age_s: float) -> Path:
    store.staging.mkdir(parents=True, exist_ok=True)
    path = store.staging / name
    path.write_text("{")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_stale_staging_files_are_cleaned_and_fresh_ones_kept(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    old = _staged(store, ".a.json.x1.tmp", STALE_STAGING_S + 60)
    fresh = _staged(store, ".b.json.x2.tmp", 5)  # a writer in another process may be about to rename it
    foreign = _staged(store, "keep.me", STALE_STAGING_S + 60)
    TraceStore(tmp_path)  # opening the store cleans
    assert not old.exists() and fresh.exists() and foreign.exists()
    old = _staged(store, ".c.json.x3.tmp", STALE_STAGING_S + 60)
    store._next_clean = 0.0  # a long-running writer cleans again once the interval has passed
    store.write(_trace("a"))
    assert not old.exists() and fresh.exists()


def test_a_failing_write_many_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TraceStore(tmp_path)
    bad = _trace("ok")
    bad.trace_id = "../escape"
    with pytest.raises(StoreError, match="invalid trace id"):
        store.write_many([_trace("t1"), bad, _trace("t3")])
    assert not store.staging.exists() or list(store.staging.iterdir()) == []
    assert not list(tmp_path.rglob("*.json"))

    import flowrl.store.files as store_module

    real = store_module.dumps
    calls = {"n": 0}

    def dumps(trace: Any) -> bytes:
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("cannot serialise")
        return real(trace)

    monkeypatch.setattr(store_module, "dumps", dumps)
    with pytest.raises(ValueError):
        store.write_many([_trace(f"u{i}") for i in range(4)])
    assert list(store.staging.iterdir()) == []
    assert not list(tmp_path.rglob("*.json"))


# -- directory fsync --------------------------------------------------------------------------------
def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Record renames and fsyncs (of folders: their inode) in order."""
    import flowrl.store.index as store_index

    events: list[tuple[str, Any]] = []
    real_fsync, real_replace, real_syncfs = os.fsync, os.replace, store_index._syncfs

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync-file", st.st_ino))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        real_replace(src, dst, **kw)
        events.append(("replace", os.fspath(dst)))

    def syncfs(fd: Any) -> None:
        events.append(("syncfs", None))
        real_syncfs(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(store_index, "_syncfs", syncfs)
    return events


def test_write_fsyncs_the_day_folder_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TraceStore(tmp_path)
    store.write(_trace("first"))
    events = _record(monkeypatch)
    store.write(_trace("a"))
    day = os.stat(tmp_path / "2026-11-21").st_ino
    kinds = [e[0] for e in events]
    assert kinds.index("fsync-file") < kinds.index("replace") < events.index(("fsync-dir", day))
    events.clear()
    store.write(_trace("b", "2026-11-22"))  # a new day folder: its entry in the root is synced too
    assert ("fsync-dir", os.stat(tmp_path / "2026-11-22").st_ino) in events
    assert ("fsync-dir", os.stat(tmp_path).st_ino) in events
    events.clear()
    store.label("a", True)
    assert events[-1] == ("fsync-dir", day)


def test_write_many_syncs_once_and_fsyncs_each_folder_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TraceStore(tmp_path)
    events = _record(monkeypatch)
    store.write_many([_trace(f"t{i}", f"2026-11-2{i % 2}") for i in range(10)])
    kinds = [e[0] for e in events]
    assert kinds.count("syncfs") == 1 and kinds.count("fsync-file") == 0 and kinds.count("replace") == 10
    dir_syncs = [e[1] for e in events if e[0] == "fsync-dir"]
    days = {os.stat(tmp_path / d).st_ino for d in ("2026-11-20", "2026-11-21")}
    assert sorted(dir_syncs) == sorted([*days, os.stat(tmp_path).st_ino])  # each touched folder once, plus the root
    last_replace = max(i for i, k in enumerate(kinds) if k == "replace")
    assert all(i > last_replace for i, k in enumerate(kinds) if k == "fsync-dir")
