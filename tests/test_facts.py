"""flowrl.trace.facts: one meaning per fact. The rules one by one, then one set of traces through every consumer."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from flowrl.capture import hook_into_agent
from flowrl.data import DatasetPipeline, GRPODatasetBuilder, KTODatasetBuilder
from flowrl.data.grouping import Grouper
from flowrl.evaluate.prompts import answer_trace, load_prompts
from flowrl.report.metrics import store_metrics
from flowrl.rewards.base import RewardResult
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.judge import LLMJudgeReward
from flowrl.rewards.reference import ReferenceAnswerReward
from flowrl.rewards.task_completion import TaskCompletionReward
from flowrl.rewards.tool_success import ToolSuccessReward
from flowrl.rewards.views import group_key
from flowrl.store.files import TraceStore
from flowrl.trace import facts
from flowrl.trace.load import load_trace
from flowrl.trace.schema import SCHEMA_VERSION, ExecutionTrace
from tests.fakes import flushed

EXEC_FAILED = "{'success': False, 'output': '', 'error': \"NameError: name 'x' is not defined\"}"  # exec_code's own
TRACEBACK = (
    "{'success': True, 'output': 'Traceback (most recent call last):\\n  File \"<cell>\", line 1\\n"
    "ZeroDivisionError: division by zero', 'error': None}"
)
ERROR = "Error: file not found"
REPORTED_OK_BUT_FAILED = "Error executing fetch_stock: timeout"  # FlowAgent's obs said "ok"
OK = "{'success': True, 'output': '4', 'error': None}"


# -- 1. tool failed ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "failed"),
    [
        (EXEC_FAILED, True),
        ('{"success": false, "output": ""}', True),
        ({"success": False}, True),
        (TRACEBACK, True),
        (ERROR, True),
        (REPORTED_OK_BUT_FAILED, True),
        ("System-Error: Invalid JSON", True),
        ("{'error': 'ValueError: tool broke'}", True),  # TRL's tool loop, for a tool that raised
        (OK, False),
        ("The error rate was 2%", False),
        ("{'output': 'success: False is a string here'}", False),
    ],
)
def test_result_failed(result: Any, failed: bool) -> None:
    assert facts.result_failed(result) is failed


def test_tool_failed_needs_a_result_a_flag_or_an_error() -> None:
    assert facts.tool_failed(None) is None  # a fresh completion that only asked for the call
    assert facts.tool_failed(None, success=False) is True
    assert facts.tool_failed(OK, error="boom") is True
    assert facts.tool_failed(OK, success=True) is False
    assert facts.tool_failed(EXEC_FAILED, success=True) is True  # the framework's "ok" does not make it one


# -- 2. outcome -------------------------------------------------------------------------------------


def _fa(success: Any, answer: str = "done") -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "f1",
                    "type": "function",
                    "function": {
                        "name": "final_answer",
                        "arguments": json.dumps({"answer": answer, "success": success}),
                    },
                }
            ],
        },
    ]


@pytest.mark.parametrize(
    ("kwargs", "value", "source"),
    [
        ({"final_response": "Error: something broke", "status": "completed"}, 0.0, "error_answer"),
        ({"final_response": "<think>hm</think>\nSystem-Error: bad call", "success": True}, 0.0, "error_answer"),
        ({"final_response": "partial", "status": "max_iterations", "success": True}, 0.0, "status"),
        ({"final_response": "ok", "status": "canceled"}, 0.0, "status"),
        ({"final_response": "ok", "status": "running"}, None, "unfinished"),
        ({"messages": _fa(False), "status": "completed"}, 0.0, "final_answer.success"),
        ({"messages": _fa("true"), "success": False}, 1.0, "final_answer.success"),
        ({"final_response": "ok", "success": False}, 0.0, "trace.success"),
        ({"final_response": "ok", "tasks_completed": [{}], "tasks_failed": [{}, {}]}, 1 / 3, "tasks"),
        ({"final_response": "ok", "status": "completed"}, 1.0, "status"),
        ({"final_response": "just text"}, None, "none"),
    ],
)
def test_outcome_rule(kwargs: dict[str, Any], value: float | None, source: str) -> None:
    outcome = facts.run_outcome(ExecutionTrace(**kwargs))
    assert (outcome.value, outcome.source) == (value, source)


def test_reported_success_is_what_the_run_said_about_itself() -> None:
    assert facts.reported_success(answers=["ok"], status="completed") is None  # "completed" alone says nothing
    assert facts.reported_success(answers=["ok"], status="completed", final_answer_success=False) is False
    assert facts.reported_success(answers=["Error executing x"], status="completed", reported=True) is False
    assert facts.reported_success(answers=["ok"], status="paused", final_answer_success=True) is True  # its own verdict
    assert facts.reported_success(answers=["ok"], status="running") is None  # unfinished, and said nothing


# -- 3. task key, 4. reference ----------------------------------------------------------------------


def test_task_key_one_rule() -> None:
    a, b = ExecutionTrace(user_query="What is 2+2?"), ExecutionTrace(user_query="  what is   2+2")
    assert facts.task_key(a) == facts.task_key(b) == facts.query_key("WHAT IS 2+2!") == "what is 2+2"
    assert facts.task_key(ExecutionTrace(user_query="What is 2+2?", group_key="add-2-2")) == "add-2-2"


def test_reference_one_list_one_order_and_a_guess_is_never_a_reference() -> None:
    assert facts.REFERENCE_KEYS == ("reference_answer", "expected_answer", "reference", "expected", "answer")
    assert facts.reference_in({"answer": 1, "expected": "2"}) == "2"  # first key in the one order wins
    assert facts.reference_in({"reference_answer": "55", "reference_source": "best_trace"}) is None
    host = ExecutionTrace(metadata={"expected_answer": 4, "grpo_columns": {"reference_answer": "5"}})
    assert facts.reference(host) == facts.Reference("4", "metadata")
    column = ExecutionTrace(metadata={"grpo_columns": {"reference": "5"}})
    assert facts.reference(column) == facts.Reference("5", "dataset")
    guessed = ExecutionTrace(metadata={"grpo_columns": {"reference_answer": "5", "reference_source": "best_trace"}})
    assert facts.reference(guessed) == facts.Reference(None)


# -- 5. label ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "label", "source", "expected"),
    [
        (0.55, None, None, (False, "threshold")),
        (0.6, None, None, (True, "threshold")),
        (0.65, None, None, (True, "threshold")),
        (0.55, True, "manual", (True, "manual")),
        (0.65, False, "manual", (False, "manual")),
        (0.65, False, "engine", (False, "engine")),
        (None, None, None, (None, "none")),
    ],
)
def test_label_rule(score: float | None, label: bool | None, source: str | None, expected: tuple[Any, str]) -> None:
    trace = ExecutionTrace(reward_score=score, label=label, label_source=source)
    assert facts.label_at(trace) == expected
    assert facts.DEFAULT_THRESHOLD == RewardEngine().threshold == 0.6


def test_label_gate_and_explicit_threshold() -> None:
    failed = ExecutionTrace(reward_score=0.9, rewards={"task_completion": 0.0, "format": 1.0})
    assert facts.label_at(failed) == (False, "threshold")  # a failed task is never good
    stored = ExecutionTrace(reward_score=0.55, label=True, label_source="engine")
    assert facts.label_at(stored) == (True, "engine") and facts.label_at(stored, 0.5) == (True, "threshold")
    assert facts.label_at(stored, 0.7) == (False, "threshold")
    manual_review = ExecutionTrace(reward_score=0.1, label=True, manual_review=True)  # toolboxv2's manual flag
    assert facts.is_manual_label(manual_review) and facts.label_at(manual_review, 0.9) == (True, "manual")


# -- stored facts -----------------------------------------------------------------------------------


def test_upgrade_to_v3_rejudges_tools_and_fills_the_facts() -> None:
    old = {
        "schema_version": 2,
        "trace_id": "old",
        "user_query": "What is 2+2?",
        "final_response": "4",
        "status": "completed",
        "metadata": {"reference_answer": "4"},
        "tool_calls": [
            {"tool_name": "exec_code", "result": EXEC_FAILED, "success": True, "call_id": "c1"},
            {"tool_name": "exec_code", "result": OK, "success": True, "call_id": "c2"},
        ],
    }
    t = load_trace(old)
    assert t.schema_version == SCHEMA_VERSION == 3
    assert [c.success for c in t.tool_calls] == [False, True]
    assert old["tool_calls"][0]["success"] is True  # the input dict is untouched
    assert t.facts is not None and t.facts.tools["exec_code"].model_dump() == {"calls": 2, "failed": 1}
    assert (t.facts.outcome, t.facts.outcome_source) == (1.0, "status")
    assert (t.facts.task_key, t.facts.reference_answer, t.facts.reference_source) == ("what is 2+2", "4", "metadata")


def test_stored_run_facts_are_read_and_task_facts_follow_the_host(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    t = load_trace({"trace_id": "t1", "user_query": "What is 2+2?", "final_response": "4", "status": "completed"})
    store.write(t)
    back = store.get("t1")
    assert back == t and back.facts is not None and back.facts.outcome == 1.0
    # the host names and annotates the task after the run (as `flowrl demo` does): read now, stored on write
    back.group_key, back.metadata["reference_answer"] = "add-2-2", "4"
    assert facts.task_key(back) == "add-2-2" and facts.reference(back).answer == "4"
    store.update(back)
    again = store.get("t1")
    assert again.facts is not None and (again.facts.task_key, again.facts.reference_answer) == ("add-2-2", "4")
    # run facts come from the stored copy (decided once, when the run was stored)
    stored = again.model_copy(
        update={"facts": again.facts.model_copy(update={"outcome": 0.0, "outcome_source": "status"})}
    )
    assert TaskCompletionReward().score(stored).value == 0.0


class ExecAgent:
    """A generic agent whose code tool reports failure the way FlowAgent's exec_code does."""

    name = "exec"

    async def a_run(self, query: str, session_id: str = "default") -> str:
        await self.call_tool("exec_code", {"code": "x"})
        await self.call_tool("exec_code", {"code": "2+2"})
        return "4"

    async def call_tool(self, name: str, args: dict[str, Any]) -> str:
        await asyncio.sleep(0)
        return EXEC_FAILED if args["code"] == "x" else OK


def test_capture_stores_exec_codes_failure_shape_as_a_failure(tmp_path: Path) -> None:
    agent = ExecAgent()
    hook = hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], tool_methods=["call_tool"])
    try:
        assert asyncio.run(agent.a_run("What is 2+2?")) == "4"
        (data,) = flushed(hook)
    finally:
        hook.unhook()
    assert [c["success"] for c in data["tool_calls"]] == [False, True]  # was stored as a success before
    assert data["facts"]["tools"] == {"exec_code": {"calls": 2, "failed": 1}}
    assert data["facts"]["task_key"] == "what is 2+2" and data["schema_version"] == SCHEMA_VERSION
    trace = TraceStore(tmp_path).get(data["trace_id"])
    assert ToolSuccessReward().score(trace).value == 0.5  # and the reward, the report count it the same
    assert store_metrics(TraceStore(tmp_path)).tools["exec_code"].failures == 1


# -- the agreement test ------------------------------------------------------------------------------


def _old(trace_id: str, query: str, calls: list[str], *, final: str = "4", **fields: Any) -> ExecutionTrace:
    """A trace as an older flowrl stored it (schema 2, every tool call's `success` trusted), loaded now."""
    data = {
        "schema_version": 2,
        "trace_id": trace_id,
        "timestamp": "2026-11-20T10:00:00",
        "user_query": query,
        "final_response": final,
        "tool_calls": [
            {
                "tool_name": "exec_code",
                "arguments": {"code": str(i)},
                "result": r,
                "success": True,
                "call_id": f"{trace_id}-{i}",
            }
            for i, r in enumerate(calls)
        ],
        **fields,
    }
    return load_trace(data)


def _corpus() -> list[ExecutionTrace]:
    fa_false = [
        {"role": "user", "content": "Fetch the stock price."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "s1", "type": "function", "function": {"name": "fetch_stock", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "s1", "name": "fetch_stock", "content": REPORTED_OK_BUT_FAILED},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "f1",
                    "type": "function",
                    "function": {
                        "name": "final_answer",
                        "arguments": '{"answer": "I could not fetch it.", "success": false}',
                    },
                }
            ],
        },
    ]
    return [
        _old(
            "sum-a",
            "What is 2+2?",
            [EXEC_FAILED, OK],
            status="completed",
            metadata={"reference_answer": "4"},
            reward_score=0.6,
        ),
        _old(
            "sum-b",
            "what is 2+2",
            [TRACEBACK],
            final="5",
            status="completed",
            reward_score=0.55,
            metadata={"reference_answer": "4"},
        ),
        _old("read", "Read the file.", [ERROR], final="Error: file not found", status="completed"),
        _old("hello", "Say hello.", [OK], final="Hello!", status="completed", reward_score=0.65),
        load_trace(
            {
                "schema_version": 2,
                "trace_id": "stock",
                "user_query": "Fetch the stock price.",
                "status": "completed",
                "messages": fa_false,
                "reward_score": 0.65,
                "rewards": {"task_completion": 0.0, "format": 1.0},
                "tool_calls": [
                    {"tool_name": "fetch_stock", "result": REPORTED_OK_BUT_FAILED, "success": True, "call_id": "s1"}
                ],
            }
        ),
        # built in memory (no stored facts): the same rules, decided on the spot
        ExecutionTrace(
            trace_id="guess",
            user_query="Name a prime.",
            final_response="7",
            status="completed",
            reward_score=0.65,
            label=False,
            label_source="manual",
            metadata={"grpo_columns": {"reference_answer": "7", "reference_source": "best_trace"}},
        ),
        ExecutionTrace(
            trace_id="manual",
            user_query="Name an even prime.",
            final_response="2",
            success=True,
            reward_score=0.55,
            label=True,
            label_source="manual",
        ),
    ]


def test_every_consumer_agrees(tmp_path: Path) -> None:
    traces = _corpus()
    by_id = {t.trace_id: t for t in traces}
    assert by_id["stock"].facts is not None and by_id["guess"].facts is None  # both paths are covered

    # 1. tool failed: stored flags, stored tallies, tool_success and the report count the same failures
    expected = {"sum-a": 1, "sum-b": 1, "read": 1, "hello": 0, "stock": 1, "guess": 0, "manual": 0}
    for t in traces:
        tallies = facts.tally_tools(t)
        assert sum(x.failed for x in tallies.values()) == expected[t.trace_id]
        assert sum(not c.success for c in t.tool_calls) == expected[t.trace_id]  # what is stored
        r = ToolSuccessReward().score(t)
        assert r.details.get("failed", 0) == expected[t.trace_id]
        assert r.details["counted"] == sum(x.calls for x in tallies.values())
    store = TraceStore(tmp_path / "store")
    for t in traces:
        store.write(t)
    m = store_metrics(store)
    assert (m.tools["exec_code"].calls, m.tools["exec_code"].failures) == (5, 3)
    assert (m.tools["fetch_stock"].calls, m.tools["fetch_stock"].failures) == (1, 1)

    # 2. outcome: task_completion, the stored fact and the report
    outcomes = {t.trace_id: facts.run_outcome(t) for t in traces}
    assert {k: o.value for k, o in outcomes.items()} == {
        "sum-a": 1.0,
        "sum-b": 1.0,
        "read": 0.0,
        "hello": 1.0,
        "stock": 0.0,
        "guess": 1.0,
        "manual": 1.0,
    }
    for t in traces:
        assert TaskCompletionReward().score(t).value == outcomes[t.trace_id].value
        assert facts.compute_outcome(t).value == outcomes[t.trace_id].value
    assert m.success == Counter(o.verdict for o in outcomes.values())

    # 3. task key: the judge, `flowrl score`'s grouping and the dataset groups see one task for both spellings
    judge = LLMJudgeReward(model="fake-judge", base_url="http://127.0.0.1:9/v1", api_key="x")
    groups: list[list[str]] = []

    def fake_group(group: list[ExecutionTrace]) -> list[RewardResult]:
        groups.append(sorted(t.trace_id for t in group))
        return [RewardResult(0.5, {}) for _ in group]

    judge._score_group = fake_group  # type: ignore[method-assign]
    judge.score_batch(traces)
    assert ["sum-a", "sum-b"] in groups and len(groups) == len(traces) - 1
    assert group_key(by_id["sum-a"]) == group_key(by_id["sum-b"]) == facts.task_key(by_id["sum-b"])
    for mode in ("query", "group_key"):
        grouper = Grouper(mode)  # type: ignore[arg-type]
        assert grouper.key(by_id["sum-a"]) == grouper.key(by_id["sum-b"])
    grpo = DatasetPipeline(GRPODatasetBuilder(), val_fraction=0.0).to_dataset_dict(traces)
    rows = {r["trace_id"]: r for r in grpo["train"]}
    assert rows["sum-a"]["n_traces"] == 2 and "sum-b" not in rows

    # 4. reference: the reward, the dataset column and eval's lookup
    assert ReferenceAnswerReward().score(by_id["sum-a"]).value == 1.0
    assert ReferenceAnswerReward().score(by_id["sum-b"]).value == 0.0
    assert ReferenceAnswerReward().score(by_id["guess"]).value is None
    assert (rows["sum-a"]["reference_answer"], rows["sum-a"]["reference_source"]) == ("4", "metadata")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": r["prompt"],
                    "reference_answer": r["reference_answer"],
                    "reference_source": r["reference_source"],
                }
            )
            + "\n"
            for r in grpo["train"]
        )
    )
    prompts, _ = load_prompts(jsonl)
    by_query = {p.query: p for p in prompts}
    for t in traces:
        row = rows.get(t.trace_id)
        if row is None:
            continue
        prompt = by_query[t.user_query]
        assert prompt.reference == facts.reference(t).answer  # a best_trace guess is None for eval too
        assert (
            ReferenceAnswerReward().score(answer_trace(prompt, t.final_response)).value
            == ReferenceAnswerReward().score(t).value
        )

    # 5. label: the engine, the dataset rows and the report
    labels = {t.trace_id: facts.label_at(t) for t in traces}
    assert labels == {
        "sum-a": (True, "threshold"),
        "sum-b": (False, "threshold"),
        "read": (None, "none"),
        "hello": (True, "threshold"),
        "stock": (False, "threshold"),
        "guess": (False, "manual"),
        "manual": (True, "manual"),
    }
    engine = RewardEngine(
        {"task_completion": TaskCompletionReward(), "tool_success": ToolSuccessReward()},
        {"task_completion": 10.0, "tool_success": 2.0},
    )
    for t in traces:
        if facts.is_manual_label(t):
            continue
        if t.rewards:  # scored per reward: the engine gates on them as the dataset does
            assert engine.get_binary_label({n: RewardResult(v) for n, v in t.rewards.items()}) is labels[t.trace_id][0]
        else:
            assert engine.get_binary_label(t.reward_score) is labels[t.trace_id][0]
        # scored now, as `flowrl score` does, but without writing the label: the fallback gives the engine's
        results = engine.compute_all(t)
        scored = t.model_copy(
            update={
                "rewards": {n: r.value for n, r in results.items()},
                "reward_score": engine.compute_combined(results),
            }
        )
        assert facts.label_at(scored)[0] is engine.get_binary_label(results)
    kto = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.0).to_dataset_dict(traces)
    assert {r["trace_id"]: r["label"] for r in kto["train"]} == {k: v[0] for k, v in labels.items() if v[0] is not None}
    assert m.labels == Counter(
        "unlabelled" if v[0] is None else f"{'good' if v[0] else 'bad'} ({v[1]})" for v in labels.values()
    )
