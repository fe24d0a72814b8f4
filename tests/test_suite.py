"""The generated task suite: big enough, deterministic, split without overlap, graded like the reward, and
every task solvable with the example agent's own tools."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowrl.demo.agent import CAPITALS, FACTS, ExampleAgent, find_fact
from flowrl.demo.suite import (
    KINDS,
    SuiteError,
    SuiteTask,
    canonical,
    check_disjoint,
    grade,
    group_of,
    split,
    suite,
)
from flowrl.demo.tasks import TASKS, Task, annotate
from flowrl.trace.facts import query_key


class FakeSandbox:
    """Evaluates the `print(<arithmetic>)` the tests send, as the real sandbox would print it."""

    def run(self, code: str, language: str = "python", timeout: float | None = None) -> Any:
        value = eval(code.removeprefix("print(").removesuffix(")"), {"__builtins__": {}})  # the suite's own arithmetic
        return SimpleNamespace(status="ok", stdout=f"{value}\n", stderr="")


class NoModel:
    model_name = "none"

    def complete(self, messages: list[dict[str, Any]]) -> tuple[str, int, int]:
        raise AssertionError("the tools are called directly; no model is needed")


@pytest.fixture(scope="module")
def tasks() -> list[SuiteTask]:
    return suite(seed=0)


@pytest.fixture(scope="module")
def parts(tasks: list[SuiteTask]) -> tuple[list[SuiteTask], list[SuiteTask]]:
    return split(tasks, held_out=200, seed=0)


def test_suite_has_2000_distinct_tasks_of_every_kind(tasks: list[SuiteTask]) -> None:
    assert len(tasks) == 2400
    assert len({query_key(t.query) for t in tasks}) == len(tasks)
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert all("#" not in t.task_id and t.task_id == t.task_id.strip() for t in tasks)  # improve's session ids
    counts = Counter(t.kind for t in tasks)
    assert set(counts) == set(KINDS) and min(counts.values()) >= 300, counts
    assert all(t.answer for t in tasks)


def test_same_seed_gives_the_same_suite_and_split(tasks: list[SuiteTask], parts: tuple[list, list]) -> None:
    assert suite(seed=0) == tasks
    assert suite(seed=1) != tasks
    shuffled = list(tasks)
    random.Random(7).shuffle(shuffled)
    assert split(shuffled, held_out=200, seed=0) == parts  # a task's side does not depend on list order
    assert split(tasks, held_out=200, seed=1)[1] != parts[1]


def test_held_out_part_is_big_enough_and_has_every_kind(tasks: list[SuiteTask], parts: tuple[list, list]) -> None:
    train, held = parts
    assert len(held) == 200 and len(train) + len(held) == len(tasks)
    for part in parts:
        assert set(Counter(t.kind for t in part)) == set(KINDS)
    share = {k: c / len(tasks) for k, c in Counter(t.kind for t in tasks).items()}
    for kind, count in Counter(t.kind for t in held).items():
        assert abs(count / len(held) - share[kind]) < 0.03  # every kind in proportion
    assert len(split(tasks, held_out=150)[1]) >= 150


def test_train_and_held_out_never_overlap(tasks: list[SuiteTask], parts: tuple[list, list]) -> None:
    train, held = parts
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert not {query_key(t.query) for t in train} & {query_key(t.query) for t in held}
    assert not {group_of(t) for t in train} & {group_of(t) for t in held}
    # commutative reorderings: the canonical expression of every calc task is on one side only
    assert not (
        {canonical(t.expression) for t in train if t.kind == "calc"}
        & {canonical(t.expression) for t in held if t.kind == "calc"}
    )
    # a fact asked about (lookup) or computed with (multi) on one side is never on the other
    assert not {t.key for t in train if t.key} & {t.key for t in held if t.key}
    check_disjoint(train, held)


def test_no_two_calc_tasks_share_a_pair_of_operands(tasks: list[SuiteTask]) -> None:
    seen: set[tuple[str, str]] = set()
    for t in tasks:
        if t.kind == "calc":
            pairs = set(combinations(sorted(t.task_id.split("-")[1:]), 2))
            assert not pairs & seen, t.task_id
            seen |= pairs


def test_commutative_duplicates_are_one_task() -> None:
    assert canonical("86 * 347 + 5") == canonical("5 + 347 * 86")
    assert canonical("(1 + 2) * 3") == canonical("3 * (2 + 1)")
    assert canonical("5 - 3") != canonical("3 - 5")
    a, b = Task("a", "What is 12 * 34?", "408", "calc"), Task("b", "what is 34*12", "408", "calc")
    assert group_of(a) == group_of(b)
    with pytest.raises(SuiteError, match="near-duplicate"):
        check_disjoint([a], [b])
    fillers = [Task(f"f{i}", f"What is {i} + 1000?", str(i + 1000), "calc") for i in range(20)]
    for seed in range(10):
        train, held = split([a, b, *fillers], held_out=5, seed=seed)
        assert (a in held) == (b in held)


def test_split_refuses_what_it_cannot_do(tasks: list[SuiteTask]) -> None:
    with pytest.raises(SuiteError, match="cannot hold out"):
        split(tasks[:10], held_out=10)
    same_id = [Task("x", "What is 1 + 2?", "3", "calc"), Task("x", "What is 5 + 6?", "11", "calc")]
    train, held = split([*same_id, Task("y", "What is the capital of Peru?", "Lima", "lookup")], held_out=1)
    assert {t.task_id for t in train}.isdisjoint({t.task_id for t in held})
    with pytest.raises(SuiteError, match="task id"):
        check_disjoint(same_id[:1], same_id[1:])


@pytest.mark.parametrize(
    ("expected", "text", "ok"),
    [
        ("84", "84", True),
        ("84", "The answer is 84.", True),
        ("54870", "885 * 62 = 54870", True),
        ("54870", "It is 54,870.", True),
        ("84", "841", False),
        ("84", "184", False),
        ("84", "84.5", False),
        ("84", "I could not finish the task.", False),
        ("Paris", "the capital is paris", True),
        ("Paris", "Parisian", False),
        ("Fe", "The chemical symbol of iron is Fe.", True),
        ("Kuala Lumpur", "Kuala", False),
    ],
)
def test_grade_accepts_the_answer_as_a_whole_word_or_number(expected: str, text: str, ok: bool) -> None:
    assert grade(Task("t", "q", expected, "calc"), text) is ok


def test_grade_accepts_a_float_spelling_of_an_integer_answer() -> None:
    assert grade(Task("t", "q", "84", "calc"), "84.0") and grade(Task("t", "q", "84", "calc"), "It is 84.00.")
    assert not grade(Task("t", "q", "84", "calc"), "84.05")


@pytest.mark.parametrize(
    ("expected", "text", "why"),
    [
        ("84", "84 or 85", "offers candidates"),
        ("85", "84 or 85", "offers candidates"),
        ("84", "It is 84/85.", "offers candidates"),
        ("Lima", "The capital of Peru is Lima or Quito.", "offers candidates"),
        ("84", "between 80 and 84", "offers a range"),
        ("84", "84 to 86", "offers a range"),
        ("84", "84, 85, 86", "lists candidates"),
        ("85", "Maybe 84, 85", "lists candidates"),
        ("2142", "2520 + 6026 + 2142 = 10240\n10240 = 2142\n\nThe answer is 2142.", "contradicts itself"),
        ("84", "The answer is 84. No, the answer is 85.", "contradicts itself"),
        ("84", "84. Actually, 85.", "corrects itself"),
        ("85", "84. Actually, 85.", "corrects itself"),
    ],
)
def test_grade_refuses_an_answer_that_hedges_or_contradicts_itself(expected: str, text: str, why: str) -> None:
    from flowrl.rewards.reference import hedge

    assert not grade(Task("t", "q", expected, "calc"), text)
    assert hedge(expected, text) == why


@pytest.mark.parametrize(
    ("expected", "text"),
    [
        ("3318", "56 * 72 + 122 = 3108 + 122 = 3318."),  # working shown step by step
        ("102", "The atomic number of carbon is 6, and 6 * 17 = 102."),  # the looked-up value beside the result
        ("1225", "55 * 57 - 371 = 2255 - 371 = 1225."),
        ("9200", "530 * 16 = 9200\n\nThe answer is 9200."),
        ("84", "Wait, 12 * 7 = 84"),
        ("84", "The result: 84, not 85"),
        ("25125", "{'success': True, 'output': '25125', 'error': None}"),
    ],
)
def test_grade_accepts_one_committed_answer_with_its_working(expected: str, text: str) -> None:
    assert grade(Task("t", "q", expected, "calc"), text)


@pytest.mark.parametrize("text", ["84", "The answer is 84.", "841", "84.0", "", "It is 8 4", "84 or 85", "84, 85"])
def test_grade_agrees_with_the_reference_answer_reward(text: str) -> None:
    from flowrl.rewards.reference import ReferenceAnswerReward
    from flowrl.trace.schema import ExecutionTrace

    task = Task("t", "What is 12 * 7?", "84", "calc")
    trace = ExecutionTrace(
        trace_id="t",
        user_query=task.query,
        final_response=text,
        status="completed",
        metadata={"reference_answer": task.answer},
    )
    assert (ReferenceAnswerReward().score(trace).value == 1.0) is grade(task, text)


def test_every_task_is_solved_by_the_agents_own_tools(tasks: list[SuiteTask]) -> None:
    agent = ExampleAgent(NoModel(), sandbox=FakeSandbox())

    async def solve(task: SuiteTask) -> None:
        if task.kind == "calc":
            out = await agent.arun_function("exec_code", code=f"print({task.expression})")
            assert out["success"] and out["output"] == task.answer and grade(task, out["output"]), task
            return
        value = await agent.arun_function("lookup", key=task.key)
        # a model that passes the whole question as the key gets the same fact
        assert await agent.arun_function("lookup", key=task.query) == value, task
        assert task.key.lower() in task.query.lower(), task  # the query names its fact verbatim
        if task.kind == "lookup":
            assert value == task.answer and grade(task, value), task
            return
        assert value.isdigit(), task
        out = await agent.arun_function("exec_code", code=f"print({task.expression.format(x=value)})")
        assert out["success"] and out["output"] == task.answer and grade(task, out["output"]), task

    async def main() -> None:
        for task in tasks:
            await solve(task)

    asyncio.run(main())


def test_lookup_prefers_the_exact_then_the_longest_fact() -> None:
    assert find_fact("capital of nigeria") == "Abuja" and find_fact("capital of niger") == "Niamey"
    assert find_fact("What is the capital of Dominican Republic?") == "Santo Domingo"
    assert find_fact("capital of dominica") == "Roseau"
    assert find_fact("days in a leap year") == "366" and find_fact("number of days in a year") == "365"
    assert find_fact("") is None and find_fact("capital of mars") is None
    for fact, value in FACTS.items():
        assert find_fact(fact) == value, fact


def test_the_original_facts_and_matching_are_kept() -> None:
    original = {
        "capital of france": "Paris",
        "capital of japan": "Tokyo",
        "capital of italy": "Rome",
        "boiling point of water": "100 degrees Celsius",
        "days in a week": "7",
        "speed of light": "299792458 m/s",
    }
    assert list(FACTS)[:6] == list(original) and all(FACTS[k] == v for k, v in original.items())
    assert find_fact("Capital of France?") == "Paris"
    assert find_fact("capital") == "Paris"  # a vague key still gets the first fact that contains it
    assert find_fact("boiling point of water at sea level") == "100 degrees Celsius"
    assert len(CAPITALS) > 150


def test_suite_tasks_that_share_an_id_with_the_hand_written_ones_are_the_same_task(tasks: list[SuiteTask]) -> None:
    by_id = {t.task_id: t for t in tasks}
    shared = [t for t in TASKS if t.task_id in by_id]
    assert shared  # cap-france, cap-japan
    for t in shared:
        assert (by_id[t.task_id].query, by_id[t.task_id].answer) == (t.query, t.answer)


def test_annotate_records_suite_answers(tmp_path: Path, tasks: list[SuiteTask]) -> None:
    from flowrl.store.files import TraceStore
    from flowrl.trace.schema import ExecutionTrace

    calc = next(t for t in tasks if t.kind == "calc")
    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(trace_id="a", user_query=calc.query.lower().rstrip("?."), reward_score=1.0))
    store.write(ExecutionTrace(trace_id="b", user_query=TASKS[0].query))
    assert annotate(store, tasks) == 1
    a = store.get("a")
    assert (a.metadata["reference_answer"], a.group_key, a.reward_score) == (calc.answer, calc.task_id, None)
    assert "reference_answer" not in store.get("b").metadata
    assert annotate(store) == 1  # the default is still the hand-written tasks
    assert annotate(store, tasks) == 0


def test_the_docs_table_matches_the_suite(tasks: list[SuiteTask], parts: tuple[list, list]) -> None:
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text(encoding="utf-8")
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^\| (\w+) \| (\d+) \| (\d+) \|", doc, re.M)}
    held = Counter(t.kind for t in parts[1])
    assert rows == {k: (c, held[k]) for k, c in Counter(t.kind for t in tasks).items()}
    stems = Counter(t.task_id.split("-")[0] for t in tasks if t.kind == "lookup")
    assert f"capitals ({stems['cap']}), atomic numbers ({stems['anum']}), chemical symbols ({stems['sym']})" in doc
    assert f"whole-number facts ({stems['count']})" in doc
