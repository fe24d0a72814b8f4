"""The OpenAI-compatible HTTP front of `flowrl serve`, on the standard library's HTTP server.

Routes: `GET /v1/models`, `GET /health`, `POST /v1/chat/completions` (also `stream: true`: the reply is
generated whole, then sent as server-sent events, one content or tool-call chunk, the finish chunk, the usage
chunk when `stream_options.include_usage`, and `[DONE]`). Errors are OpenAI's error objects: 400 for a request
the model cannot answer faithfully, 401 without the `--api-key`, 404, 413 over 16 MiB, 500 for a failure
while generating (logged; the server keeps serving).

It listens on 127.0.0.1 unless told otherwise with `allow_remote`: anyone who reaches it runs the model.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flowrl.engines.llama_server import EngineRefused
from flowrl.errors import ConfigError
from flowrl.localhost import check_host
from flowrl.serve.model import RequestError, ServedModel

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024
REMOTE_RISK = "anyone who can reach it can run the model; set --api-key"


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # -- replies -------------------------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data, ensure_ascii=False).encode())

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

    def _authorised(self) -> bool:
        key = self.server.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if hmac.compare_digest(given.encode(), key.encode()):
            return True
        self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer ...)", "auth_error")
        return False

    # -- routes --------------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._json(HTTPStatus.OK, {"status": "ok", "model": self.server.model.name})
        elif not self._authorised():
            return
        elif path in ("/v1/models", "/models"):
            created = int(self.server.started)
            entries = [
                {"id": name, "object": "model", "created": created, "owned_by": "flowrl"}
                for name in self.server.model.routes
            ]
            self._json(HTTPStatus.OK, {"object": "list", "data": entries})
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no route {self.path}: use /v1/chat/completions or /v1/models")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(HTTPStatus.NOT_FOUND, f"no route {self.path}: flowrl serve answers /v1/chat/completions")
            return
        if not self._authorised():
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {MAX_BODY} bytes")
            self.close_connection = True
            return
        try:
            request = json.loads(self.rfile.read(length) or b"null")
        except ValueError as exc:
            self._error(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}")
            return
        if not isinstance(request, dict):
            self._error(HTTPStatus.BAD_REQUEST, "the body must be a JSON object (an OpenAI chat completion request)")
            return
        try:
            reply = self.server.model.complete(request)
        except (RequestError, EngineRefused) as exc:  # the request as it is (e.g. longer than the context)
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except Exception as exc:
            log.exception("flowrl serve: generating failed")
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"generating failed: {exc}", "server_error")
            return
        if request.get("stream"):
            self._stream(reply, bool((request.get("stream_options") or {}).get("include_usage")))
        else:
            self._json(HTTPStatus.OK, reply)

    def _stream(self, reply: dict[str, Any], include_usage: bool) -> None:
        """The finished reply as OpenAI's chunks; the first carries vLLM's `prompt_token_ids` and `token_ids` and the
        tokenizer's fingerprint, as the whole reply does."""
        choice = reply["choices"][0]
        message = choice["message"]
        head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
        if message.get("reasoning_content"):
            delta["reasoning_content"] = message["reasoning_content"]
        first: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None, "token_ids": choice["token_ids"]}
        if "logprobs" in choice:
            first["logprobs"] = choice["logprobs"]
        chunks = [
            dict(head, choices=[first], prompt_token_ids=reply["prompt_token_ids"], tokenizer=reply["tokenizer"]),
            dict(head, choices=[{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]),
        ]
        if include_usage:
            chunks.append(dict(head, choices=[], usage=reply["usage"]))
        body = b"".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode() for c in chunks)
        self._send(HTTPStatus.OK, body + b"data: [DONE]\n\n", "text/event-stream")


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: ServedModel, host: str, port: int, api_key: str | None = None) -> None:
        self.model = model
        self.api_key = api_key
        self.started = time.time()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/v1"


def start(
    model: ServedModel, *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None, allow_remote=False
) -> tuple[ChatServer, threading.Thread]:
    """A running server on its own thread (port 0 picks a free one); `server.shutdown()` stops it."""
    check_host(host, allow_remote, "flowrl serve", REMOTE_RISK)
    try:
        server = ChatServer(model, host, port, api_key)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port") from exc
    thread = threading.Thread(target=server.serve_forever, name="flowrl-serve", daemon=True)
    thread.start()
    return server, thread
