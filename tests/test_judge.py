"""LLMJudgeReward against a real OpenAI-compatible HTTP server on 127.0.0.1, started by the test."""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flowrl.errors import ConfigError
from flowrl.rewards.config import load_config
from flowrl.rewards.judge import LLMJudgeReward
from flowrl.rewards.judge_client import JudgeClient, extract_json
from flowrl.trace.schema import ExecutionTrace

_TRAJ = re.compile(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', re.DOTALL)


class FakeJudge:
    """Speaks POST /v1/chat/completions. Scores a trajectory 0.2 when it contains "Error", else 0.9.

    behaviour: "ok", "fail" (503 always), "flaky" (503 for the first `fail_first` requests), "slow" (sleeps
    `delay` seconds first), "garbage" (a reply that is not JSON), "no_json_mode" (400 when response_format is
    sent), "fenced" (the JSON inside a ```json fence).
    """

    def __init__(self, behaviour: str = "ok", fail_first: int = 0, delay: float = 0.0) -> None:
        self.behaviour, self.fail_first, self.delay = behaviour, fail_first, delay
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.requests.append(body)
                    judge.headers.append(dict(self.headers))
                    n = len(judge.requests)
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": "not found"})
                if judge.behaviour == "fail" or (judge.behaviour == "flaky" and n <= judge.fail_first):
                    return self._send(503, {"error": {"message": "overloaded"}})
                if judge.behaviour == "no_json_mode" and "response_format" in body:
                    return self._send(400, {"error": {"message": "response_format is not supported"}})
                if judge.behaviour == "slow":
                    time.sleep(judge.delay)
                content = judge.reply(body)
                if judge.behaviour == "garbage":
                    content = "They all look great to me!"
                elif judge.behaviour == "fenced":
                    content = "```json\n" + content + "\n```"
                self._send(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                    },
                )

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @staticmethod
    def reply(body: dict) -> str:
        user = body["messages"][-1]["content"]
        trajectories = _TRAJ.findall(user)
        if trajectories:
            return json.dumps(
                {
                    "scores": [
                        {"trajectory_id": i, "explanation": "looked at it", "score": 0.2 if "Error" in text else 0.9}
                        for i, text in trajectories
                    ]
                }
            )
        return json.dumps({"explanation": "single", "score": 0.2 if "Error" in user else 0.9})

    def trajectory_entries(self, index: int = -1) -> list[str]:
        return [text for _, text in _TRAJ.findall(self.requests[index]["messages"][-1]["content"])]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in (
        "FLOWRL_JUDGE_BASE_URL",
        "FLOWRL_JUDGE_MODEL",
        "FLOWRL_JUDGE_API_KEY",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
    ):
        monkeypatch.delenv(name, raising=False)


def judge(server: FakeJudge, **kw) -> LLMJudgeReward:
    kw.setdefault("backoff_s", 0.01)
    return LLMJudgeReward(base_url=server.url, model="fake-judge", **kw)


SYSTEM = {"role": "system", "content": "You are a weather agent. " * 20}
USER = {"role": "user", "content": "Weather in Rome?"}


def run(answer: str, tool_result: str = "Rome: 25C") -> ExecutionTrace:
    return ExecutionTrace(
        user_query="Weather in Rome?",
        final_response=answer,
        messages=[
            SYSTEM,
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": tool_result},
            {"role": "assistant", "content": answer},
        ],
    )


def test_relative_group_one_call_shared_prefix_sent_once():
    traces = [run("It is 25C in Rome."), run("No idea.", "Error executing get_weather: down"), run("Sunny, 25C.")]
    with FakeJudge() as server:
        results = judge(server).score_batch(traces)
    assert len(server.requests) == 1
    user = server.requests[0]["messages"][-1]["content"]
    assert user.count("You are a weather agent.") == 20  # the system prompt appears once, in <context>
    assert user.index("<context>") < user.index("Weather in Rome?") < user.index("<trajectories>")
    entries = server.trajectory_entries()
    assert len(entries) == 3 and all("Weather in Rome?" not in e for e in entries)
    assert [r.value for r in results] == [0.9, 0.2, 0.9]
    assert results[0].details["mode"] == "relative" and results[0].details["explanation"] == "looked at it"
    assert server.requests[0]["model"] == "fake-judge"
    assert server.requests[0]["response_format"] == {"type": "json_object"}


def test_identical_traces_scored_once():
    a, b = run("It is 25C in Rome."), run("No idea.", "Error executing get_weather: down")
    twin = run("It is 25C in Rome.")
    with FakeJudge() as server:
        results = judge(server).score_batch([a, b, twin])
    assert len(server.requests) == 1
    assert len(server.trajectory_entries()) == 2  # the server saw one entry for the two identical traces
    assert results[0].value == results[2].value == 0.9
    assert results[0].details["identical_traces"] == 2


def test_all_identical_group_sends_one_trajectory():
    with FakeJudge() as server:
        results = judge(server).score_batch([run("x"), run("x"), run("x")])
    assert len(server.trajectory_entries()) == 1
    assert [r.value for r in results] == [0.9, 0.9, 0.9]


def test_different_tasks_go_in_different_calls():
    other = ExecutionTrace(
        user_query="Weather in Oslo?",
        final_response="Cold.",
        messages=[USER | {"content": "Weather in Oslo?"}, {"role": "assistant", "content": "Cold."}],
    )
    with FakeJudge() as server:
        results = judge(server).score_batch([run("a"), other, run("b")])
    assert len(server.requests) == 2
    assert all(r.value == 0.9 for r in results)


def test_cache_hit_on_second_call(tmp_path):
    traces = [run("a"), run("b")]
    with FakeJudge() as server:
        reward = judge(server, cache_dir=tmp_path / "cache")
        first = reward.score_batch(traces)
        second = reward.score_batch(traces)
        assert len(server.requests) == 1
        assert reward.stats["cache_hits"] == 1
        assert [r.value for r in first] == [r.value for r in second]
        assert second[0].details["cached"] is True and first[0].details["cached"] is False
        # a new judge with the same cache folder reads the disk cache: still no new request
        again = judge(server, cache_dir=tmp_path / "cache").score_batch(traces)
        assert len(server.requests) == 1 and again[1].value == first[1].value


def test_changed_content_is_not_a_cache_hit():
    with FakeJudge() as server:
        reward = judge(server)
        reward.score_batch([run("a"), run("b")])
        reward.score_batch([run("a"), run("c")])
    assert len(server.requests) == 2


def test_timeout_gives_none_and_retries_are_counted():
    with FakeJudge("slow", delay=1.5) as server:
        reward = judge(server, timeout_s=0.2, max_retries=1)
        t0 = time.monotonic()
        result = reward.score(run("a"))
        elapsed = time.monotonic() - t0
    assert result.value is None and "error" in result.details
    assert reward.stats["retries"] == 1 and reward.stats["failures"] == 1
    assert len(server.requests) == 2
    assert elapsed < 2 * 1.5  # waiting out the slow judge twice would take 3 s; the timeouts take 0.4 s (room for load)


def test_retries_with_backoff_then_success():
    slept: list[float] = []
    with FakeJudge("flaky", fail_first=2) as server:
        client = JudgeClient(server.url, "fake-judge", max_retries=3, backoff_s=0.5, sleep=slept.append)
        reward = LLMJudgeReward(client=client)
        result = reward.score(run("a"))
    assert result.value == 0.9
    assert reward.stats["retries"] == 2 and len(server.requests) == 3
    assert slept == [0.5, 1.0]  # exponential backoff


def test_server_error_every_time_gives_none():
    with FakeJudge("fail") as server:
        reward = judge(server, max_retries=2)
        results = reward.score_batch([run("a"), run("b")])
    assert [r.value for r in results] == [None, None]
    assert "HTTP 503" in results[0].details["error"]
    assert len(server.requests) == 3 and reward.stats["failures"] == 1


def test_unparseable_reply_is_retried_then_none():
    with FakeJudge("garbage") as server:
        reward = judge(server, max_retries=1)
        result = reward.score(run("a"))
    assert result.value is None and "unusable judge reply" in result.details["error"]
    assert len(server.requests) == 2


def test_fenced_json_reply_is_read():
    with FakeJudge("fenced") as server:
        assert judge(server).score(run("a")).value == 0.9


def test_server_without_json_mode_is_asked_again_without_it():
    with FakeJudge("no_json_mode") as server:
        result = judge(server).score(run("a"))
    assert result.value == 0.9
    assert "response_format" in server.requests[0] and "response_format" not in server.requests[1]


def test_unreachable_endpoint_gives_none():
    with FakeJudge() as server:
        url = server.url
    reward = LLMJudgeReward(base_url=url, model="m", timeout_s=0.5, max_retries=1, backoff_s=0.01)
    result = reward.score(run("a"))
    assert result.value is None and "cannot reach" in result.details["error"]


def test_absolute_mode_one_call_per_unique_trace():
    with FakeJudge() as server:
        reward = judge(server, mode="absolute")
        results = reward.score_batch([run("a"), run("b", "Error: down"), run("a")])
    assert len(server.requests) == 2
    assert [r.value for r in results] == [0.9, 0.2, 0.9]
    assert results[0].details["mode"] == "absolute"
    assert "<trajectory>" in server.requests[0]["messages"][-1]["content"]


def test_no_model_gives_none_without_a_request():
    with FakeJudge() as server:
        result = LLMJudgeReward(base_url=server.url).score(run("a"))
    assert result.value is None and "FLOWRL_JUDGE_MODEL" in result.details["error"]
    assert server.requests == []


def test_settings_from_environment(monkeypatch):
    with FakeJudge() as server:
        monkeypatch.setenv("FLOWRL_JUDGE_BASE_URL", server.url)
        monkeypatch.setenv("FLOWRL_JUDGE_MODEL", "env-model")
        monkeypatch.setenv("FLOWRL_JUDGE_API_KEY", "sk-flowrl")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
        assert LLMJudgeReward().score(run("a")).value == 0.9
    assert server.requests[0]["model"] == "env-model"
    assert server.headers[0]["Authorization"] == "Bearer sk-flowrl"


def test_openai_variables_are_the_fallback(monkeypatch):
    with FakeJudge() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
        assert LLMJudgeReward(model="m").score(run("a")).value == 0.9
    assert server.headers[0]["Authorization"] == "Bearer sk-openai"


def test_no_key_sends_no_authorization_header():
    with FakeJudge() as server:
        judge(server).score(run("a"))
    assert "Authorization" not in server.headers[0]


def test_judge_as_grpo_reward_func_one_call_per_prompt():
    prompts = [[{"role": "user", "content": "Weather in Rome?"}]] * 3
    completions = [
        [{"role": "assistant", "content": "25C"}],
        [{"role": "assistant", "content": "Error: no"}],
        [{"role": "assistant", "content": "25C"}],
    ]
    with FakeJudge() as server:
        out = judge(server).as_reward_func()(prompts=prompts, completions=completions, completion_ids=[[1]] * 3)
    assert out == [0.9, 0.2, 0.9]
    assert len(server.requests) == 1 and len(server.trajectory_entries()) == 2


def test_traces_without_messages_are_rebuilt_for_the_judge():
    t = ExecutionTrace(
        user_query="sum of squares",
        final_response="385",
        tool_calls=[{"tool_name": "exec_code", "arguments": {"code": "print(385)"}, "result": "385"}],
    )
    with FakeJudge() as server:
        assert judge(server, mode="absolute").score(t).value == 0.9
    user = server.requests[0]["messages"][-1]["content"]
    assert "exec_code" in user and "sum of squares" in user


def test_extract_json_variants():
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('Here you go: {"a": {"b": 2}} hope that helps') == {"a": {"b": 2}}
    with pytest.raises(ValueError):
        extract_json("no json here")


def test_judge_options_are_its_clients_declared_once(tmp_path):
    """The reward's signature (what `help()` shows and reward configs are checked against) is its own options then
    `JudgeClient`'s keywords, without `sleep`; a TOML key of either kind reaches the right place."""
    reward_options = set(inspect.signature(LLMJudgeReward).parameters)
    client_options = set(inspect.signature(JudgeClient).parameters) - {"sleep"}
    assert client_options <= reward_options and "sleep" not in reward_options
    assert {"mode", "rubric", "max_group_size", "max_chars_per_message", "concurrency"} <= reward_options

    path = tmp_path / "rewards.toml"
    path.write_text("[rewards.judge]\nmodel = 'm'\nmode = 'absolute'\ntimeout_s = 5\nmax_retries = 1\n")
    reward = LLMJudgeReward(**load_config(path).rewards["judge"].options)
    assert reward.mode == "absolute"
    assert (reward.client.model, reward.client.timeout_s, reward.client.max_retries) == ("m", 5, 1)
    for key in ("sleep", "timeout"):
        path.write_text(f"[rewards.judge]\nmodel = 'm'\n{key} = 1\n")
        with pytest.raises(ConfigError, match=f"rewards.judge.{key}: the judge reward has no option"):
            load_config(path)


def test_a_client_given_wins_over_client_options():
    client = JudgeClient("http://127.0.0.1:9/v1", "given")
    assert LLMJudgeReward(client=client, model="ignored").client is client
