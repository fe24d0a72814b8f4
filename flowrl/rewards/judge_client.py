"""A small client for OpenAI-compatible `/chat/completions` endpoints, for the LLM judge.

Standard library only (urllib), so the judge needs no SDK. It adds what a judge needs: a timeout per
request, retries with exponential backoff (connection errors, timeouts, 408/429/5xx, and replies the
caller cannot parse), `Retry-After`, a content-keyed cache (in memory, and on disk when given a folder),
and counters (`stats`) that tests and the score summary read.

Settings come from arguments, else the environment: `FLOWRL_JUDGE_BASE_URL`, `FLOWRL_JUDGE_MODEL`,
`FLOWRL_JUDGE_API_KEY`, falling back to `OPENAI_BASE_URL` and `OPENAI_API_KEY`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flowrl.store.files import atomic_write_bytes

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class JudgeRequestError(Exception):
    """One request failed; `retryable` says whether trying again may help."""

    def __init__(
        self, message: str, retryable: bool, retry_after: float | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


def resolve_settings(
    base_url: str | None, model: str | None, api_key: str | None, api_key_env: str | None = None
) -> tuple[str, str | None, str | None]:
    env = os.environ
    url = base_url or env.get("FLOWRL_JUDGE_BASE_URL") or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    key = (
        api_key
        or (env.get(api_key_env) if api_key_env else None)
        or env.get("FLOWRL_JUDGE_API_KEY")
        or env.get("OPENAI_API_KEY")
    )
    return url, model or env.get("FLOWRL_JUDGE_MODEL"), key or None


def endpoint(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def extract_json(text: str) -> Any:
    """The JSON value in a model's reply: plain, fenced in ```json, or the outermost {...} in prose."""
    text = (text or "").strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start >= 0 and end > start:
            return json.loads(text[start : end + 1])  # ValueError propagates: unparseable
        raise


class JudgeClient:
    def __init__(  # noqa: PLR0913  # keyword-only: the judge's TOML options
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        temperature: float | None = 0.0,
        max_tokens: int | None = 2048,
        json_mode: bool = True,
        cache_dir: str | Path | None = None,
        extra_headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url, self.model, self._api_key = resolve_settings(base_url, model, api_key, api_key_env)
        self.url = endpoint(self.base_url)
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.temperature, self.max_tokens, self.json_mode = temperature, max_tokens, json_mode
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.extra_headers, self.extra_body = dict(extra_headers or {}), dict(extra_body or {})
        self._sleep = sleep
        self._memory: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "cache_hits": 0}
        host = urlsplit(self.url).hostname or ""
        handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
        self._opener = urllib.request.build_opener(*handlers)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    # -- cache ------------------------------------------------------------------------------------------
    def cache_key(self, messages: list[dict[str, Any]]) -> str:
        blob = json.dumps(
            {"model": self.model, "temperature": self.temperature, "messages": messages},
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def _cache_get(self, key: str) -> Any:
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        if self.cache_dir is not None:
            path = self.cache_dir / key[:2] / f"{key}.json"
            try:
                value = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
            with self._lock:
                self._memory[key] = value
            return value
        return None

    def _cache_put(self, key: str, value: Any) -> None:
        with self._lock:
            self._memory[key] = value
        if self.cache_dir is not None:
            try:
                atomic_write_bytes(self.cache_dir / key[:2] / f"{key}.json", json.dumps(value).encode())
            except OSError as exc:  # a cache that cannot be written is not a reason to fail
                log.warning("flowrl: judge cache %s not writable: %s", self.cache_dir, exc)

    # -- requests ---------------------------------------------------------------------------------------
    def _post(self, messages: list[dict[str, Any]], json_mode: bool) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        if self.temperature is not None:
            body.setdefault("temperature", self.temperature)
        if self.max_tokens:
            body.setdefault("max_tokens", self.max_tokens)
        if json_mode:
            body.setdefault("response_format", {"type": "json_object"})
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "flowrl-judge",
            **self.extra_headers,
        }
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        self._count("requests")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read()[:300].decode("utf-8", "replace") if exc.fp else ""
            except (OSError, http.client.HTTPException):
                detail = ""
            retry_after = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            raise JudgeRequestError(
                f"HTTP {exc.code} from {self.url}: {detail}", exc.code in _RETRY_STATUS, retry_after, exc.code
            ) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # timeouts, resets, cut-off replies
            reason = getattr(exc, "reason", exc)
            raise JudgeRequestError(f"cannot reach {self.url}: {reason}", True) from exc
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeRequestError(
                f"{self.url} did not answer like a chat-completions endpoint: {raw[:200]!r}", True
            ) from exc
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content or ""

    def complete_json(self, messages: list[dict[str, Any]], parse: Callable[[Any], Any]) -> tuple[Any, bool]:
        """(parsed reply, from_cache). `parse` turns the reply's JSON into the result or raises ValueError,
        which counts as a failed attempt. Raises JudgeRequestError once every attempt has failed."""
        if not self.model:
            raise JudgeRequestError("no judge model: set FLOWRL_JUDGE_MODEL or `model` in the judge's config", False)
        key = self.cache_key(messages)
        cached = self._cache_get(key)
        if cached is not None:
            self._count("cache_hits")
            return cached, True
        json_mode = self.json_mode
        last: JudgeRequestError | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count("retries")
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                if last is not None and last.retry_after is not None:
                    delay = min(self.max_backoff_s, max(delay, last.retry_after))
                self._sleep(delay)
            try:
                text = self._post(messages, json_mode)
                result = parse(extract_json(text))
            except JudgeRequestError as exc:
                last = exc
                if json_mode and exc.status == 400:
                    json_mode = False  # servers that do not take response_format say 400: ask again without it
                    continue
                if not exc.retryable:
                    break
                continue
            except (ValueError, KeyError, TypeError) as exc:
                last = JudgeRequestError(f"unusable judge reply: {exc}", True)
                continue
            self._cache_put(key, result)
            return result, False
        self._count("failures")
        assert last is not None
        raise last


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
