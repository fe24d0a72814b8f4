"""`flowrl serve`: OpenAI requests rendered with the model's template and tools, tool calls parsed out of the
reply, token ids returned, errors as one clear message; and agents pointed at it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from flowrl.engines.chat_backend import TokensInBackend
from flowrl.serve.tool_calls import parse_reply, style_of
from tests.helpers_export import tiny_tokenizer

TEMPLATE = (Path(__file__).parent.parent / "flowrl" / "templates" / "smollm2_chatml.jinja").read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a fact up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]


class ScriptedBackend(TokensInBackend):
    """A backend whose model says the next scripted reply: the server's whole path runs, the weights do not."""

    def __init__(self, replies: list[str], template: str = TEMPLATE) -> None:
        tokenizer = tiny_tokenizer(template)
        super().__init__(".", tokenizer=tokenizer, temperature=0.0)
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        self.prompts.append(prompt)
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False)
        ids = ids[: self.max_new_tokens]
        if len(ids) < self.max_new_tokens:
            ids.append(self.tokenizer.eos_token_id)
        return ids, [-0.5] * len(ids)


@pytest.fixture
def served() -> Any:
    from flowrl.serve.model import ServedModel
    from flowrl.serve.server import start

    servers = []

    def make(replies: list[str], template: str = TEMPLATE, api_key: str | None = None) -> tuple[str, Any]:
        backend = ScriptedBackend(replies, template)
        server, _ = start(ServedModel(backend, name="tiny"), port=0, api_key=api_key)
        servers.append(server)
        return server.url, backend

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# -- parsing tool calls ------------------------------------------------------------------------------------------


def test_hermes_tool_calls_are_parsed_and_broken_ones_returned_as_text() -> None:
    reply = parse_reply(
        'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "capital of france"}}\n</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": {"key": "b"}}</tool_call>',
        "hermes",
    )
    assert reply.content == "Let me look."
    assert [json.loads(c["function"]["arguments"]) for c in reply.tool_calls] == [
        {"key": "capital of france"},
        {"key": "b"},
    ]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in reply.tool_calls)
    for broken in (
        '<tool_call>{"name": "lookup", "arguments": {"key": "a"',  # cut off by max_tokens
        "<tool_call>lookup(key='a')</tool_call>",  # not JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
    ):
        parsed = parse_reply(broken, "hermes")
        assert parsed.content == broken and not parsed.tool_calls and parsed.unparsed
    assert parse_reply("Paris.", "hermes").content == "Paris."


def test_llama3_json_calls_and_qwen3_thinking() -> None:
    call = parse_reply('<|python_tag|>{"name": "lookup", "parameters": {"key": "x"}}', "llama3")
    assert call.content is None and call.tool_calls[0]["function"]["name"] == "lookup"
    assert parse_reply("The answer is {not json", "llama3").content == "The answer is {not json"
    thought = parse_reply(
        '<think>\nneed a fact\n</think>\n\n<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "hermes"
    )
    assert thought.reasoning == "need a fact" and thought.content is None and len(thought.tool_calls) == 1


def test_style_is_read_off_the_template() -> None:
    trl = Path(__import__("trl").__file__).parent / "chat_templates"
    assert style_of(TEMPLATE) == "hermes"
    assert style_of((trl / "qwen2_5.jinja").read_text()) == "hermes"
    assert style_of((trl / "qwen3.jinja").read_text()) == "hermes"
    assert style_of((trl / "llama3_1.jinja").read_text()) == "llama3"
    assert style_of("{% for m in messages %}{{ m.content }}{% endfor %}") is None


# -- the server --------------------------------------------------------------------------------------------------


def test_openai_sdk_gets_tool_calls_token_ids_and_a_stream(served: Any) -> None:
    openai = pytest.importorskip("openai")
    url, backend = served(
        [
            '<tool_call>{"name": "lookup", "arguments": {"key": "capital of france"}}</tool_call>',
            "Paris.",
            '<tool_call>{"name": "lookup", "arguments": {"key": "b"}}</tool_call>',
        ]
    )
    client = openai.OpenAI(base_url=url, api_key="none")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Capital of France?"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, logprobs=True)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"key": "capital of france"}
    extra = first.model_extra or {}
    # what the model saw: the template rendered the tool definitions into the prompt
    seen = backend.tokenizer.decode(extra["prompt_token_ids"])
    assert '"name": "lookup"' in seen and "<tools>" in seen and seen.endswith("<|im_start|>assistant\n")
    assert extra["tokenizer"] == backend.fingerprint
    assert len(choice.model_extra["token_ids"]) == first.usage.completion_tokens
    assert [t.logprob for t in choice.logprobs.content] == [-0.5] * first.usage.completion_tokens

    # the tool call and its result go back; the sampled reply is put back as the ids that were sampled
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Paris"},
    ]
    second = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "Paris." and second.choices[0].finish_reason == "stop"
    prompt = second.model_extra["prompt_token_ids"]
    sampled = first.choices[0].model_extra["token_ids"]
    assert prompt[: len(extra["prompt_token_ids"]) + len(sampled)] == extra["prompt_token_ids"] + sampled
    assert "<tool_response>\nParis\n</tool_response>" in backend.tokenizer.decode(prompt)

    stream = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    calls = [c for chunk in chunks for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
    assert calls[0].function.name == "lookup" and json.loads(calls[0].function.arguments) == {"key": "b"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_a_template_without_tools_is_refused_not_silently_dropped(served: Any) -> None:
    plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    url, _ = served(["hi"], template=plain)
    status, body = _post(url + "/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS})
    assert status == 400 and "does not render tool definitions" in body["error"]["message"]
    status, body = _post(url + "/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "hi"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not JSON"),
        ([1, 2], 400, "JSON object"),
        ({"messages": []}, 400, "non-empty list"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n=1"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "temperature=9"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "text only"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens=0"),
    ],
)
def test_bad_requests_get_one_clear_message(served: Any, body: Any, status: int, words: str) -> None:
    url, _ = served(["never"])
    got, reply = _post(url + "/chat/completions", body)
    assert got == status and words in reply["error"]["message"]


def test_api_key_routes_and_stop_strings(served: Any) -> None:
    url, _ = served(["one. two. three.", "x"], api_key="s3cret")
    request = {"messages": [{"role": "user", "content": "count"}], "stop": ["two"]}
    assert _post(url + "/chat/completions", request)[0] == 401
    status, body = _post(url + "/chat/completions", request, {"Authorization": "Bearer s3cret"})
    assert status == 200 and body["choices"][0]["message"]["content"] == "one."
    assert body["usage"]["completion_tokens"] == len(body["choices"][0]["token_ids"]) < 10
    assert _post(url + "/completions", request, {"Authorization": "Bearer s3cret"})[0] == 404
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as response:
        assert json.loads(response.read())["model"] == "tiny"


def test_non_local_host_needs_allow_remote() -> None:
    from flowrl.errors import ConfigError
    from flowrl.serve.server import start

    with pytest.raises(ConfigError, match="--allow-remote"):
        start(object(), host="0.0.0.0", port=0)  # type: ignore[arg-type]


# -- what is loaded ----------------------------------------------------------------------------------------------


def test_plan_names_the_fix_for_what_it_cannot_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.errors import ConfigError
    from flowrl.serve import load

    gguf = tmp_path / "alone" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr("flowrl.engines.llama_cpp_backend.llama_cpp_available", lambda: True)
    with pytest.raises(ConfigError, match="--tokenizer"):
        load.plan(str(gguf))
    with pytest.raises(ConfigError, match="transformers does not serve"):
        load.plan(str(gguf), engine="transformers")
    tiny_tokenizer().save_pretrained(tmp_path / "merged")
    beside = tmp_path / "m.gguf"
    beside.write_bytes(b"GGUF")
    assert load.plan(str(beside)).model_dir == tmp_path / "merged"
    monkeypatch.setattr("flowrl.engines.llama_server.available", lambda: False)
    assert load.plan(str(beside)).engine == "llama.cpp"  # auto: llama-cpp-python when llama-server is not built
    monkeypatch.setattr("flowrl.engines.llama_cpp_backend.llama_cpp_available", lambda: False)
    with pytest.raises(ConfigError, match="needs llama-server .*llama_server_build.* or llama-cpp-python"):
        load.plan(str(beside))
    monkeypatch.setenv("FLOWRL_LLAMA_SERVER", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="llama_server_build"):
        load.plan(str(beside), engine="llama-server")
    with pytest.raises(ConfigError, match="--engine"):
        load.plan(str(beside), engine="vllm")


def test_a_flowagent_reaches_it_through_its_litellm_model_string(served: Any) -> None:
    """`use_served` sets the LiteLLM string a FlowAgent's router reads on every call; LiteLLM's `openai/` provider
    then talks to flowrl serve, tools and tool calls included (LiteLLM is not in the dev extra: skipped in CI)."""
    from types import SimpleNamespace

    from flowrl.export.agent import restore_model
    from flowrl.serve.client import use_served

    url, _ = served(['<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>'])
    agent = SimpleNamespace(
        amd=SimpleNamespace(
            fast_llm_model="openrouter/a", complex_llm_model="openrouter/b", api_base=None, api_key=None
        )
    )
    previous = use_served(agent, url, "tiny")
    assert (agent.amd.fast_llm_model, agent.amd.complex_llm_model) == ("openai/tiny", "openai/tiny")
    assert (agent.amd.api_base, agent.amd.api_key) == (url, "none")
    litellm = pytest.importorskip("litellm")
    reply = litellm.completion(
        model=agent.amd.fast_llm_model,
        api_base=agent.amd.api_base,
        api_key=agent.amd.api_key,
        messages=[{"role": "user", "content": "k?"}],
        tools=TOOLS,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"key": "k"}
    restore_model(agent, previous)
    assert agent.amd.fast_llm_model == "openrouter/a" and agent.amd.api_base is None


class SlowBackend(ScriptedBackend):
    """Records how many calls it generates at once and under which temperature each ran."""

    def __init__(self) -> None:
        super().__init__(["ok"] * 64)
        import threading

        self.at_once = 0
        self.most_at_once = 0
        self.seen: list[tuple[float, float]] = []  # (temperature asked, temperature the backend had)
        self._count = threading.Lock()

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        import time

        with self._count:
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
            temperature = self.temperature
        time.sleep(0.2)
        with self._count:
            self.at_once -= 1
            self.seen.append((temperature, self.temperature))
        return super()._generate(prompt)


def test_requests_with_the_same_sampling_run_together_and_others_wait() -> None:
    """A backend whose sampling is set on it (transformers, llama-cpp-python): requests that share settings are
    generated at once, so a batching backend batches them; a request with other settings never changes them under
    a call in flight (it used to take the whole server one request at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    from flowrl.serve.model import ServedModel

    backend = SlowBackend()
    model = ServedModel(backend, name="tiny")
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: model.complete(dict(ask, temperature=0.5)), range(4)))
        assert backend.most_at_once == 4
        backend.most_at_once = 0
        mixed = [dict(ask, temperature=t) for t in (0.1, 0.9) * 4]
        list(pool.map(model.complete, mixed))
    assert all(asked == had for asked, had in backend.seen)  # no call saw its temperature changed mid-call
    assert backend.most_at_once <= 4


def test_a_policy_caps_the_new_tokens_a_request_asks_for() -> None:
    """A FlowAgent asks for 16,384 new tokens on every call; a sampled reply that never ends then held a
    llama-server slot for minutes (seen: 3,000 tokens and counting, at 12 tokens/s). A policy's route caps it,
    said once and counted; the served base name keeps the request's value."""
    from flowrl.serve.model import Route, ServedModel

    backend = ScriptedBackend(["one two three four five six seven eight nine ten"] * 3)
    model = ServedModel(backend, name="tiny")
    model.add_route("collect-1", Route(backend, temperature=0.8, seed=1, max_tokens=4))
    body = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 16384}
    capped = model.complete({**body, "model": "collect-1"})
    assert len(capped["choices"][0]["token_ids"]) == 4
    assert model.stats.counts["max_tokens capped by the policy"] == 1
    model.complete({**body, "model": "collect-1"})
    assert model.stats.counts["max_tokens capped by the policy"] == 2 and len(model.stats.notes) == 1
    whole = model.complete({**body, "model": "tiny"})
    assert len(whole["choices"][0]["token_ids"]) > 4
