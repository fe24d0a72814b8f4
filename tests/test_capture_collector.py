"""One collector per store per process: hooks are thin registrations on it."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import threading
import time
import weakref

import pytest

import flowrl.store.files
from flowrl import autohook
from flowrl.capture import hook_into_agent
from flowrl.capture.collector import DEFAULT_IO_THREADS, shared_collectors, store_key
from flowrl.errors import ConfigError
from flowrl.store.files import TraceStore
from tests.fakes import flushed, stored


class EchoAgent:
    def __init__(self, name: str = "echo") -> None:
        self.name = name

    async def a_run(self, query: str) -> str:
        return await self.call_tool("echo", text=query)

    async def call_tool(self, tool: str, **kw: str) -> str:
        return kw["text"].upper()


def hook(agent: EchoAgent, store, **options):
    return hook_into_agent(agent, store=store, run_methods=["a_run"], tool_methods=["call_tool"], **options)


def run(agent: EchoAgent, query: str = "hello") -> str:
    return asyncio.run(agent.a_run(query))


def collector_of(store) -> object | None:
    key = store_key(TraceStore(store))
    return next((c for c in shared_collectors() if store_key(c.store) == key), None)


def wait_until(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("io_threads", [DEFAULT_IO_THREADS, 2])
def test_five_hooked_agents_cost_one_collectors_threads(tmp_path, io_threads: int) -> None:
    before = threading.active_count()
    agents = [EchoAgent(f"agent-{i}") for i in range(5)]
    hooks = [hook(a, tmp_path, io_threads=io_threads) for a in agents]
    try:
        assert [run(a, f"q{i}") for i, a in enumerate(agents)] == [f"Q{i}" for i in range(5)]
        for h in hooks:
            assert h.flush(10)
        added = threading.active_count() - before
        # one writer thread and its I/O threads for the store, not one set per hook (5 x 9 = 45 before)
        assert added <= 1 + io_threads, added
        assert len({id(h.collector) for h in hooks}) == 1 and hooks[0].collector.registrations == 5
        assert [h.stats.written for h in hooks] == [1] * 5  # each hook counts its own runs
        assert sorted(t["agent_name"] for t in stored(tmp_path)) == [f"agent-{i}" for i in range(5)]
    finally:
        for h in hooks:
            h.unhook()
    assert wait_until(lambda: threading.active_count() <= before), "the collector's threads did not stop"


def test_the_collector_runs_the_largest_io_threads_asked_for(tmp_path) -> None:
    a, b = EchoAgent("a"), EchoAgent("b")
    with hook(a, tmp_path, io_threads=0) as ha:
        run(a)
        assert ha.flush(10) and ha.collector._workers == []  # the writer writes itself
        with hook(b, tmp_path, io_threads=3) as hb:
            run(b), run(b, "again")  # the writer starts the extra I/O threads on its next round
            assert hb.flush(10)
            assert wait_until(lambda: sum(t.is_alive() for t in hb.collector._workers) == 3)
        workers = list(ha.collector._workers)
    assert not any(t.is_alive() for t in workers)  # the last unhook joined them
    assert len(stored(tmp_path)) == 3


def test_hooks_on_two_stores_get_a_collector_each(tmp_path) -> None:
    a, b = EchoAgent("a"), EchoAgent("b")
    with hook(a, tmp_path / "one") as ha, hook(b, tmp_path / "two") as hb:
        assert ha.collector is not hb.collector
        run(a), run(b)
        assert len(flushed(ha)) == 1 and len(flushed(hb)) == 1


def test_the_collector_outlives_all_but_the_last_hook(tmp_path) -> None:
    before = threading.active_count()
    first, second = EchoAgent("first"), EchoAgent("second")
    h1, h2 = hook(first, tmp_path), hook(second, str(tmp_path / "." / ""))  # the same folder, spelled otherwise
    assert h1.collector is h2.collector
    run(first)
    h1.unhook()
    assert not h2.collector.closed and collector_of(tmp_path) is h2.collector
    assert run(second, "still") == "STILL" and h2.flush(10)
    h2.unhook()
    assert h2.collector.closed and collector_of(tmp_path) is None
    assert wait_until(lambda: threading.active_count() <= before)
    assert sorted(t["final_response"] for t in stored(tmp_path)) == ["HELLO", "STILL"]
    with hook(first, tmp_path) as again:  # the next hook on that store makes a new collector
        assert again.collector is not h1.collector
        run(first, "again")
        assert len(flushed(again)) == 3


def test_each_hook_keeps_its_own_options_on_a_shared_collector(tmp_path) -> None:
    a, b = EchoAgent("a"), EchoAgent("b")
    with (
        hook(a, tmp_path, metadata={"team": "A"}, mask=lambda s: s.replace("secret", "[A]")) as ha,
        hook(b, tmp_path, metadata={"team": "B"}, redact=False) as hb,
    ):
        assert ha.collector is hb.collector
        run(a, "a secret"), run(b, "b secret")
        assert ha.flush(10) and hb.flush(10)
        assert (ha.stats.written, hb.stats.written) == (1, 1)
    traces = {t["metadata"]["team"]: t for t in stored(tmp_path)}
    assert traces["A"]["user_query"] == "a [A]" and traces["B"]["user_query"] == "b secret"


def test_rehook_with_another_store_raises_and_keeps_the_first(tmp_path) -> None:
    agent = EchoAgent()
    first = hook(agent, tmp_path / "first")
    try:
        with pytest.raises(ConfigError, match=r"already hooked.*store .*elsewhere.*unhook\(\)"):
            hook(agent, tmp_path / "elsewhere")
        with pytest.raises(ConfigError, match="metadata"):
            hook(agent, tmp_path / "first", metadata={"other": 1})
        assert hook(agent, tmp_path / "first") is first  # the same options: the same Hook
        assert hook_into_agent(agent) is first  # no options: asks for nothing, gets the Hook
        assert first.active and run(agent) == "HELLO"
        assert len(flushed(first)) == 1
    finally:
        first.unhook()
    assert not (tmp_path / "elsewhere").exists()
    with hook(agent, tmp_path / "elsewhere") as second:  # after unhook(), other options are fine
        run(agent)
        assert len(flushed(second)) == 1


def test_unhook_releases_the_hook(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWRL_STORE", str(tmp_path))
    monkeypatch.setenv("FLOWRL_AUTOHOOK_RUN_METHODS", "a_run")
    monkeypatch.setenv("FLOWRL_AUTOHOOK_TOOL_METHODS", "call_tool")
    agent = EchoAgent()
    autohook._hook_instance(agent)  # what the post-import hook does for each new instance
    (h,) = [h for h in autohook.hooks if h.store.root == tmp_path]
    run(agent)
    h.unhook()
    ref = weakref.ref(h)
    del h
    gc.collect()
    assert ref() is None, gc.get_referrers(ref())
    assert not [h for h in autohook.hooks if h.store.root == tmp_path]
    assert collector_of(tmp_path) is None and len(stored(tmp_path)) == 1


def test_agent_collected_without_unhook_lets_go_of_the_collector(tmp_path) -> None:
    before = threading.active_count()
    agent = EchoAgent()
    h = hook(agent, tmp_path)
    run(agent)
    collector = h.collector
    del agent
    gc.collect()
    assert not h.active
    assert wait_until(lambda: collector_of(tmp_path) is None and collector.closed)
    assert wait_until(lambda: threading.active_count() <= before)
    assert len(stored(tmp_path)) == 1 and h.stats.written == 1


def _pile_up(agents, hooks, monkeypatch, n: int) -> None:
    """Runs pile up while the writer is stuck in its first write; then it lets go."""
    first = threading.Event()
    real_write = flowrl.store.TraceStore.write

    def slow_first_write(self, trace):
        first.wait(10)
        return real_write(self, trace)

    monkeypatch.setattr(flowrl.store.TraceStore, "write", slow_first_write)
    run(agents[0], "q0")
    time.sleep(0.2)  # the writer is now stuck in the first write
    for i in range(1, n):
        run(agents[i % len(agents)], f"q{i}")
    first.set()
    for h in hooks:
        h.flush(10)


def test_a_failing_write_many_is_counted_and_logged_once(tmp_path, monkeypatch, caplog) -> None:
    def broken_many(self, traces):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(flowrl.store.TraceStore, "write_many", broken_many)
    agents = [EchoAgent("a"), EchoAgent("b")]
    hooks = [hook(a, tmp_path, io_threads=0) for a in agents]
    try:
        with caplog.at_level(logging.WARNING, logger="flowrl.capture"):
            _pile_up(agents, hooks, monkeypatch, 7)
            _pile_up(agents, hooks, monkeypatch, 7)
        for h in hooks:  # the batch's traces went one at a time and got written
            assert h.stats.batch_write_errors >= 1 and h.stats.errors == 0
        assert sum(h.stats.written for h in hooks) == 14 == len(stored(tmp_path))
        assert len([r for r in caplog.records if "at once" in r.getMessage()]) == 1
    finally:
        for h in hooks:
            h.unhook()


def test_a_store_that_refuses_every_write_is_counted_never_raised(tmp_path, monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(flowrl.store.files, "atomic_write_bytes", refuse)
    monkeypatch.setattr(flowrl.store.TraceStore, "write_many", refuse)
    agent = EchoAgent()
    with hook(agent, tmp_path, io_threads=0) as h:
        _pile_up([agent], [h], monkeypatch, 5)
        assert h.stats.written == 0 and h.stats.write_errors == 5 and h.stats.batch_write_errors >= 1


def test_each_hook_has_its_own_share_of_the_queue(tmp_path, monkeypatch) -> None:
    release = threading.Event()
    real_write = flowrl.store.TraceStore.write

    def stuck_write(self, trace):
        release.wait(10)
        return real_write(self, trace)

    monkeypatch.setattr(flowrl.store.TraceStore, "write", stuck_write)
    monkeypatch.setattr(
        flowrl.store.TraceStore, "write_many", lambda self, traces: [stuck_write(self, t) for t in traces]
    )
    noisy, quiet = EchoAgent("noisy"), EchoAgent("quiet")
    hn, hq = hook(noisy, tmp_path, queue_size=1, io_threads=0), hook(quiet, tmp_path, queue_size=1, io_threads=0)
    try:
        for i in range(6):
            run(noisy, f"n{i}")
        assert hn.stats.dropped >= 3
        run(quiet, "q")  # the noisy hook filled its own share, not the quiet one's
        assert hq.stats.dropped == 0
        release.set()
        assert hq.flush(10) and hq.stats.written == 1
    finally:
        release.set()
        hn.unhook()
        hq.unhook()
