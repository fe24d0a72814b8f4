"""What `flowrl improve --agent MODULE:FACTORY --tasks FILE [--grade MODULE:FN]` reads: tasks, the split, the
default grade, and the user's objects, with one-line errors naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.errors import ConfigError
from flowrl.improve.user import Task, default_grade, load_object, load_tasks, split_tasks


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_tasks_load_and_bad_lines_name_the_file_and_line(tmp_path: Path) -> None:
    good = {"task_id": "a", "query": "2+2?", "answer": "4"}
    assert load_tasks(_write(tmp_path / "t.jsonl", [good, ""])) == [Task("a", "2+2?", "4")]
    with pytest.raises(ConfigError, match=r"t2.jsonl:2: not JSON"):
        load_tasks(_write(tmp_path / "t2.jsonl", [good, "{oops"]))
    with pytest.raises(ConfigError, match=r"t3.jsonl:1: a task needs task_id, query and answer"):
        load_tasks(_write(tmp_path / "t3.jsonl", [{"task_id": "a", "query": "q", "answer": 4}]))
    with pytest.raises(ConfigError, match=r"t4.jsonl:2: task_id 'a' repeats"):
        load_tasks(_write(tmp_path / "t4.jsonl", [good, good]))
    with pytest.raises(ConfigError, match="no tasks"):
        load_tasks(_write(tmp_path / "t5.jsonl", [""]))
    with pytest.raises(ConfigError, match="cannot be read"):
        load_tasks(tmp_path / "missing.jsonl")


def test_the_split_never_overlaps_and_does_not_depend_on_the_files_order() -> None:
    tasks = [Task(f"t{i}", f"q{i}", str(i)) for i in range(30)]
    train, held = split_tasks(tasks, None, None, seed=1)
    assert len(held) == 10 and len(train) == 20 and not {t.task_id for t in train} & {t.task_id for t in held}
    again = split_tasks(list(reversed(tasks)), None, None, seed=1)
    assert again == (train, held)
    assert split_tasks(tasks, None, None, seed=2) != (train, held)
    small_train, small_held = split_tasks(tasks, 5, 4, seed=1)
    assert small_held == held[:4] and len(small_train) == 5
    with pytest.raises(ConfigError, match="the file has 30 tasks"):
        split_tasks(tasks, 25, 10)


@pytest.mark.parametrize(
    ("reference", "answer", "right"),
    [
        ("4", "The answer is 4.", True),
        ("4", "4", True),
        ("4", "It is 42.", False),
        ("4", "about 4.5", False),
        ("4", "(4)", True),
        ("Paris", "the capital is paris!", True),
        ("Paris", "Parisian", False),
        ("3.5", "it is 3.5 km", True),
        ("", "anything", False),
    ],
)
def test_the_default_grade_finds_the_answer_as_a_whole_word_or_number(reference: str, answer: str, right: bool) -> None:
    assert default_grade(Task("t", "q", reference), answer) is right


def test_user_objects_load_from_a_module_or_a_file(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text("def make(policy):\n    return policy\nNOT_CALLABLE = 1\n")
    assert load_object(f"{tmp_path / 'my_agent.py'}:make", "--agent")("p") == "p"
    assert load_object("json:dumps", "--grade") is json.dumps
    with pytest.raises(ConfigError, match="use MODULE:NAME"):
        load_object("no_colon", "--agent")
    with pytest.raises(ConfigError, match="cannot import"):
        load_object("no_such_module_5c1e:f", "--agent")
    with pytest.raises(ConfigError, match="has no callable 'NOT_CALLABLE'"):
        load_object(f"{tmp_path / 'my_agent.py'}:NOT_CALLABLE", "--agent")


def test_default_grade_is_the_reference_rewards_strict_rule() -> None:
    task = Task("t", "What is 12 * 7?", "84")
    assert default_grade(task, "12 * 7 = 84") and default_grade(task, "It is 84.0")
    assert not default_grade(task, "84 or 85") and not default_grade(task, "84. Actually, 85.")


def test_held_out_families_leave_training_and_join_the_held_out_set(tmp_path: Path) -> None:
    rows = [{"task_id": f"t{i}", "query": f"q{i}", "answer": str(i), "family": "ab"[i % 2]} for i in range(40)]
    tasks = load_tasks(_write(tmp_path / "t.jsonl", rows))
    train, held = split_tasks(tasks, None, 10, seed=1, hold_out=["b"], unseen=5)
    assert {t.family for t in train} == {"a"} and not {t.task_id for t in train} & {t.task_id for t in held}
    assert sum(t.family == "b" for t in held) == sum(t.family == "b" for t in held[:10]) + 5
    with pytest.raises(ConfigError, match="--hold-out-families c: no task has that family; the tasks have a, b"):
        split_tasks(tasks, None, 10, hold_out=["c"])
    with pytest.raises(ConfigError, match=r"family must be a string"):
        load_tasks(_write(tmp_path / "bad.jsonl", [{"task_id": "t", "query": "q", "answer": "1", "family": 3}]))


def test_the_example_suite_holds_out_whole_families() -> None:
    from flowrl.demo.example_agents import example_tasks
    from flowrl.demo.suite import FAMILIES, suite

    assert {t.family for t in suite(0)} == {f for fs in FAMILIES.values() for f in fs}
    train, held = example_tasks(200, 150, hold_out=["mulsub", "summul"], unseen=40)
    assert len(train) == 200 and not {t.family for t in train} & {"mulsub", "summul"}
    assert len(held) == 190 and sum(t.family in ("mulsub", "summul") for t in held) >= 40


def test_an_agent_file_shadowed_by_another_module_of_its_name_is_refused(tmp_path: Path) -> None:
    """`a/shadowed_agent.py:make` then `b/shadowed_agent.py:make`: the second was the first's module (imported by
    its bare name, found in sys.modules), so a user's agent could silently be another one; likewise `json.py`."""
    for folder, says in (("a", "first"), ("b", "second")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "shadowed_agent.py").write_text(f"def make(policy):\n    return {says!r}\n")
    assert load_object(f"{tmp_path / 'a' / 'shadowed_agent.py'}:make", "--agent")(None) == "first"
    with pytest.raises(
        ConfigError, match=r"the module shadowed_agent here is .*a/shadowed_agent.py, not .*b/shadowed_agent.py: rename"
    ):
        load_object(f"{tmp_path / 'b' / 'shadowed_agent.py'}:make", "--agent")
    (tmp_path / "json.py").write_text("def dumps(x):\n    return 'mine'\n")  # a name already imported elsewhere
    with pytest.raises(ConfigError, match="rename json.py"):
        load_object(f"{tmp_path / 'json.py'}:dumps", "--grade")
