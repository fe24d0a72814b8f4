"""The example agent (FlowAgent's shape, a scripted backend instead of a model) and its capture."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from flowrl.capture import hook_into_agent
from flowrl.demo.agent import ExampleAgent, parse_tool_calls
from flowrl.demo.tasks import TASKS, answer_matches
from flowrl.store.files import TraceStore


class ScriptedBackend:
    model_name = "scripted"

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]]) -> tuple[str, int, int]:
        self.seen.append(messages)
        return self.replies.pop(0), 10, 5


class FakeSandbox:
    def run(self, code: str, language: str = "python", timeout: float | None = None) -> Any:
        from types import SimpleNamespace

        value = eval(code.removeprefix("print(").removesuffix(")"), {})  # only the test's own literal code
        return SimpleNamespace(status="ok", stdout=f"{value}\n", stderr="")


def test_parse_tool_calls() -> None:
    calls = parse_tool_calls('<tool_call>{"name": "lookup", "arguments": {"key": "capital of france"}}</tool_call>')
    assert calls[0].function.name == "lookup" and '"capital of france"' in calls[0].function.arguments
    assert parse_tool_calls("just text") == []
    assert parse_tool_calls("<tool_call>{broken</tool_call>")[0].function.name == "invalid_tool_call"


def test_agent_runs_tools_and_is_captured_like_a_flowagent(tmp_path: Path) -> None:
    backend = ScriptedBackend(
        [
            '<tool_call>{"name": "exec_code", "arguments": {"code": "print(45 + 38)"}}</tool_call>',
            '<tool_call>{"name": "final_answer", "arguments": {"answer": "83"}}</tool_call>',
            '<tool_call>{"name": "lookup", "arguments": {"key": "capital of mars"}}</tool_call>',
            "I do not know.",
        ]
    )
    agent = ExampleAgent(backend, sandbox=FakeSandbox())
    store = TraceStore(tmp_path)
    hook = hook_into_agent(agent, store=store)

    async def main() -> tuple[str, str]:
        return (
            await agent.a_run("What is 45 + 38?", session_id="a"),
            await agent.a_run("What is the capital of Mars?", session_id="b"),
        )

    first, second = asyncio.run(main())
    assert hook.flush(timeout=10)
    hook.unhook()
    assert (first, second) == ("83", "I do not know.")
    traces = {t.user_query: t for t in store.iter_traces()}
    t1, t2 = traces["What is 45 + 38?"], traces["What is the capital of Mars?"]
    assert [c.tool_name for c in t1.tool_calls] == ["exec_code"] and t1.tool_calls[0].success
    assert t1.final_response == "83" and t1.status == "completed"
    assert any(m.get("role") == "tool" for m in t1.messages)
    assert t2.tool_calls[0].success is False  # the lookup raised: "Error executing lookup: ..."
    assert t1.agent_name == "example_agent"


def test_tasks_have_checkable_answers() -> None:
    assert len({t.task_id for t in TASKS}) == len(TASKS)
    assert answer_matches("83", "The answer is 83.") and not answer_matches("83", "830")


def test_annotate_records_the_task_answer_once(tmp_path: Path) -> None:
    from flowrl.demo.tasks import annotate
    from flowrl.trace.schema import ExecutionTrace

    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(trace_id="a", user_query=TASKS[0].query, rewards={"format": 1.0}, reward_score=1.0))
    store.write(ExecutionTrace(trace_id="b", user_query="not a demo task"))
    assert annotate(store) == 1
    t = store.get("a")
    assert (t.metadata["reference_answer"], t.group_key, t.rewards, t.reward_score) == (
        TASKS[0].answer,
        TASKS[0].task_id,
        {},
        None,
    )
    assert "reference_answer" not in store.get("b").metadata
    assert annotate(store) == 0  # already annotated: left alone


def test_the_demos_improve_line_gives_mcnemars_p_and_says_when_it_is_not_significant(tmp_path: Path) -> None:
    """The demo's console line gave the rates and no p: 2/30 -> 4/30 read as a gain (issue 39)."""
    from flowrl.demo.run import _significance
    from flowrl.evaluate.results import summarize, write_eval_json

    small = {f"t{i}": {"base": i < 2, "round-1": i < 4} for i in range(30)}
    write_eval_json(tmp_path / "small.json", summarize(small, base="base"))
    assert _significance(tmp_path / "small.json", "round-1") == "McNemar p = 0.5 (not significant)"
    large = {f"t{i}": {"base": i < 2, "round-1": i < 40} for i in range(150)}
    write_eval_json(tmp_path / "large.json", summarize(large, base="base"))
    assert _significance(tmp_path / "large.json", "round-1") == "McNemar p = 7.28e-12"


def test_the_demo_does_not_warn_about_the_grpo_it_chose() -> None:
    """`make demo` warned that single-turn GRPO executes no tool, a choice the demo made itself (issue 39): its
    train line says it, and the trainer's warning is held back for the demo's run only."""
    import logging

    from flowrl.demo.run import _SaidByTheDemo

    said = _SaidByTheDemo()
    warning = logging.LogRecord(
        "flowrl.train.trainers", logging.WARNING, __file__, 1,
        "flowrl: %d of %d prompts in %s offer tools, but --method grpo without --agent executes none: ...",
        (3, 3, "data"), None,
    )  # fmt: skip
    other = logging.LogRecord("flowrl.train.trainers", logging.WARNING, __file__, 1, "TRL dropped rows", (), None)
    assert not said.filter(warning) and said.filter(other)
    import inspect

    from flowrl.train.trainers import warn_unexecuted_tools

    assert "without --agent executes none" in inspect.getsource(warn_unexecuted_tools)  # the filter matches it
