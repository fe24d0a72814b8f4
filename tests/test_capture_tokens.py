"""Token capture: prompt/completion token ids and sampling logprobs of each LLM call, as the backend
returned them, and dropped where masking changed the text they encode."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from flowrl.capture import hook_into_agent
from flowrl.capture.events import LLMEvent
from flowrl.capture.masking import redact_trace
from flowrl.capture.tokens import TokenInfo, token_info
from flowrl.trace.redact import Redactor
from flowrl.trace.schema import LLMCall
from tests.fakes import flushed

OPENAI_KEY = "sk-proj-" + "Q7fZ2kLm9XwP4tRv8YbN3cHs6JdE1gUa"
AWS_KEY = "AKIA" + "IOSFODNN7EXAMPLE"


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name)


def _ns(value: Any) -> Any:
    """A dict turned into nested attribute objects (what an SDK's response objects look like)."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _ns(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_ns(v) for v in value]
    return value


def _vllm_chat() -> dict[str, Any]:
    """`/v1/chat/completions` from vLLM with `return_token_ids: true, logprobs: true`."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "qwen",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "stop_reason": None,
                "message": {"role": "assistant", "content": "Hi there", "tool_calls": []},
                "logprobs": {
                    "content": [
                        {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []},
                        {"token": " there", "logprob": -0.25, "bytes": None, "top_logprobs": []},
                        {"token": "<|im_end|>", "logprob": -0.01, "bytes": None, "top_logprobs": []},
                    ]
                },
                "token_ids": [13048, 1052, 151645],
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        "prompt_token_ids": [151644, 872, 198, 13048],
    }


VLLM_EXPECTED = TokenInfo([151644, 872, 198, 13048], [13048, 1052, 151645], [-0.1, -0.25, -0.01])


@pytest.mark.parametrize("form", [dict, _ns])
def test_vllm_chat_completion(form) -> None:
    assert token_info(form(_vllm_chat())) == VLLM_EXPECTED


def test_vllm_chat_completion_through_the_openai_sdk() -> None:
    openai_types = pytest.importorskip("openai.types.chat")
    response = openai_types.ChatCompletion.model_validate(_vllm_chat())
    assert token_info(response) == VLLM_EXPECTED


def test_litellm_moves_choice_extras_into_provider_specific_fields() -> None:
    data = _vllm_chat()
    choice = data["choices"][0]
    choice["provider_specific_fields"] = {"token_ids": choice.pop("token_ids")}
    assert token_info(_ns(data)) == VLLM_EXPECTED


def test_a_lone_message_with_provider_fields() -> None:
    message = _ns(
        {
            "role": "assistant",
            "content": "Hi",
            "tool_calls": None,
            "provider_specific_fields": {"prompt_token_ids": [1, 2], "token_ids": [3, 4]},
        }
    )
    assert token_info(message) == TokenInfo([1, 2], [3, 4], None)


def test_vllm_completions_endpoint_and_token_id_strings() -> None:
    data = {
        "choices": [
            {
                "text": "ab",
                "prompt_token_ids": [1, 2],
                "token_ids": [3, 4],
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.0]},
            }
        ]
    }
    assert token_info(data) == TokenInfo([1, 2], [3, 4], [-0.5, -1.0])
    as_ids = {
        "choices": [
            {
                "message": {"content": "ab"},
                "logprobs": {
                    "content": [{"token": "token_id:3", "logprob": -0.5}, {"token": "token_id:4", "logprob": -1.0}]
                },
            }
        ]
    }
    assert token_info(as_ids) == TokenInfo(None, [3, 4], [-0.5, -1.0])


@dataclass
class _Message:  # the shape of flowrl's example agent's assistant message
    content: str | None
    tool_calls: list[Any] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None


@pytest.mark.parametrize("form", [dict, lambda d: _Message(**d)])
def test_flat_fields(form) -> None:
    out = form(
        {
            "content": "ok",
            "tool_calls": [],
            "prompt_token_ids": [5, 6],
            "token_ids": [7, 2],
            "logprobs": [-0.5, 0.0],
            "tokenizer": "tiny@0123abcd",
        }
    )
    assert token_info(out) == TokenInfo([5, 6], [7, 2], [-0.5, 0.0], "tiny@0123abcd")
    assert token_info({"completion_token_ids": [9]}) == TokenInfo(None, [9], None)


def test_llamacpp_chat_logprobs_carry_ids() -> None:
    data = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Yes"},
                "logprobs": {
                    "content": [
                        {
                            "id": 9642,
                            "token": "Yes",
                            "bytes": [89, 101, 115],
                            "logprob": -0.02,
                            "top_logprobs": [{"id": 9642, "token": "Yes", "bytes": [89], "logprob": -0.02}],
                        },
                        {"id": 2, "token": "", "bytes": [], "logprob": -0.3, "top_logprobs": []},
                    ]
                },
            }
        ]
    }
    assert token_info(data) == TokenInfo(None, [9642, 2], [-0.02, -0.3])


def test_llamacpp_native_completion() -> None:
    data = {
        "content": "Yes",
        "tokens": [9642, 2],
        "stop": True,
        "stop_type": "eos",
        "completion_probabilities": [
            {"id": 9642, "token": "Yes", "bytes": [89], "logprob": -0.02, "top_logprobs": []},
            {"id": 2, "token": "", "bytes": [], "logprob": -0.3, "top_logprobs": []},
        ],
    }
    assert token_info(data) == TokenInfo(None, [9642, 2], [-0.02, -0.3])
    # no return_tokens: `tokens` is empty, the ids come from the probabilities; post_sampling_probs: `prob`
    post = {
        "content": "Yes",
        "tokens": [],
        "stop_type": "eos",
        "completion_probabilities": [
            {"id": 9642, "token": "Yes", "prob": 0.5, "top_probs": []},
            {"id": 2, "token": "", "prob": 0.0},
        ],
    }
    info = token_info(post)
    assert info is not None and info.token_ids == [9642, 2]
    assert info.logprobs[0] == pytest.approx(math.log(0.5)) and math.isfinite(info.logprobs[1])
    assert token_info({"content": "Yes", "tokens": [9642, 2], "stop_type": "eos"}) == TokenInfo(None, [9642, 2])


def test_ollama_chat_gives_logprobs_only() -> None:
    data = {
        "model": "gemma3",
        "message": {"role": "assistant", "content": "Hi"},
        "done": True,
        "logprobs": [
            {"token": "Hi", "logprob": -0.2, "bytes": [72, 105], "top_logprobs": []},
            {"token": "!", "logprob": -1.5},
        ],
    }
    assert token_info(data) == TokenInfo(None, None, [-0.2, -1.5])
    assert token_info(_ns(data)) == TokenInfo(None, None, [-0.2, -1.5])


@pytest.mark.parametrize(
    "out",
    [
        None,
        "text",
        b"bytes",
        3,
        lambda: None,
        {"content": "plain"},
        {"choices": []},
        {"choices": [{"message": {"content": "x"}, "logprobs": None}]},
        {"token_ids": "1 2 3"},
        {"token_ids": [1, -2]},
        {"token_ids": [True, False]},
        {"logprobs": [-0.1, "x"]},
        {"logprobs": [float("nan")]},
        {"prompt_token_ids": []},
    ],
)
def test_nothing_usable_is_none(out: Any) -> None:
    assert token_info(out) is None


def test_malformed_fields_are_skipped_and_nothing_raises() -> None:
    class Exploding:
        content = "x"

        @property
        def token_ids(self) -> list[int]:
            raise RuntimeError("boom")

    assert token_info(Exploding()) is None
    mixed = {"prompt_token_ids": [1, 2], "token_ids": [3, 4.5], "logprobs": {"content": [{"logprob": "bad"}]}}
    assert token_info(mixed) == TokenInfo([1, 2], None, None)


def test_fields_fit_the_schema() -> None:
    call = LLMCall.model_validate({"output": "Hi there", **VLLM_EXPECTED.fields()})
    assert call.has_token_ids and call.logprobs == [-0.1, -0.25, -0.01]
    assert "tokenizer" not in VLLM_EXPECTED.fields()


# -- end to end ------------------------------------------------------------------------------------------


class TokenAgent:
    """A generic agent whose LLM method returns an OpenAI-style response with token ids."""

    name = "tokens"

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def a_run(self, query: str, session_id: str = "default") -> str:
        first = await self.complete(query, model="m")
        second = await self.complete(_get(first, "content"), model="m")
        return _get(second, "content")

    async def complete(self, prompt: str, model: str = "m") -> Any:
        text = self.replies.pop(0)
        return _Message(
            content=text,
            prompt_token_ids=[1, 2, 3],
            token_ids=[4, 5, 0],
            logprobs=[-0.1, -0.2, -0.3],
            tokenizer="toy@abcd",
        )


def _run(tmp_path, replies: list[str], query: str = "hello", agent: Any = None) -> dict[str, Any]:
    agent = agent or TokenAgent(replies)
    with hook_into_agent(agent, store=tmp_path, run_methods=["a_run"], llm_methods=["complete"]) as hook:
        asyncio.run(agent.a_run(query))
        (trace,) = flushed(hook)
    return trace


def test_stored_trace_carries_token_ids(tmp_path) -> None:
    trace = _run(tmp_path, ["one", "two"])
    assert [c["output"] for c in trace["llm_calls"]] == ["one", "two"]
    for call in trace["llm_calls"]:
        assert call["prompt_token_ids"] == [1, 2, 3] and call["token_ids"] == [4, 5, 0]
        assert call["logprobs"] == [-0.1, -0.2, -0.3] and call["tokenizer"] == "toy@abcd"
        assert call["token_ids_dropped"] is None and LLMCall.model_validate(call).has_token_ids


def test_secret_in_an_output_drops_that_call_and_later_ones(tmp_path) -> None:
    trace = _run(tmp_path, ["plain first", f"the key is {OPENAI_KEY}"])
    first, second = trace["llm_calls"]
    assert OPENAI_KEY not in json.dumps(trace) and "[REDACTED:openai_key]" in second["output"]
    assert first["token_ids"] == [4, 5, 0] and first["token_ids_dropped"] is None
    assert second["prompt_token_ids"] is None and second["token_ids"] is None
    assert second["token_ids_dropped"] == "redacted" and second["logprobs"] == [-0.1, -0.2, -0.3]
    assert not LLMCall.model_validate(second).has_token_ids


def test_secret_in_the_query_drops_every_call(tmp_path) -> None:
    trace = _run(tmp_path, ["a", "b"], query=f"use {AWS_KEY} please")
    assert AWS_KEY not in json.dumps(trace)
    assert [c["token_ids_dropped"] for c in trace["llm_calls"]] == ["redacted", "redacted"]
    assert all(c["prompt_token_ids"] is None and c["token_ids"] is None for c in trace["llm_calls"])


def test_an_earlier_output_secret_reaches_later_prompts() -> None:
    calls = [
        {"output": f"key {AWS_KEY}", "token_ids": [1]},
        {"output": "fine", "prompt_token_ids": [1], "token_ids": [2]},
        {"output": "fine", "logprobs": [-1.0]},
    ]
    out = redact_trace(Redactor(), {"user_query": "q", "tool_calls": [], "llm_calls": calls})
    assert [c.get("token_ids_dropped") for c in out["llm_calls"]] == ["redacted", "redacted", None]
    assert out["llm_calls"][2]["logprobs"] == [-1.0]  # logprobs alone encode no text
    assert calls[0]["token_ids"] == [1]  # the input is not changed


def test_masking_an_error_or_the_final_answer_alone_keeps_ids() -> None:
    call = {"output": "fine", "prompt_token_ids": [1], "token_ids": [2], "error": f"failed with {AWS_KEY}"}
    out = redact_trace(Redactor(), {"user_query": "q", "final_response": f"done {AWS_KEY}", "llm_calls": [call]})
    assert out["llm_calls"][0]["token_ids"] == [2] and "token_ids_dropped" not in out["llm_calls"][0]


def test_secret_in_a_tool_result_drops_every_call() -> None:
    data = {
        "user_query": "q",
        "llm_calls": [{"output": "x", "prompt_token_ids": [1], "token_ids": [2]}],
        "tool_calls": [{"tool_name": "env", "arguments": {}, "result": f"AWS={AWS_KEY}"}],
    }
    assert redact_trace(Redactor(), data)["llm_calls"][0]["token_ids_dropped"] == "redacted"


def test_a_whole_chat_completion_gives_its_message_text_and_ids(tmp_path) -> None:
    class RawAgent(TokenAgent):
        async def complete(self, prompt: str, model: str = "m") -> Any:
            return _vllm_chat()

    trace = _run(tmp_path, [], agent=RawAgent([]))
    call = trace["llm_calls"][0]
    assert call["output"] == "Hi there" and call["token_ids"] == VLLM_EXPECTED.token_ids
    assert call["prompt_token_ids"] == VLLM_EXPECTED.prompt_token_ids


def test_a_stream_chunk_is_not_a_whole_call() -> None:
    chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "!"}, "token_ids": [0]}]}
    assert token_info(chunk) is None


def test_a_streamed_call_records_no_ids() -> None:
    from flowrl.capture.assemble import _llm_call

    entry = _llm_call(LLMEvent(0.0, {}, "m", True, output=_vllm_chat()))
    assert entry["output"] == "Hi there" and "token_ids" not in entry and "logprobs" not in entry
