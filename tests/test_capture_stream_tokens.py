"""Token ids of a streamed OpenAI SDK call (issue 16: "token ids/logprobs when the server returns them"): a server
that streams as vLLM does with `return_token_ids` (prompt ids on the first chunk, each choice's `token_ids` and
`logprobs.content` on every chunk) gives the call's whole completion ids, prompt ids and sampling logprobs."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from flowrl.capture import hook_into_agent  # noqa: E402
from flowrl.capture.tokens import stream_token_info  # noqa: E402

PROMPT_IDS = [1, 17, 42, 99]
PIECES = [("The ", [10, 11], [-0.1, -0.2]), ("answer ", [12], [-0.3]), ("is 4.", [13, 14, 2], [-0.4, -0.5, -0.6])]


def _chunks(with_ids: bool, gap: bool = False) -> list[Any]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "served"}
    out = []
    for i, (text, ids, lps) in enumerate(PIECES):
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        if with_ids and not (gap and i == 1):
            choice["token_ids"] = ids
            choice["logprobs"] = {
                "content": [{"token": "t", "logprob": lp, "bytes": None, "top_logprobs": []} for lp in lps]
            }
        out.append({**base, "choices": [choice], **({"prompt_token_ids": PROMPT_IDS} if i == 0 and with_ids else {})})
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return out


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            chunks = _chunks(with_ids=bool((body.get("extra") or {}).get("ids", True)))
            raw = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_a_streamed_calls_token_ids_and_logprobs_are_recorded(url: str, tmp_path) -> None:
    class Agent:
        def __init__(self) -> None:
            self.client = openai.OpenAI(base_url=url, api_key="sk-test-not-a-real-key", max_retries=0)

        async def run(self, query: str) -> str:
            stream = self.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": query}], stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    agent = Agent()
    with hook_into_agent(agent, store=tmp_path, run_methods=["run"]) as hook:
        assert asyncio.run(agent.run("2+2?")) == "The answer is 4."
        assert hook.flush(10)
        (trace,) = list(hook.store.iter_traces())
    (call,) = trace.llm_calls
    assert call.prompt_token_ids == PROMPT_IDS and call.token_ids == [10, 11, 12, 13, 14, 2]
    assert call.logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]) and call.has_token_ids


def test_incomplete_stream_ids_are_not_recorded_as_if_whole() -> None:
    info = stream_token_info(_chunks(with_ids=True, gap=True))  # the middle chunk carries no ids
    assert info is not None and info.prompt_token_ids == PROMPT_IDS
    assert info.token_ids is None and info.logprobs is None
    assert stream_token_info(_chunks(with_ids=False)) is None
