"""Fault injection: whatever goes wrong inside flowrl, the host's run returns its normal answer."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import flowrl.store.files
from flowrl.capture import hook_into_agent
from flowrl.trace.redact import MASK_FAILED
from tests.fakes import flushed, stored
from tests.fakes.fake_flowagent import make_agent, tc, turn

ROOT = Path(__file__).resolve().parents[1]


def run_once(agent, query: str = "Weather in Lyon?", session: str = "f") -> str:
    agent.router.script(
        query.removesuffix(" #new-ctx"),
        [
            turn(tc(1, "get_weather", {"city": "Lyon"})),
            turn(tc(2, "final_answer", {"answer": "Lyon: 21C", "success": True})),
        ],
    )
    return asyncio.run(agent.a_run(query, session_id=session, persist_blocking=True))


def test_mask_that_raises_masks_whole_value_and_run_returns_normally(tmp_path) -> None:
    def bad_mask(text: str) -> str:
        raise RuntimeError("mask bug")

    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path, mask=bad_mask) as hook:
        assert run_once(agent) == "Lyon: 21C"
        (trace,) = flushed(hook)
        assert hook.stats.mask_failures > 0
    assert trace["user_query"] == MASK_FAILED and trace["final_response"] == MASK_FAILED
    assert trace["tool_calls"][0]["result"] == MASK_FAILED
    assert b"Lyon" not in b"".join(p.read_bytes() for p in tmp_path.rglob("*.json"))


@pytest.mark.parametrize("io_threads", [0, 2])
def test_full_queue_drops_and_counts_never_blocks(tmp_path, monkeypatch, io_threads: int) -> None:
    release = threading.Event()
    real_write = flowrl.store.TraceStore.write

    real_many = flowrl.store.TraceStore.write_many

    def stuck_write(self, trace):
        release.wait(10)
        return real_write(self, trace)

    def stuck_many(self, traces):
        release.wait(10)
        return real_many(self, traces)

    monkeypatch.setattr(flowrl.store.TraceStore, "write", stuck_write)
    monkeypatch.setattr(flowrl.store.TraceStore, "write_many", stuck_many)
    agent = make_agent()
    hook = hook_into_agent(agent, store=tmp_path, queue_size=1, io_threads=io_threads)
    runs = 14
    # what can be in flight while the store hangs: the queue, the writer's hand, the I/O hand-off and threads
    in_flight = 1 + 1 + (3 * io_threads if io_threads else 0)
    try:
        started = time.perf_counter()
        answers = [run_once(agent, f"Q{i} #new-ctx") for i in range(runs)]
        elapsed = time.perf_counter() - started
        # the store is stuck; the agent is not: blocked on it, the runs would take 14 x 10 s (room for a loaded machine)
        assert answers == ["Lyon: 21C"] * runs and elapsed < 60
        assert hook.stats.captured == runs
        assert hook.stats.dropped >= runs - in_flight
        assert hook.flush(timeout=0.05) is False  # cannot finish while the store hangs
        release.set()
        assert hook.flush(timeout=10) is True
        assert hook.stats.written == runs - hook.stats.dropped == len(stored(tmp_path))
    finally:
        release.set()
        hook.unhook()


def _refuses_writes(path: Path) -> bool:
    probe = path / ".probe"
    try:
        probe.write_text("x")
    except OSError:
        return True
    probe.unlink()
    return False


def test_read_only_store_counts_write_errors(tmp_path) -> None:
    store = tmp_path / "ro"
    store.mkdir()
    store.chmod(0o500)
    try:
        if not _refuses_writes(store):
            pytest.skip("running as root: a read-only folder does not refuse writes here (see the next test)")
        agent = make_agent()
        with hook_into_agent(agent, store=store) as hook:
            assert run_once(agent) == "Lyon: 21C"
            assert hook.flush(timeout=10) is False
            assert hook.stats.write_errors == 1 and hook.stats.written == 0 and hook.stats.errors == 1
    finally:
        store.chmod(0o700)


def test_unwritable_store_path_counts_write_errors(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    agent = make_agent()
    with hook_into_agent(agent, store=blocker / "traces") as hook:  # cannot be created, even by root
        assert run_once(agent) == "Lyon: 21C"
        assert run_once(agent, "Again #new-ctx") == "Lyon: 21C"
        assert hook.flush(timeout=10) is False
        assert hook.stats.write_errors == 2 and hook.stats.written == 0
    assert blocker.read_text() == "not a folder"


def test_disk_full_counts_write_errors(tmp_path, monkeypatch) -> None:
    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(flowrl.store.files, "atomic_write_bytes", no_space)
    monkeypatch.setattr(flowrl.store.TraceStore, "write_many", no_space)
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        assert run_once(agent) == "Lyon: 21C"
        assert hook.flush(timeout=10) is False
        assert hook.stats.write_errors == 1


def _pile_up(agent, hook, monkeypatch, n: int) -> None:
    """Run `n` runs while the writer is stuck in its first write, so they pile up; then let it go."""
    first = threading.Event()
    real_write = flowrl.store.TraceStore.write

    def slow_first_write(self, trace):
        first.wait(10)
        return real_write(self, trace)

    monkeypatch.setattr(flowrl.store.TraceStore, "write", slow_first_write)
    run_once(agent, "Q0")
    time.sleep(0.2)  # the writer is now stuck in the first write
    for i in range(1, n):
        run_once(agent, f"Q{i} #new-ctx")
    first.set()
    assert hook.flush(10) is True


def test_a_backlog_is_written_in_one_batch(tmp_path, monkeypatch) -> None:
    """Runs that pile up while the disk is busy go to TraceStore.write_many (one filesystem sync)."""
    real_many = flowrl.store.TraceStore.write_many
    batches: list[int] = []

    def spy_many(self, traces):
        batches.append(len(traces))
        return real_many(self, traces)

    monkeypatch.setattr(flowrl.store.TraceStore, "write_many", spy_many)
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path, io_threads=0) as hook:
        _pile_up(agent, hook, monkeypatch, 9)
        assert hook.stats.written == 9 == len(stored(tmp_path))
    assert batches and max(batches) >= 2 and sum(batches) == 8


def test_a_failing_batch_is_retried_one_trace_at_a_time(tmp_path, monkeypatch) -> None:
    def broken_many(self, traces):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(flowrl.store.TraceStore, "write_many", broken_many)
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path, io_threads=0) as hook:
        _pile_up(agent, hook, monkeypatch, 6)
        assert hook.stats.written == 6 == len(stored(tmp_path)) and hook.stats.errors == 0


def test_store_path_that_does_not_exist_is_created(tmp_path) -> None:
    target = tmp_path / "not" / "yet" / "there"
    agent = make_agent()
    with hook_into_agent(agent, store=str(target)) as hook:
        assert run_once(agent) == "Lyon: 21C"
        assert len(flushed(hook)) == 1
    assert len(list(target.glob("*/*.json"))) == 1


def test_failing_capture_step_is_counted_not_raised(tmp_path, monkeypatch) -> None:
    import flowrl.capture.flowagent as fa

    def broken(*_a, **_k):
        raise RuntimeError("adapter bug")

    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        monkeypatch.setattr(fa, "_fill_from_ctx", broken)
        assert run_once(agent) == "Lyon: 21C"
        (trace,) = flushed(hook)  # the run is still written, with what could be read
        assert hook.stats.capture_errors == 1 and hook.stats.errors == 1
        assert trace["final_response"] == "Lyon: 21C"


def test_failing_trace_build_is_counted(tmp_path, monkeypatch) -> None:
    import flowrl.capture.assemble as assemble

    monkeypatch.setattr(assemble, "_llm_call", lambda ev: 1 / 0)
    agent = make_agent()
    with hook_into_agent(agent, store=tmp_path) as hook:
        assert run_once(agent) == "Lyon: 21C"
        assert hook.flush(timeout=10) is False
        assert hook.stats.build_errors == 1 and hook.stats.written == 0


def test_runs_after_unhook_are_not_written(tmp_path) -> None:
    agent = make_agent()
    hook = hook_into_agent(agent, store=tmp_path)
    hook.unhook()
    assert run_once(agent) == "Lyon: 21C"
    assert stored(tmp_path) == [] and hook.stats.captured == 0


SCRIPT = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, {root!r})
    from flowrl.capture import hook_into_agent
    from tests.fakes.fake_flowagent import make_agent, tc, turn

    agent = make_agent()
    hook = hook_into_agent(agent, store={store!r})

    def run(query, session):
        agent.router.script(query.removesuffix(" #new-ctx"), [turn(tc(1, "get_weather", {{"city": "Lyon"}})),
                                    turn(tc(2, "final_answer", {{"answer": "Lyon: 21C", "success": True}}))])
        return asyncio.run(agent.a_run(query, session_id=session, persist_blocking=True))

    {body}
""")


def _python(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(root=str(ROOT), store=str(tmp_path / "store"), body=textwrap.dedent(body).strip())
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FLOWRL_HOME": str(tmp_path / "home")},
    )


def test_process_exit_writes_what_is_queued(tmp_path) -> None:
    proc = _python(
        tmp_path,
        """
        print(run("Before exit", "x"))
        # no flush, no unhook: the atexit handler writes it
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "Lyon: 21C"
    assert [t["user_query"] for t in stored(tmp_path / "store")] == ["Before exit"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_writes_its_own_traces(tmp_path) -> None:
    proc = _python(
        tmp_path,
        """
        run("Parent before fork", "p")
        assert hook.flush(10)
        pid = os.fork()
        if pid == 0:
            ok = run("Child run #new-ctx", "c") == "Lyon: 21C" and hook.flush(10) and hook.stats.written >= 1
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        run("Parent after fork #new-ctx", "p")
        assert hook.flush(10)
        print("child exit", os.waitstatus_to_exitcode(status))
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "child exit 0" in proc.stdout
    queries = sorted(t["user_query"] for t in stored(tmp_path / "store"))
    assert queries == ["Child run #new-ctx", "Parent after fork #new-ctx", "Parent before fork"]
