"""Outcomes from the host (issue 22): the host says how a run went, during the run or later, and that is what
the rewards, the labels and the datasets read; it survives `flowrl score --all`.

The done-when case: a plain agent of the user's own (a class with `run` and an LLM method) answers `12*7` with
85 and the capital question with "I don't know."; before outcomes both were labelled good with score 1.00."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from flowrl import HostOutcome, current_run, hook_into_agent
from flowrl.cli import main
from flowrl.data.base import effective_label
from flowrl.errors import ConfigError
from flowrl.store.files import TraceStore
from flowrl.store.outcomes import OUTCOMES
from flowrl.trace.facts import label_at, reference, run_outcome
from flowrl.trace.outcomes import make_outcome, merge, parse_reward
from flowrl.trace.schema import ExecutionTrace

ANSWERS = {"What is 12*7?": "12*7 = 85", "What is the capital of Peru?": "I don't know.", "What is 2+2?": "4"}
KNOWN = {"What is 12*7?": "84", "What is 2+2?": "4"}  # what the host's application knows


class UserAgent:
    """A user's own agent: no FlowAgent, no transcript."""

    async def llm(self, prompt: str) -> str:
        return ANSWERS[prompt]

    def lookup(self, query: str) -> str | None:
        return KNOWN.get(query)

    async def run(self, query: str) -> str:
        answer = await self.llm(query)
        # the host's own code, deep in a thread, knows the right answer: it says so for this run
        known = await asyncio.to_thread(self.lookup, query)
        if known is not None:
            handle = await asyncio.to_thread(current_run)
            assert handle is not None
            handle.record_outcome(reference=known, source="app")
        return answer


def capture(store) -> tuple[dict[str, str], object]:
    agent = UserAgent()  # kept alive with the hook (`hook.agent`): a collected agent ends its hook
    hook = hook_into_agent(agent, store=store, run_methods=["run"], llm_methods=["llm"])

    async def go() -> None:
        for query in ANSWERS:
            await agent.run(query)

    asyncio.run(go())
    assert hook.flush(10)
    ids = {t.user_query: t.trace_id for t in hook.store.iter_traces()}
    hook.agent = agent
    return ids, hook


def test_host_references_and_late_feedback_decide_scores_and_labels_and_survive_rescoring(tmp_path, capsys):
    root = tmp_path / "traces"
    ids, hook = capture(root)
    store = TraceStore(root)
    assert len(ids) == 3
    # later: the user rejects the capital answer, in the app's feedback handler
    assert hook.record_outcome(ids["What is the capital of Peru?"], success=False, feedback="useless", source="user")
    assert hook.flush(10)
    assert hook.stats.outcomes == 3 and hook.stats.outcome_errors == 0
    hook.unhook()

    assert main(["score", "--store", str(root), "--all"]) == 0
    wrong, dunno, right = (store.get(ids[q]) for q in ANSWERS)
    assert wrong.rewards["reference_answer"] == 0.0 and reference(wrong).source == "host"
    assert wrong.label is False and effective_label(wrong)[0] is False
    assert right.rewards["reference_answer"] == 1.0 and effective_label(right)[0] is True
    assert dunno.rewards["host_outcome"] == 0.0 and run_outcome(dunno).source == "host"
    assert label_at(dunno) == (False, "host") and dunno.reward_score < 0.5

    # re-scoring rewrites every trace file; the outcomes are side records and stay
    assert main(["score", "--store", str(root), "--all"]) == 0
    again = store.get(ids["What is the capital of Peru?"])
    assert [o.feedback for o in again.outcomes] == ["useless"] and label_at(again) == (False, "host")
    assert store.get(ids["What is 12*7?"]).outcomes[0].reference == "84"
    stored = json.loads((next(root.glob(f"*/{ids['What is 12*7?']}.json"))).read_text())
    assert "outcomes" not in stored  # never inside the trace file


def test_a_late_outcome_makes_plain_score_rescore_that_trace(tmp_path):
    root = tmp_path / "traces"
    ids, hook = capture(root)
    hook.unhook()
    assert main(["score", "--store", str(root)]) == 0
    store = TraceStore(root)
    right = ids["What is 2+2?"]
    assert store.get(right).label is True
    store.record_outcome(right, success=False, source="test", feedback="the tests failed")
    assert label_at(store.get(right)) == (False, "host")  # at once, before any re-score
    assert main(["score", "--store", str(root)]) == 0  # no --all: it was rescored for its new outcome
    trace = store.get(right)
    assert trace.rewards["host_outcome"] == 0.0 and trace.label is False


def test_only_a_manual_label_outranks_the_host(tmp_path):
    store = TraceStore(tmp_path)
    trace = ExecutionTrace(user_query="q", final_response="a", reward_score=0.95, label=True, label_source="engine")
    store.write(trace)
    store.record_outcome(trace.trace_id, success=False)
    assert label_at(store.get(trace.trace_id)) == (False, "host")
    store.label(trace.trace_id, True, "a person read it")
    assert label_at(store.get(trace.trace_id)) == (True, "manual")


def test_current_run_is_the_same_run_in_tools_and_threads_and_none_outside():
    seen: list[str | None] = []

    class Agent:
        def tool(self) -> None:
            seen.append(current_run().trace_id)

        async def run(self, query: str) -> str:
            seen.append(current_run().trace_id)
            self.tool()
            await asyncio.to_thread(lambda: seen.append(current_run().trace_id))
            return "ok"

    agent = Agent()
    with hook_into_agent(agent, store=None, run_methods=["run"], tool_methods=["tool"]) as hook:
        asyncio.run(agent.run("x"))
        assert hook.flush(10)
        (trace,) = list(hook.store.iter_traces())
    assert seen == [trace.trace_id] * 3 and current_run() is None


def test_bad_outcomes_and_a_store_that_refuses_never_reach_the_host(tmp_path, caplog):
    class Agent:
        async def run(self, query: str) -> str:
            run = current_run()
            assert run.record_outcome(success="yes") is False  # not a bool: counted, logged, the run goes on
            assert run.record_outcome(rewards={"tests": 2}) is False
            assert run.record_outcome(feedback="fine") is True
            return "done"

    root = tmp_path / "traces"
    agent = Agent()
    hook = hook_into_agent(agent, store=root, run_methods=["run"])
    assert asyncio.run(agent.run("x")) == "done"
    assert hook.flush(10)
    assert hook.stats.outcome_errors == 2 and hook.stats.written == 1
    assert "a host reward is a number from 0 to 1" in caplog.text and "Traceback" not in caplog.text
    assert hook.record_outcome("../../etc/passwd", success=True) is False
    # the outcomes folder cannot be written: the outcome fails (counted), nothing is raised
    (trace,) = list(hook.store.iter_traces())
    (root / OUTCOMES / f"{trace.trace_id}.jsonl").unlink()
    (root / OUTCOMES).rmdir()
    (root / OUTCOMES).write_text("not a folder")
    assert hook.record_outcome(trace.trace_id, success=True) is True  # accepted; the writer then fails it
    hook.flush(10)
    assert hook.stats.outcome_errors == 4
    hook.unhook()


def test_outcomes_are_masked_like_traces(tmp_path):
    class Agent:
        async def run(self, query: str) -> str:
            current_run().record_outcome(feedback="my key is sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6")
            return "ok"

    root = tmp_path / "traces"
    agent = Agent()
    with hook_into_agent(agent, store=root, run_methods=["run"]) as hook:
        asyncio.run(agent.run("x"))
        assert hook.flush(10)
        (trace,) = list(hook.store.iter_traces())
        assert hook.record_outcome(trace.trace_id, feedback="token ghp_" + "a" * 36) and hook.flush(10)
    raw = (root / OUTCOMES / f"{trace.trace_id}.jsonl").read_text()
    assert "A1b2C3d4E5f6" not in raw and "ghp_aaaa" not in raw and raw.count("\n") == 2


def test_annotate_cli_records_and_show_prints_outcomes(tmp_path, capsys):
    store = TraceStore(tmp_path)
    trace = ExecutionTrace(user_query="What is 2+2?", final_response="5")
    store.write(trace)
    argv = [
        "traces",
        "annotate",
        trace.trace_id,
        "--reference",
        "4",
        "--failure",
        "--reward",
        "tests=0.25",
        "--feedback",
        "wrong",
        "--source",
        "test",
        "--store",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert "annotated" in capsys.readouterr().out
    assert main(["traces", "show", trace.trace_id, "--store", str(tmp_path)]) == 0
    (outcome,) = json.loads(capsys.readouterr().out)["outcomes"]
    assert outcome["reference"] == "4" and outcome["success"] is False and outcome["rewards"] == {"tests": 0.25}
    assert outcome["source"] == "test" and outcome["feedback"] == "wrong"
    for bad, says in (
        (["--reward", "tests"], "use name=value"),
        (["--reward", "tests=7"], "from 0 to 1"),
        ([], "needs at least one of"),
        (["--success", "--source", "a b"], "short name"),
    ):
        assert main(["traces", "annotate", trace.trace_id, *bad, "--store", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["traces", "annotate", "nope", "--success", "--store", str(tmp_path)]) == 2
    assert "no trace 'nope'" in capsys.readouterr().err


def test_foreign_and_corrupt_outcome_records_are_skipped_and_reported(tmp_path):
    store = TraceStore(tmp_path)
    trace = ExecutionTrace(user_query="q", final_response="a")
    store.write(trace)
    store.record_outcome(trace.trace_id, reference="a")
    path = tmp_path / OUTCOMES / f"{trace.trace_id}.jsonl"
    with path.open("a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"trace_id": "someone-else", "success": True}) + "\n")
        fh.write(json.dumps({"trace_id": trace.trace_id, "success": "perhaps"}) + "\n")
        fh.write(json.dumps([1, 2]) + "\n")
        fh.write(json.dumps({"trace_id": trace.trace_id, "success": True}))  # no newline: being appended
    (tmp_path / OUTCOMES / "foreign.txt").write_text("x")
    with store.operation() as problems:
        (read,) = list(store.iter_traces())
    # the last line is whole JSON (an append in progress would not parse): it counts
    assert [o.reference for o in read.outcomes] == ["a", None] and merge(read.outcomes).success is True
    assert [p.path for p in problems] == [path]  # reported once per file, as every store read problem


def test_an_outcome_file_behind_a_link_is_not_followed(tmp_path):
    store = TraceStore(tmp_path / "store")
    trace = ExecutionTrace(user_query="q", final_response="a")
    store.write(trace)
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"trace_id": trace.trace_id, "success": True}) + "\n")
    (tmp_path / "store" / OUTCOMES).mkdir()
    os.symlink(outside, tmp_path / "store" / OUTCOMES / f"{trace.trace_id}.jsonl")
    assert store.get(trace.trace_id).outcomes == []
    with pytest.raises(Exception, match="link"):
        store.record_outcome(trace.trace_id, success=False)
    assert outside.read_text().count("\n") == 1  # nothing written through the link


def test_merge_last_value_wins_and_feedback_accumulates():
    a = make_outcome(reference="4", rewards={"tests": 0.5, "style": 1.0}, feedback="first", source="test")
    b = make_outcome(success=True, rewards={"tests": 1.0}, feedback="second", source="user")
    c = make_outcome(reference="four", source="app")
    verdict = merge([a, b, c])
    assert verdict.reference == "four" and verdict.reference_by == "app"
    assert verdict.success is True and verdict.success_by == "user"
    assert verdict.rewards == {"tests": 1.0, "style": 1.0} and [f.text for f in verdict.feedback] == ["first", "second"]
    assert make_outcome(reference=84).reference == "84"
    assert isinstance(a, HostOutcome)
    with pytest.raises(ConfigError, match="True or False"):
        make_outcome(success=1)
    assert parse_reward("tests_passed=1") == ("tests_passed", 1.0)
