"""Hostile values: whatever an agent passes, returns or raises, its run is still written with what could be read.

A value with no JSON form degrades on its own (a marked placeholder, see docs/capture.md "Values that have no
JSON form"); the rest of the trace is written. The writer survives anything a step raises, `flush()` never
hangs, and a 50 MB value costs the host's loop no copy of it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from flowrl.capture import TraceCollector, hook_into_agent
from flowrl.capture.assemble import build_trace
from flowrl.trace.redact import MASK_FAILED
from tests.fakes import flushed, stored
from tests.fakes.fake_flowagent import make_agent, tc, turn

BIG_INT_DIGITS = 5000


class Unprintable:
    """An object whose str() and repr() both raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _recursive_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def _recursive_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


_SOCKET = socket.socket()

# name -> (value, what the stored trace must show for it where it is kept as a value)
HOSTILE: dict[str, tuple[Any, str]] = {
    "lone_surrogate": ("a\ud800b", "a\ufffdb"),
    "int_over_str_limit": (10 ** (BIG_INT_DIGITS - 1), f"<unserialisable int: {BIG_INT_DIGITS} digits>"),
    "str_and_repr_raise": (Unprintable(), "<unserialisable Unprintable: "),
    "socket": (_SOCKET, "<unserialisable socket: <socket.socket"),
    "non_utf8_bytes": (b"\xff\xfe", "<unserialisable bytes: 2 bytes, not UTF-8>"),
    "tuple_key": ({(1, 2): "x"}, "<unserialisable tuple: (1, 2)>"),
    "none_key": ({None: "x"}, '"null"'),
    "recursive_list": (_recursive_list(), "<unserialisable list: contains itself>"),
    "recursive_dict": (_recursive_dict(), "<unserialisable dict: contains itself>"),
}

PLACEMENTS = ("tool_argument", "tool_result", "llm_input", "llm_output", "query", "answer", "exception", "metadata")


class HostileAgent:
    """Puts `value` in one place of a run; every other place holds an ordinary value."""

    def __init__(self, value: Any, where: str) -> None:
        self.value, self.where = value, where

    async def a_run(self, query: Any) -> Any:
        here = self.where
        await self.call_tool("search", {"q": "cats", "v": self.value} if here == "tool_argument" else {"q": "cats"})
        tools = [{"type": "function", "function": {"name": "search", "parameters": {"x": self.value}}}]
        await self.complete("summarise", model="m1", tools=tools if here == "llm_input" else None)
        if here == "exception":
            try:
                await self.explode()
            except ValueError:
                pass
        return self.value if here == "answer" else "the answer"

    async def call_tool(self, name: str, args: dict[str, Any]) -> Any:
        return self.value if self.where == "tool_result" else f"found {args['q']}"

    async def complete(self, prompt: str, model: str = "m", tools: Any = None) -> Any:
        return self.value if self.where == "llm_output" else "summary"

    async def explode(self) -> None:
        raise ValueError(self.value)


def _run_hostile(tmp_path: Path, value: Any, where: str) -> tuple[dict[str, Any], str, Any]:
    agent = HostileAgent(value, where)
    options = {"metadata": {"team": "a", "v": value}} if where == "metadata" else {}
    hook = hook_into_agent(
        agent,
        store=tmp_path,
        run_methods=["a_run"],
        tool_methods=["call_tool", "explode"],
        llm_methods=["complete"],
        **options,
    )
    try:
        answer = asyncio.run(agent.a_run(value if where == "query" else "cats please"))
        assert hook.flush(10), f"flush failed: {hook.stats}"
        traces = stored(hook.store)
        stats = hook.stats
    finally:
        hook.unhook()
    assert answer is (value if where == "answer" else answer)  # the host's value, untouched
    assert stats.written == 1 and stats.errors == 0, stats
    (trace,) = traces
    (path,) = tmp_path.rglob("*.json")
    return trace, path.read_text(encoding="utf-8"), stats


@pytest.mark.parametrize("where", PLACEMENTS)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_value_degrades_alone_and_the_run_is_written(tmp_path, name: str, where: str) -> None:
    value, shown = HOSTILE[name]
    trace, text, _stats = _run_hostile(tmp_path, value, where)
    json.loads(text)  # valid JSON, valid UTF-8
    # the ordinary values around it are all there
    assert [c["tool_name"] for c in trace["tool_calls"]][:1] == ["search"]
    assert trace["tool_calls"][0]["arguments"]["q"] == "cats"
    assert trace["llm_calls"][0]["model"] == "m1" and trace["llm_calls_count"] == 1
    if where != "answer":
        assert trace["final_response"] == "the answer"
    if where != "query":
        assert trace["user_query"] == "cats please"
    if where == "exception":
        (failed,) = [c for c in trace["tool_calls"] if c["tool_name"] == "explode"]
        assert failed["success"] is False and failed["error"].startswith("ValueError")
    # where it is kept as a value (not as text), it shows as documented
    if where == "tool_argument":
        assert shown in text and "v" in trace["tool_calls"][0]["arguments"]
    if where == "metadata":
        assert trace["metadata"]["team"] == "a" and shown in text
    if where == "llm_input":
        assert trace["tools"][0]["function"]["name"] == "search" and shown in text


@pytest.mark.parametrize("where", ["tool_result", "llm_output", "query", "answer", "exception"])
def test_text_placements_show_what_str_could_not_give(tmp_path, where: str) -> None:
    _trace, text, _ = _run_hostile(tmp_path, Unprintable(), where)
    assert "<unserialisable Unprintable: str() raised RuntimeError>" in text
    _trace, text, _ = _run_hostile(tmp_path / "int", 10 ** (BIG_INT_DIGITS - 1), where)
    assert f"<unserialisable int: {BIG_INT_DIGITS} digits>" in text


def test_an_exception_whose_str_raises_still_fails_its_call(tmp_path) -> None:
    trace, _text, _ = _run_hostile(tmp_path, Unprintable(), "exception")
    (failed,) = [c for c in trace["tool_calls"] if c["tool_name"] == "explode"]
    assert failed["success"] is False
    assert failed["error"] == "ValueError: <unserialisable Unprintable: str() raised RuntimeError>"


def test_an_exception_whose_own_str_raises_is_named(tmp_path) -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    class Agent:
        async def a_run(self, query: str) -> str:
            try:
                await self.tool()
            except Broken:
                pass
            raise Broken()

        async def tool(self) -> None:
            raise Broken()

    agent = Agent()
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], tool_methods=["tool"]) as hook:
        with pytest.raises(Broken):
            asyncio.run(agent.a_run("q"))
        (trace,) = flushed(hook)
        assert hook.stats.errors == 0, hook.stats
    marker = "Broken: <unserialisable Broken: str() raised RuntimeError>"
    assert trace["tool_calls"][0]["error"] == marker and trace["metadata"]["error"] == marker
    assert trace["success"] is False and trace["status"] == "error"


def test_big_but_printable_ints_are_written_as_their_digits(tmp_path) -> None:
    trace, _text, _ = _run_hostile(tmp_path, {"n": 2**70, "small": 7, "neg": -(2**64)}, "tool_argument")
    assert trace["tool_calls"][0]["arguments"]["v"] == {"n": str(2**70), "small": 7, "neg": str(-(2**64))}


def test_nesting_past_the_depth_limit_is_cut_there(tmp_path) -> None:
    deep: Any = "bottom"
    for _ in range(500):
        deep = [deep]
    _trace, text, _ = _run_hostile(tmp_path, deep, "tool_argument")
    assert "<unserialisable list: nested deeper than" in text


def test_objects_with_a_json_form_keep_it(tmp_path) -> None:
    import dataclasses
    import datetime
    import enum
    import uuid

    class Colour(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Point:
        x: int
        tags: set[str]

    value = {
        "when": datetime.date(2025, 1, 2),
        "id": uuid.UUID(int=1),
        "colour": Colour.RED,
        "point": Point(1, {"a"}),
        "raw": b"plain",
        "pair": (1, 2),
    }
    trace, _text, _ = _run_hostile(tmp_path, value, "tool_argument")
    assert trace["tool_calls"][0]["arguments"]["v"] == {
        "when": "2025-01-02",
        "id": str(uuid.UUID(int=1)),
        "colour": "red",
        "point": {"x": 1, "tags": ["a"]},
        "raw": "plain",
        "pair": [1, 2],
    }


def test_the_hosts_objects_are_only_read(tmp_path) -> None:
    tools = ({"type": "function", "function": {"name": n}} for n in ("a", "b"))  # a generator: never iterated

    class Agent:
        async def a_run(self, query: str) -> str:
            await self.complete("p", tools=tools)
            return "done"

        async def complete(self, prompt: str, tools: Any = None) -> str:
            return "ok"

    agent = Agent()
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], llm_methods=["complete"]) as hook:
        asyncio.run(agent.a_run("q"))
        (trace,) = flushed(hook)
    assert trace["tools"] == [] and [t["function"]["name"] for t in tools] == ["a", "b"]


def test_flowagent_run_with_a_lone_surrogate_is_written(tmp_path) -> None:
    agent = make_agent()
    agent.router.script(
        "Weather?",
        [
            turn(tc(1, "get_weather", {"city": "Ly\ud800on"})),
            turn(tc(2, "final_answer", {"answer": "done \ud800", "success": True})),
        ],
    )
    with hook_into_agent(agent, store=tmp_path) as hook:
        answer = asyncio.run(agent.a_run("Weather?", session_id="s", persist_blocking=True))
        (trace,) = flushed(hook)
        assert hook.stats.errors == 0, hook.stats
    assert answer == "done \ud800"
    assert trace["final_response"] == "done \ufffd"
    assert trace["tool_calls"][0]["arguments"] == {"city": "Ly\ufffdon"}


# -- the writer survives anything ----------------------------------------------------------------------


class _Record:
    def __init__(self, raise_this: BaseException | None = None, query: str = "q") -> None:
        self.raise_this, self.query = raise_this, query

    def build(self) -> dict[str, Any]:
        if self.raise_this is not None:
            raise self.raise_this
        return {"user_query": self.query, "final_response": "a"}


def _flush_or_hang(flush: Any, timeout: float = 20.0) -> Any:
    """Call `flush()` (without a timeout of its own) on a thread; fail instead of hanging the suite."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(flush()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "flush() hung"
    return box[0]


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), MemoryError()])
def test_writer_survives_a_base_exception_from_a_build(tmp_path, exc: BaseException) -> None:
    collector = TraceCollector(tmp_path, io_threads=0)
    try:
        assert collector.submit(_Record(exc))
        assert _flush_or_hang(collector.flush) is False  # that run failed
        assert collector.stats.build_errors == 1 and collector.stats.errors == 1
        for i in range(3):
            collector.submit(_Record(query=f"later {i}"))
        assert _flush_or_hang(collector.flush) is True
        assert collector.stats.written == 3
    finally:
        collector.close(5)
    assert sorted(t["user_query"] for t in stored(tmp_path)) == ["later 0", "later 1", "later 2"]


@pytest.mark.parametrize("io_threads", [0, 2])
def test_writer_survives_a_base_exception_from_on_trace(tmp_path, io_threads: int) -> None:
    calls: list[str] = []

    def on_trace(trace: Any) -> None:
        calls.append(trace.user_query)
        if trace.user_query == "run 0":
            raise SystemExit("on_trace said exit")

    agent = HostileAgent("x", "none")
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], on_trace=on_trace, io_threads=io_threads)
    try:
        for i in range(3):
            asyncio.run(agent.a_run(f"run {i}"))
        _flush_or_hang(hook.flush)
        assert hook.stats.written == 3 and hook.stats.errors == 1, hook.stats
    finally:
        hook.unhook()
    assert sorted(calls) == ["run 0", "run 1", "run 2"]


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_mask_that_raises_a_base_exception_loses_no_later_run(tmp_path, exc_type: type) -> None:
    def mask(text: str) -> str:
        if "boom" in text:
            raise exc_type()
        return text

    agent = HostileAgent("x", "none")
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool"], mask=mask)
    try:
        asyncio.run(agent.a_run("boom"))
        for i in range(3):
            asyncio.run(agent.a_run(f"later {i}"))
        _flush_or_hang(hook.flush)
        stats = hook.stats
    finally:
        hook.unhook()
    queries = sorted(t["user_query"] for t in stored(tmp_path))
    assert queries[-3:] == ["later 0", "later 1", "later 2"]
    # the first run is either masked whole (the mask's failure caught by the redactor) or counted as lost
    assert queries[:-3] == [MASK_FAILED] or (queries[:-3] == [] and stats.build_errors == 1 and stats.errors == 1)


def test_flush_does_not_hang_when_the_writer_thread_died(tmp_path, monkeypatch) -> None:
    collector = TraceCollector(tmp_path, io_threads=0)
    try:
        monkeypatch.setattr(collector, "_run", lambda: None)  # a writer thread that ends at once, without a word
        collector.submit(_Record(query="first"))
        collector._thread.join(5)
        assert not collector._thread.is_alive()
        monkeypatch.undo()
        collector.submit(_Record(query="second"))  # a new writer takes over and writes both
        assert _flush_or_hang(collector.flush) is True
    finally:
        collector.close(5)
    assert sorted(t["user_query"] for t in stored(tmp_path)) == ["first", "second"]


def test_flush_notices_a_writer_that_dies_while_it_waits(tmp_path, monkeypatch) -> None:
    collector = TraceCollector(tmp_path, io_threads=0)
    try:
        monkeypatch.setattr(collector, "_run", lambda: None)
        collector.submit(_Record(query="only"))
        monkeypatch.undo()
        assert _flush_or_hang(collector.flush) is True  # no later submit: flush itself starts a new writer
    finally:
        collector.close(5)
    assert [t["user_query"] for t in stored(tmp_path)] == ["only"]


# -- a 50 MB value: bounded work on the host, bounded values for the writer -----------------------------

BIG = 50_000_000
LIMIT = 65536
KEEP = LIMIT // 2 - 64


class BigAgent:
    def __init__(self, blob: str) -> None:
        self.blob = blob
        self.parts = (blob[: len(blob) // 2], blob[len(blob) // 2 :])
        self.peak = 0

    async def a_run(self, query: str) -> str:
        tracemalloc.reset_peak()  # (does nothing when tracemalloc is off)
        base = tracemalloc.get_traced_memory()[0]
        await self.call_tool("store", {"blob": self.blob})
        try:
            await self.explode()
        except ValueError:
            pass
        await self.complete("go")
        self.peak = tracemalloc.get_traced_memory()[1] - base
        return self.blob

    async def call_tool(self, name: str, args: dict[str, Any]) -> str:
        return self.blob

    async def explode(self) -> None:
        raise ValueError(self.blob)

    async def complete(self, prompt: str) -> str:
        return self.blob

    async def stream(self, query: str) -> Any:
        for part in self.parts:
            yield part


def _all_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_all_strings(k), *_all_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _all_strings(v)]
    return []


def test_a_50mb_value_is_not_copied_on_the_host(tmp_path) -> None:
    blob = "x" * BIG
    agent = BigAgent(blob)
    hook = hook_into_agent(
        agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool", "explode"], llm_methods=["complete"]
    )
    tracemalloc.start()
    try:
        asyncio.run(agent.a_run("q"))
    finally:
        tracemalloc.stop()
        assert hook.flush(60), hook.stats
        hook.unhook()
    assert agent.peak < 1_000_000, f"the host allocated {agent.peak} bytes while capturing a 50 MB value"


def test_a_streamed_50mb_answer_is_not_joined_on_the_host(tmp_path, monkeypatch) -> None:
    agent = BigAgent("y" * BIG)
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["stream"])
    peaks: list[int] = []
    real_finish = hook.finish

    def finish(rec: Any) -> None:  # the run's end, on the host, before the writer sees it
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        real_finish(rec)

    monkeypatch.setattr(hook, "finish", finish)

    async def consume() -> int:
        return sum([len(part) async for part in agent.stream("q")])

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert asyncio.run(consume()) == BIG
    finally:
        tracemalloc.stop()
    (trace,) = flushed(hook, 60)
    hook.unhook()
    assert peaks and peaks[0] < 1_000_000, peaks
    assert trace["final_response"] == "y" * KEEP + f"…[truncated {BIG - 2 * KEEP} chars]…" + "y" * KEEP


def test_a_50mb_value_reaches_the_writer_already_bounded(tmp_path) -> None:
    secret = "sk-" + "A1b2C3d4" * 6
    # a secret across each cut: whatever is kept of it must be masked, not a piece of it left
    blob = (
        "h" * (KEEP - 20)
        + " "
        + secret
        + " "
        + "m" * (BIG - 2 * KEEP - 2 * len(secret))
        + " "
        + secret
        + " "
        + "t" * (KEEP - 20)
    )
    seen: list[int] = []

    def mask(text: str) -> str:
        seen.append(len(text))
        return text

    agent = BigAgent(blob)
    hook = hook_into_agent(
        agent,
        store=tmp_path,
        run_methods=["a_run"],
        tool_methods=["call_tool", "explode"],
        llm_methods=["complete"],
        mask=mask,
    )
    records: list[Any] = []
    real_submit = hook.registration.submit
    hook.registration.submit = lambda rec: (  # type: ignore[method-assign]
        records.append(build_trace(rec)),
        real_submit(rec),
    )[1]
    try:
        asyncio.run(agent.a_run("q"))
        (trace,) = flushed(hook, 60)
        stats = hook.stats
    finally:
        hook.unhook()
    (built,) = records
    assert max(len(s) for s in _all_strings(built)) <= LIMIT
    assert seen and max(seen) <= LIMIT  # the mask never saw the whole value
    text = json.dumps(trace)
    for piece in {secret[i : i + 12] for i in range(len(secret) - 11)}:
        assert piece not in text
    assert stats.secrets_masked >= 2
    result = trace["tool_calls"][0]["result"]
    assert result.startswith("h" * (KEEP - 20) + " [REDACTED:openai_ke…[truncated")  # masked, then cut
    assert f"…[truncated {len(blob) - 2 * KEEP} chars]…EDACTED:openai_key] ttt" in result
    assert trace["tool_calls"][1]["error"].startswith("ValueError: hhhh")
    assert len(trace["tool_calls"][1]["error"]) <= LIMIT


def test_max_chars_bounds_values_without_redaction_and_none_keeps_them(tmp_path) -> None:
    blob = "z" * 200_000
    for options, kept in (({"redact": False}, False), ({"max_chars": None}, True)):
        store = tmp_path / str(len(options)) / ("r" if "redact" in options else "n")
        agent = BigAgent(blob)
        with hook_into_agent(agent, store=store, run_methods=["a_run"], tool_methods=["call_tool"], **options) as hook:
            asyncio.run(agent.a_run("q"))
            (trace,) = flushed(hook)
        assert (trace["final_response"] == blob) is kept
        assert len(trace["final_response"]) == (
            200_000 if kept else 2 * KEEP + len(f"…[truncated {200_000 - 2 * KEEP} chars]…")
        )
