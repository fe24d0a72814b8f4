"""`hook_into_agent`'s options are declared once, in `CaptureOptions` (issue 35: they were a 16-name frozenset
checked by hand, then re-normalised key by key in two places)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from flowrl.capture import hook as hook_module
from flowrl.capture import hook_into_agent
from flowrl.capture.options import NAMES, CaptureOptions, capture_options
from flowrl.errors import ConfigError


class Agent:
    async def a_run(self, query: str) -> str:
        return query


def test_the_accepted_options_are_the_dataclass_fields() -> None:
    assert hook_module.OPTIONS == frozenset(f.name for f in dataclasses.fields(CaptureOptions)) == frozenset(NAMES)
    documented = inspect.getdoc(hook_into_agent) or ""
    assert all(f"`{name}`" in documented for name in NAMES)  # each one described in the docstring


def test_a_hook_keeps_its_options_checked(tmp_path: Path) -> None:
    agent = Agent()
    hook = hook_into_agent(agent, tmp_path, run_methods="a_run", exit_timeout="2", metadata=None, llm_clients=[])
    try:
        assert isinstance(hook.options, CaptureOptions)
        assert hook.options.run_methods == ("a_run",) and hook.options.exit_timeout == 2.0
        assert hook.options.metadata == {} and hook.options.clients == () and hook.options.adapter == "generic"
        assert hook.options.agent_name == "Agent"
        # the same options, spelt differently, are the same hook; another value names the option that differs
        assert hook_into_agent(agent, run_methods=["a_run"]) is hook
        with pytest.raises(ConfigError, match="max_events_per_run=5"):
            hook_into_agent(agent, max_events_per_run=5)
    finally:
        hook.unhook()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"max_events_per_run": -1}, "max_events_per_run must be a non-negative integer"),
        ({"mask": "no"}, "mask must be a callable"),
        ({"source": "elsewhere"}, "source 'elsewhere'"),
        ({"run_methods": ["not a name"]}, "run_methods must be a list of method names"),
        ({"exit_timeout": "soon"}, "exit_timeout must be a number of seconds"),
        ({"llm_clients": ["nosuch"]}, "unknown client"),
    ],
)
def test_a_bad_value_names_its_option(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        capture_options(given)


def test_an_unknown_option_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown option.*runmethods.*known: adapter"):
        hook_into_agent(Agent(), tmp_path, runmethods=["a_run"])
