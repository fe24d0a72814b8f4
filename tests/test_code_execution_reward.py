"""CodeExecutionReward: which code it runs, how it scores, None for "cannot judge", GRPO use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.errors import SandboxError
from flowrl.rewards.code_execution import CodeBlock, CodeExecutionReward, fenced_blocks
from flowrl.rewards.sandbox import ExecResult, Sandbox
from flowrl.trace.load import load_trace
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

FIXTURES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout=2.0) as sb:
        yield sb


@pytest.fixture(scope="module")
def reward(sandbox):
    return CodeExecutionReward(timeout=2.0, sandbox=sandbox)


class FakeSandbox:
    """Records the jobs and answers with canned results (no processes)."""

    def __init__(self, status_for=lambda job: "ok"):
        self.calls: list[list] = []
        self.status_for = status_for
        self.closed = False

    def run_many(self, jobs):
        jobs = list(jobs)
        self.calls.append(jobs)
        return [
            ExecResult(
                self.status_for(j),
                exit_code=0 if self.status_for(j) == "ok" else 1,
                language=j.language,
                isolation="bwrap",
                error="worker died" if self.status_for(j) == "infra_error" else None,
            )
            for j in jobs
        ]

    def close(self):
        self.closed = True


def call(tool: str, **arguments) -> ToolCallTrace:
    return ToolCallTrace(tool_name=tool, arguments=arguments)


def test_flowagent_traces_score_what_their_exec_code_calls_did(reward):
    traces = {p.stem: load_trace(json.loads(p.read_text()), origin=str(p)) for p in FIXTURES.glob("*/*.json")}
    results = dict(zip(traces, reward.score_batch(traces.values())))
    assert results["0498911e921f"].value == 1.0  # sum of squares, ran cleanly
    assert results["0498911e921f"].details["blocks"][0]["stdout"] == "385\n"
    assert results["eb4f7d6913ae"].value == 0.5  # one IndexError, one clean rerun
    assert "IndexError" in results["eb4f7d6913ae"].details["blocks"][0]["stderr"]
    assert results["2a86d8ba994f"].value is None  # no code: cannot judge


def test_all_clean_is_one_all_failing_is_zero(reward):
    ok = ExecutionTrace(tool_calls=[call("exec_code", code="print(1)"), call("bash", command="true")])
    bad = ExecutionTrace(tool_calls=[call("exec_code", code="raise ValueError('x')"), call("shell", command="exit 2")])
    assert reward.score(ok).value == 1.0
    result = reward.score(bad)
    assert result.value == 0.0
    assert [b["status"] for b in result.details["blocks"]] == ["error", "error"]
    assert [b["exit_code"] for b in result.details["blocks"]] == [1, 2]


def test_timeout_counts_as_failure(sandbox):
    quick = CodeExecutionReward(timeout=0.5, sandbox=sandbox)
    result = quick.score(ExecutionTrace(tool_calls=[call("python", code="import time; time.sleep(5)")]))
    assert result.value == 0.0 and result.details["blocks"][0]["status"] == "timeout"


def test_no_code_is_none_not_zero(reward):
    trace = ExecutionTrace(tool_calls=[call("web_search", query="x")], final_response="```python\nprint(1)\n```")
    result = reward.score(trace)
    assert result.value is None and result.details["reason"] == "no code to run"


def test_sandbox_failure_is_none_not_zero():
    fake = FakeSandbox(lambda job: "infra_error" if "boom" in job.code else "ok")
    reward = CodeExecutionReward(sandbox=fake)
    result = reward.score(
        ExecutionTrace(tool_calls=[call("exec_code", code="print(1)"), call("exec_code", code="boom")])
    )
    assert result.value is None and "sandbox failure" in result.details["reason"]


def test_details_per_block(reward):
    result = reward.score(ExecutionTrace(tool_calls=[call("run_python", code="print('hi')")]))
    block = result.details["blocks"][0]
    assert block["origin"] == "tool_calls[0]:run_python"
    assert block["language"] == "python" and block["status"] == "ok" and block["exit_code"] == 0
    assert block["stdout"] == "hi\n" and block["stderr"] == "" and block["duration"] > 0
    assert result.details["isolation"] in ("bwrap", "unshare", "rlimits")


def test_details_output_is_capped(sandbox):
    small = CodeExecutionReward(sandbox=sandbox, details_chars=10)
    block = small.score(ExecutionTrace(tool_calls=[call("exec_code", code="print('x' * 100)")])).details["blocks"][0]
    assert len(block["stdout"]) == 10 and block["stdout_truncated"]


def test_tool_names_code_keys_and_languages():
    reward = CodeExecutionReward(sandbox=FakeSandbox())
    trace = ExecutionTrace(
        tool_calls=[
            call("exec_code", code="print(1)"),
            call("execute_code", source="print(2)"),
            call("exec_code", command="ls"),  # `command` means shell
            call("exec_code", code="console.log(1)", language="javascript"),  # not runnable: not judged
            call("exec_code", code="echo hi", language="bash"),
            call("run_shell", script="echo 3"),
            call("functions.python", code="print(4)"),
            call("search", code="print(5)"),  # not an exec tool
            call("exec_code", code="   "),  # empty
        ]
    )
    blocks = reward.extract_blocks(trace)
    assert [(b.language, b.code) for b in blocks] == [
        ("python", "print(1)"),
        ("python", "print(2)"),
        ("bash", "ls"),
        ("bash", "echo hi"),
        ("bash", "echo 3"),
        ("python", "print(4)"),
    ]
    custom = CodeExecutionReward(sandbox=FakeSandbox(), tool_names=["my_runner"], code_keys=["snippet"])
    assert custom.extract_blocks(ExecutionTrace(tool_calls=[call("my_runner", snippet="print(1)")])) == [
        CodeBlock("python", "print(1)", "tool_calls[0]:my_runner")
    ]


def test_json_string_and_bare_string_arguments():
    reward = CodeExecutionReward(sandbox=FakeSandbox())
    trace = ExecutionTrace(
        tool_calls=[
            ToolCallTrace(tool_name="exec_code", arguments=json.dumps({"code": "print(1)"})),
            ToolCallTrace(tool_name="bash", arguments="echo raw"),
        ]
    )
    assert [(b.language, b.code) for b in reward.extract_blocks(trace)] == [
        ("python", "print(1)"),
        ("bash", "echo raw"),
    ]


def test_answer_blocks_only_when_asked():
    answer = "Here:\n```python\nprint(1)\n```\nand\n```bash\necho 2\n```\n```\nuntagged\n```\n```json\n{}\n```"
    trace = ExecutionTrace(final_response=answer)
    assert CodeExecutionReward(sandbox=FakeSandbox()).extract_blocks(trace) == []
    blocks = CodeExecutionReward(include_answer_blocks=True, sandbox=FakeSandbox()).extract_blocks(trace)
    assert [(b.language, b.code, b.origin) for b in blocks] == [
        ("python", "print(1)\n", "final_response[0]"),
        ("bash", "echo 2\n", "final_response[1]"),
    ]
    assert fenced_blocks("```py\nx = 1\n```\n```sh\nls\n```") == [
        CodeBlock("python", "x = 1\n", "final_response[0]"),
        CodeBlock("bash", "ls\n", "final_response[1]"),
    ]


def test_answer_blocks_are_judged(reward, sandbox):
    trace = ExecutionTrace(final_response="```python\nprint(1)\n```\n```python\n1/0\n```")
    assert reward.score(trace).value is None  # not asked: no code
    assert CodeExecutionReward(include_answer_blocks=True, sandbox=sandbox).score(trace).value == 0.5


def test_tool_calls_from_messages_when_the_trace_has_none():
    messages = [
        {"role": "user", "content": "sum"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "exec_code", "arguments": '{"code": "print(1)"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
    ]
    reward = CodeExecutionReward(sandbox=FakeSandbox())
    assert [b.code for b in reward.extract_blocks(ExecutionTrace(messages=messages))] == ["print(1)"]
    # a trace with tool_calls is judged on those alone (its messages repeat them)
    both = ExecutionTrace(messages=messages, tool_calls=[call("exec_code", code="print(2)")])
    assert [b.code for b in reward.extract_blocks(both)] == ["print(2)"]


def test_score_batch_runs_all_blocks_in_one_pool_call():
    fake = FakeSandbox(lambda job: "error" if "bad" in job.code else "ok")
    reward = CodeExecutionReward(sandbox=fake)
    traces = [
        ExecutionTrace(tool_calls=[call("exec_code", code="good"), call("exec_code", code="bad")]),
        ExecutionTrace(),
        ExecutionTrace(tool_calls=[call("exec_code", code="good")]),
        ExecutionTrace(tool_calls=[call("exec_code", code="bad")]),
    ]
    values = [r.value for r in reward.score_batch(traces)]
    assert values == [0.5, None, 1.0, 0.0]
    assert len(fake.calls) == 1 and len(fake.calls[0]) == 4


def test_max_blocks_caps_the_work():
    fake = FakeSandbox()
    reward = CodeExecutionReward(sandbox=fake, max_blocks=2)
    result = reward.score(ExecutionTrace(tool_calls=[call("exec_code", code=f"print({i})") for i in range(5)]))
    assert result.value == 1.0 and result.details["skipped_blocks"] == 3
    assert len(fake.calls[0]) == 2


def test_grpo_reward_func_judges_fresh_completions(reward):
    func = reward.as_reward_func()
    tool_call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "exec_code", "arguments": '{"code": "import sys; sys.exit(2)"}'}}
        ],
    }
    values = func(
        ["q1", "q2", "q3", [{"role": "user", "content": "q4"}]],
        ["```python\nprint(1)\n```", "no code at all", "```bash\nexit 1\n```", [tool_call]],
    )
    assert values == [1.0, None, 0.0, 0.0]
    assert func.__name__ == "flowrl_code_execution"


def test_constructible_with_no_arguments_and_closes_its_own_sandbox():
    reward = CodeExecutionReward()
    assert reward.score(ExecutionTrace(tool_calls=[call("exec_code", code="print(1)")])).value == 1.0
    sandbox = reward.sandbox
    reward.close()
    with pytest.raises(SandboxError):
        sandbox.run("pass")
    shared = FakeSandbox()
    with CodeExecutionReward(sandbox=shared):
        pass
    assert not shared.closed  # a sandbox passed in belongs to the caller


def test_unknown_sandbox_options_are_refused_at_once():
    with pytest.raises(TypeError, match="memory_gb"):
        CodeExecutionReward(sandbox_options={"memory_gb": 1})
    with pytest.raises(TypeError, match="timeout"):
        CodeExecutionReward(sandbox_options={"timeout": 1})
    reward = CodeExecutionReward(sandbox_options={"max_output": 1024, "recycle_after": 10})
    assert reward._sandbox is None  # nothing started until there is code to run
