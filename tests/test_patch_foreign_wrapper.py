"""Unhooking while another library's wrapper sits on top of flowrl's class patch.

A host (or an APM/tracing library) may wrap the same method after `hook_into_agent` patched it. On unhook
flowrl must stop capturing for good, leave the other wrapper working and the method's behaviour intact, and
say once (a log line and `_patch.left_in_place()`) what it could not take out, never raising into the host.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import pytest
import wrapt

from flowrl.capture import _patch, hook_into_agent
from tests.fakes import flushed, stored

LEFT = "could not be taken out"


def make_agent_class() -> type:
    """A fresh class per test: patches on one never leak into another."""

    class Agent:
        name = "foreign"

        def run(self, query: str) -> str:
            return f"answer to {query}"

    return Agent


def wrap_with_wrapt(cls: type, calls: list[str]) -> None:
    def outer(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        calls.append("wrapt")
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(cls, "run", outer)


def wrap_with_wrapt_over_bound(cls: type, calls: list[str]) -> None:
    """A FunctionWrapper around `cls.run` as read from the class (flowrl's patch bound to the class)."""

    def outer(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        calls.append("wrapt")
        return wrapped(*args, **kwargs)

    cls.run = wrapt.FunctionWrapper(cls.run, outer)


def wrap_with_functools(cls: type, calls: list[str]) -> None:
    inner = cls.run

    @functools.wraps(inner)
    def outer(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("functools")
        return inner(self, *args, **kwargs)

    cls.run = outer


def left_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "flowrl.capture" and LEFT in r.getMessage()]


def count_handler_calls(hook: Any) -> list[int]:
    """Count how often flowrl dispatches a run of `hook`'s agent to its handler."""
    seen: list[int] = []
    key = (None, "run")
    handler = hook.handlers[key]

    def counting(*args: Any) -> Any:
        seen.append(1)
        return handler(*args)

    hook.handlers[key] = counting
    return seen


def hook_wrap_unhook(tmp_path, wrap: Any) -> tuple[type, Any, list[str], Any]:
    Agent = make_agent_class()
    original = vars(Agent)["run"]
    agent = Agent()
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["run"])
    assert agent.run("before") == "answer to before"
    assert [t["user_query"] for t in flushed(hook)] == ["before"]
    calls: list[str] = []
    wrap(Agent, calls)
    assert agent.run("wrapped") == "answer to wrapped"  # still captured, through the other wrapper
    hook.unhook()  # must not raise
    assert [t["user_query"] for t in stored(tmp_path)] == ["before", "wrapped"]
    return Agent, agent, calls, original


@pytest.mark.parametrize(
    "wrap", [wrap_with_wrapt, wrap_with_wrapt_over_bound], ids=["wrap_function_wrapper", "over-bound"]
)
def test_a_wrapt_wrapper_on_top_is_kept_and_flowrl_is_spliced_out(tmp_path, caplog, wrap: Any) -> None:
    caplog.set_level(logging.WARNING, logger="flowrl.capture")
    Agent, agent, calls, original = hook_wrap_unhook(tmp_path, wrap)

    top = vars(Agent)["run"]
    assert isinstance(top, wrapt.FunctionWrapper)  # the other library's wrapper stays
    assert top.__wrapped__ is original  # flowrl's patch is out of the chain: the original function itself
    assert not left_warnings(caplog) and Agent.__qualname__ not in str(_patch.left_in_place())

    calls.clear()
    assert agent.run("after") == "answer to after"
    assert calls == ["wrapt"]
    assert [t["user_query"] for t in stored(tmp_path)] == ["before", "wrapped"]  # nothing captured after unhook


def test_a_functools_wrapper_on_top_keeps_an_inert_patch_said_once(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="flowrl.capture")
    before = dict(_patch.left_in_place())
    Agent, agent, calls, _ = hook_wrap_unhook(tmp_path, wrap_with_functools)

    (record,) = left_warnings(caplog)  # one line, no traceback
    assert "\n" not in record.getMessage() and record.exc_info is None
    assert f"{Agent.__qualname__}.run" in record.getMessage()
    name = f"{Agent.__module__}.{Agent.__qualname__}.run"
    assert _patch.left_in_place().get(name, 0) == before.get(name, 0) + 1

    calls.clear()
    assert agent.run("after") == "answer to after"  # the other wrapper still works, the result is intact
    assert calls == ["functools"]
    assert [t["user_query"] for t in stored(tmp_path)] == ["before", "wrapped"]  # nothing captured after unhook
    assert len(left_warnings(caplog)) == 1  # said once, not on every call


@pytest.mark.parametrize(
    "wrap",
    [wrap_with_wrapt, wrap_with_wrapt_over_bound, wrap_with_functools],
    ids=["wrap_function_wrapper", "over-bound", "functools"],
)
def test_hooking_again_dispatches_each_run_once(tmp_path, caplog, wrap: Any) -> None:
    """A patch flowrl let go of must not dispatch again: re-hooking puts a new patch on top of the other
    wrapper, and a left-over one underneath would hand each run to the new hook's handler a second time."""
    caplog.set_level(logging.WARNING, logger="flowrl.capture")
    Agent, agent, calls, _ = hook_wrap_unhook(tmp_path / "first", wrap)
    foreign = vars(Agent)["run"]
    warned = len(left_warnings(caplog))

    hook = hook_into_agent(agent, store=tmp_path / "second", run_methods=["run"])
    seen = count_handler_calls(hook)
    try:
        assert agent.run("again") == "answer to again"
        assert seen == [1]
        assert [t["user_query"] for t in flushed(hook)] == ["again"]
        assert hook.stats.captured == 1 and hook.stats.errors == 0
    finally:
        hook.unhook()
    assert vars(Agent)["run"] is foreign  # the new patch was outermost: put back exactly
    assert len(left_warnings(caplog)) == warned  # and nothing new to say
    calls.clear()
    assert agent.run("last") == "answer to last" and calls
    assert [t["user_query"] for t in stored(tmp_path / "second")] == ["again"]


def test_a_failure_while_splicing_is_logged_and_counted_not_raised(tmp_path, caplog, monkeypatch) -> None:
    caplog.set_level(logging.WARNING, logger="flowrl.capture")

    def broken(top: Any, wrapper: Any) -> str:
        raise RuntimeError("this wrapper refuses")

    monkeypatch.setattr(_patch, "_splice_out", broken)
    before = sum(_patch.left_in_place().values())
    Agent, agent, calls, _ = hook_wrap_unhook(tmp_path, wrap_with_wrapt)
    (record,) = left_warnings(caplog)
    assert "RuntimeError: this wrapper refuses" in record.getMessage()
    assert sum(_patch.left_in_place().values()) == before + 1
    assert agent.run("after") == "answer to after"
    assert [t["user_query"] for t in stored(tmp_path)] == ["before", "wrapped"]


def test_released_wrapper_held_elsewhere_captures_nothing(tmp_path) -> None:
    """Someone kept a reference to the patched method while hooked (e.g. a callback registry)."""
    Agent = make_agent_class()
    original = vars(Agent)["run"]
    agent = Agent()
    hook = hook_into_agent(agent, store=tmp_path / "a", run_methods=["run"])
    kept = Agent.run
    hook.unhook()
    assert vars(Agent)["run"] is original
    hook = hook_into_agent(agent, store=tmp_path / "b", run_methods=["run"])
    seen = count_handler_calls(hook)
    try:
        assert kept(agent, "held") == "answer to held"  # the old patch: a plain pass-through now
        assert seen == []
    finally:
        hook.unhook()
