"""`flowrl watch`: files written while watching are ingested once, within two seconds, and never twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flowrl.ingest.watch import STATE_NAME, Watcher
from flowrl.store.files import TraceStore
from tests.fakes import flowagent_files as samples

AGENT = "agent"
PICKUP_S = 2.0


def _queries(store: TraceStore) -> list[str]:
    return sorted(t.user_query for t in store.iter_traces())


def _wait_for(store: TraceStore, query: str, timeout: float = PICKUP_S) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if query in _queries(store):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"{query!r} not ingested within {timeout} s; store has {_queries(store)}")


class Running:
    def __init__(self, root: Path, store: TraceStore) -> None:
        self.watcher = Watcher([root], store, debounce=0.3, rescan_interval=60.0)
        self.stop = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(target=self.watcher.run, args=(self.stop,), kwargs={"ready": ready}, daemon=True)
        self.thread.start()
        assert ready.wait(10), "the watcher did not start"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the watcher did not stop"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for d in (tmp_path / "data" / "Agents" / "checkpoint" / AGENT, tmp_path / "data" / "Agents" / AGENT / "obs"):
        d.mkdir(parents=True)
    return tmp_path / "data"


def _cp_dir(root: Path) -> Path:
    return root / "Agents" / "checkpoint" / AGENT


def _obs_dir(root: Path) -> Path:
    return root / "Agents" / AGENT / "obs"


def _checkpoint_bytes(turns: list[tuple[str, str, str]]) -> bytes:
    history: list[dict] = []
    for q, a, run_id in turns:
        history += samples.turn(q, a, run_id)
    return samples.dumps(samples.v2_checkpoint(AGENT, {"s": history}))


def test_watch_picks_up_new_files_once_and_survives_a_restart(root: Path, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    w = Running(root, store)
    try:
        # 1. an obs run file written in place (FlowAgent's plain open/write/close)
        run = samples.obs_run("0b500001", AGENT, "s", "first question", "first answer")
        (_obs_dir(root) / "run_0b500001.json").write_text(json.dumps(run))
        assert _wait_for(store, "first question") < PICKUP_S

        # 2. a checkpoint written half, left open past the debounce, then completed: never read half
        data = _checkpoint_bytes(
            [("first question", "first answer", "0b500001"), ("second question", "second answer", "0b500002")]
        )
        path = _cp_dir(root) / "agent_checkpoint_20261122_100000.pkl"
        with open(path, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            time.sleep(0.5)
            fh.write(data[len(data) // 2 :])
        assert _wait_for(store, "second question") < PICKUP_S

        # 3. a run file written to a temp name and renamed into place
        run = samples.obs_run("0b500003", AGENT, "s", "third question", "third answer")
        tmp = _obs_dir(root) / ".run_0b500003.json.tmp"
        tmp.write_text(json.dumps(run))
        os.replace(tmp, _obs_dir(root) / "run_0b500003.json")
        assert _wait_for(store, "third question") < PICKUP_S

        # 4. the next snapshot repeats every turn: nothing is written twice
        path2 = _cp_dir(root) / "agent_checkpoint_20261122_100100.pkl"
        path2.write_bytes(
            _checkpoint_bytes(
                [
                    ("first question", "first answer", "0b500001"),
                    ("second question", "second answer", "0b500002"),
                    ("third question", "third answer", "0b500003"),
                ]
            )
        )
        time.sleep(1.0)
    finally:
        w.close()
    assert _queries(store) == ["first question", "second question", "third question"]
    assert w.watcher.summary.rejected_count == 0, w.watcher.summary.rejected
    assert (store.root / STATE_NAME).is_file()

    # 5. restart: nothing is read again
    again = Watcher([root], store, debounce=0.3).run_once()
    assert (again.files_read, again.new) == (0, 0)

    # 6. a file written while no watcher ran is not missed
    (_obs_dir(root) / "run_0b500004.json").write_text(
        json.dumps(samples.obs_run("0b500004", AGENT, "s", "fourth", "4"))
    )
    w = Running(root, store)
    try:
        assert _wait_for(store, "fourth") < PICKUP_S
    finally:
        w.close()
    assert w.watcher.summary.new == 1 and store.count() == 4


def test_a_second_watcher_on_the_same_store_is_refused(root: Path, tmp_path: Path) -> None:
    from flowrl.errors import IngestError

    store = TraceStore(tmp_path / "store")
    w = Running(root, store)
    try:
        with pytest.raises(IngestError, match="already using the store"):
            Watcher([root], store).run_once()
    finally:
        w.close()


def test_touched_but_unchanged_file_is_not_read_again(root: Path, tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    path = _cp_dir(root) / "agent_checkpoint_20261122_100000.pkl"
    path.write_bytes(_checkpoint_bytes([("q", "a", "0c000001")]))
    old = time.time() - 60
    os.utime(path, (old, old))
    assert Watcher([root], store).run_once().new == 1
    os.utime(path, (old + 1, old + 1))
    second = Watcher([root], store).run_once()
    assert (second.files_read, second.new) == (0, 0)


def test_ctrl_c_stops_the_watch_command_cleanly(root: Path, tmp_path: Path) -> None:
    code = "import sys; from flowrl.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "watch", str(root), "--store", str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        lock = tmp_path / "store" / ".flowrl-watch.lock"
        while not lock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "watch stopped" in out


@pytest.mark.parametrize("where", ["folder", "url"])
def test_watch_once_into_a_segment_store_remembers_what_it_read(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from flowrl.ingest.watch import watch_home
    from flowrl.store.segments import SegmentStore

    monkeypatch.setenv("FLOWRL_HOME", str(tmp_path / "home"))
    spec = str(tmp_path / "segs") if where == "folder" else f"memory://flowrl-watch-{tmp_path.name}"
    store = SegmentStore(spec, writer_id="watch", flush_seconds=3600)  # only the watcher's flush puts a segment
    path = _cp_dir(root) / "agent_checkpoint_20261122_100000.pkl"
    path.write_bytes(_checkpoint_bytes([("q1", "a1", "0c000001"), ("q2", "a2", "0c000002")]))
    old = time.time() - 60
    os.utime(path, (old, old))
    assert Watcher([root], store).run_once().new == 2
    home = watch_home(store)
    assert (home / STATE_NAME).is_file()
    assert home == (tmp_path / "segs" if where == "folder" else tmp_path / "home" / "traces" / ".watch" / home.name)
    reader = SegmentStore(spec, writer_id="reader")  # the traces were put before the state named the file
    assert sorted(t.user_query for t in reader.iter_traces()) == ["q1", "q2"]
    again = Watcher([root], store).run_once()
    assert (again.files_read, again.new) == (0, 0)


def test_a_lock_file_planted_as_a_link_is_not_followed_out_of_the_store(root: Path, tmp_path: Path) -> None:
    """Issue 39: a `.flowrl-watch.lock` symlink to a path outside the store made `flowrl watch` create its target."""
    from flowrl.ingest.watch import LOCK_NAME

    store = TraceStore(tmp_path / "store")
    store.root.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside" / "planted"
    outside.parent.mkdir()
    (store.root / LOCK_NAME).symlink_to(outside)
    Watcher([root], store).run_once()
    assert not outside.exists()
    assert not (store.root / LOCK_NAME).is_symlink()
