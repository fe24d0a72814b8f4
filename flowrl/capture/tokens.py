"""Token ids and sampling logprobs of one LLM call, read from whatever the call returned.

`token_info(out)` understands these shapes (an object, a pydantic model or its dict form alike):

- flat: `prompt_token_ids`, `token_ids` (or `completion_token_ids`), `logprobs` (floats) and
  `tokenizer` (a fingerprint string) on the returned object itself; flowrl's example agent attaches
  them to its assistant message;
- OpenAI-compatible chat completions as vLLM returns them with `return_token_ids: true` and
  `logprobs: true`: top-level `prompt_token_ids`, `choices[0].token_ids`,
  `choices[0].logprobs.content[i].logprob` (vLLM `entrypoints/openai/chat_completion/protocol.py`:
  `ChatCompletionResponse.prompt_token_ids`, `ChatCompletionResponseChoice.token_ids`). vLLM's
  `/v1/completions` carries `prompt_token_ids` on the choice and `logprobs.token_logprobs`;
  with `return_tokens_as_token_ids` a logprob entry's `token` is `"token_id:<id>"`;
- LiteLLM's `ModelResponse`: top-level extras stay attributes, but a choice's extra keys are moved
  into `choices[0].provider_specific_fields` and a message's into `message.provider_specific_fields`
  (litellm `llm_response_utils/convert_dict_to_response.py`, `convert_to_model_response_object`);
  so a lone `Message` is read through its `provider_specific_fields` too;
- llama.cpp server: `/v1/chat/completions` puts `{id, token, bytes, logprob, top_logprobs}` in
  `choices[0].logprobs.content[i]`; the native `/completion` with `n_probs` returns
  `completion_probabilities[i]` with `id` and `logprob` (or `prob` with `post_sampling_probs`), and the
  generated ids in `tokens` when `return_tokens` is set (llama.cpp `tools/server/README.md`,
  `completion_token_output::probs_vector_to_json` in `tools/server/server-task.cpp`). No prompt ids;
- Ollama `/api/chat` with `logprobs: true`: top-level `logprobs` list of `{token, logprob, bytes,
  top_logprobs}` (ollama `api/types.go`, `ChatResponse.Logprobs`). No ids at all: logprobs only.

Never raises: capture must not break the host. A field that is not a list of the right type is left
out (None), never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# llama.cpp writes this for a probability of 0 (JSON has no -inf); a `prob` of 0 maps to it as well.
_LOG_ZERO = -3.4028234663852886e38
_TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids


@dataclass(slots=True)
class TokenInfo:
    """What one LLM call's backend said about tokens; None where it said nothing usable."""

    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None

    def fields(self) -> dict[str, Any]:
        """The non-empty fields, named as in `flowrl.trace.schema.LLMCall`."""
        return {
            name: value
            for name in ("prompt_token_ids", "token_ids", "logprobs", "tokenizer")
            if (value := getattr(self, name)) is not None
        }


def token_info(out: Any) -> TokenInfo | None:
    """Token ids and logprobs in an LLM call's return value, or None when it carries none."""
    if out is None or isinstance(out, (str, bytes, int, float)) or callable(out):
        return None
    try:
        if _get(out, "object") == "chat.completion.chunk":  # one delta's ids, not the call's
            return None
        info = _read(out)
    except Exception:  # a property that raises, a proxy object: nothing is recorded
        return None
    if info.prompt_token_ids is None and info.token_ids is None and info.logprobs is None:
        return None
    return info


def stream_token_info(chunks: list[Any]) -> TokenInfo | None:
    """Token ids and logprobs of a streamed chat completion, from the chunks the host read (vLLM with
    `return_token_ids` puts `prompt_token_ids` on the first chunk and each choice's `token_ids` and
    `logprobs.content` on every chunk). The call's completion is every chunk's ids in order; when a chunk that
    carries a delta has none while others do, the ids are incomplete and nothing is recorded (logprobs alike).
    Never raises."""
    try:
        prompt: list[int] | None = None
        ids: list[int] = []
        logprobs: list[float] = []
        ids_ok = lp_ok = True
        tokenizer = None
        for chunk in chunks:
            choice = _first(_get(chunk, "choices"))
            if prompt is None:
                prompt = _ids(_get(chunk, "prompt_token_ids")) or _ids(_get(choice, "prompt_token_ids"))
            if choice is None:
                continue
            delta = _get(choice, "delta")
            speaks = bool(_get(delta, "content")) or bool(_get(delta, "tool_calls"))
            got = _ids(_get(choice, "token_ids"))
            lps = _logprobs(_get(choice, "logprobs"))
            if got is None and lps is not None:
                got = _entry_ids(_get(choice, "logprobs"))
            if got is not None:
                ids.extend(got)
            elif speaks:
                ids_ok = False
            if lps is not None:
                logprobs.extend(lps)
            elif speaks:
                lp_ok = False
            tokenizer = tokenizer or _get(chunk, "tokenizer")
        info = TokenInfo(
            prompt_token_ids=prompt,
            token_ids=ids if ids_ok and ids else None,
            logprobs=logprobs if lp_ok and logprobs else None,
            tokenizer=tokenizer if isinstance(tokenizer, str) and tokenizer else None,
        )
        if info.token_ids is not None and info.logprobs is not None and len(info.logprobs) != len(info.token_ids):
            info.logprobs = None  # not one per sampled token: not what a trainer can use
    except Exception:
        return None
    if info.prompt_token_ids is None and info.token_ids is None and info.logprobs is None:
        return None
    return info


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _first(seq: Any) -> Any:
    return seq[0] if isinstance(seq, (list, tuple)) and seq else None


def _ids(value: Any) -> list[int] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return list(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _entry_logprob(entry: Any) -> float | None:
    """One token's logprob: a number, or an entry with `logprob` (or llama.cpp's `prob`)."""
    if isinstance(entry, (int, float)):
        return _float(entry)
    if entry is None or isinstance(entry, (str, bytes)):
        return None
    lp = _float(_get(entry, "logprob"))
    if lp is not None:
        return lp
    prob = _float(_get(entry, "prob"))
    if prob is None or not 0.0 <= prob <= 1.0:
        return None
    return math.log(prob) if prob > 0.0 else _LOG_ZERO


def _entry_id(entry: Any) -> int | None:
    tok_id = _get(entry, "id")
    if isinstance(tok_id, int) and not isinstance(tok_id, bool) and tok_id >= 0:
        return tok_id
    token = _get(entry, "token")
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX) and token[len(_TOKEN_ID_PREFIX) :].isdigit():
        return int(token[len(_TOKEN_ID_PREFIX) :])
    return None


def _entries(value: Any) -> list[Any] | None:
    """The per-token list inside a logprobs value: the list itself, or OpenAI's `{content: [...]}`."""
    if isinstance(value, (list, tuple)):
        return list(value)
    content = _get(value, "content")
    return list(content) if isinstance(content, (list, tuple)) else None


def _logprobs(value: Any) -> list[float] | None:
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return None
    entries = _entries(value)
    if entries is None:  # vLLM /v1/completions: {tokens, token_logprobs, top_logprobs, text_offset}
        entries = _get(value, "token_logprobs")
        if not isinstance(entries, (list, tuple)):
            return None
    out = [_entry_logprob(e) for e in entries]
    if not out or any(v is None for v in out):
        return None
    return out  # type: ignore[return-value]


def _entry_ids(value: Any) -> list[int] | None:
    """Completion ids carried by per-token logprob entries (llama.cpp's `id`, vLLM's "token_id:N")."""
    entries = _entries(value) if value is not None and not isinstance(value, (str, bytes)) else None
    if not entries:
        return None
    ids = [_entry_id(e) for e in entries]
    return None if any(i is None for i in ids) else ids  # type: ignore[return-value]


def _sources(out: Any) -> list[Any]:
    """Where flat fields may sit, best first: the object, its first choice, the choice's message, and
    the `provider_specific_fields` LiteLLM moves unknown keys into."""
    choice = _first(_get(out, "choices"))
    message = _get(choice, "message") if choice is not None else None
    found = [out, _get(out, "provider_specific_fields")]
    if choice is not None:
        found += [choice, _get(choice, "provider_specific_fields")]
    if message is not None:
        found += [message, _get(message, "provider_specific_fields")]
    return [s for s in found if s is not None and not isinstance(s, (str, bytes))]


def _read(out: Any) -> TokenInfo:
    info = TokenInfo()
    raw_logprobs: Any = None
    for src in _sources(out):
        if info.prompt_token_ids is None:
            info.prompt_token_ids = _ids(_get(src, "prompt_token_ids"))
        if info.token_ids is None:
            info.token_ids = _ids(_get(src, "token_ids")) or _ids(_get(src, "completion_token_ids"))
        if info.logprobs is None:
            raw_logprobs = _get(src, "logprobs")
            info.logprobs = _logprobs(raw_logprobs)
        if info.tokenizer is None:
            tokenizer = _get(src, "tokenizer")
            info.tokenizer = tokenizer if isinstance(tokenizer, str) and tokenizer else None
    probs = _get(out, "completion_probabilities")  # llama.cpp /completion
    if isinstance(probs, (list, tuple)):
        if info.logprobs is None:
            raw_logprobs, info.logprobs = probs, _logprobs(probs)
        if info.token_ids is None:
            info.token_ids = _ids(_get(out, "tokens"))
    elif info.token_ids is None and _get(out, "stop_type") is not None:  # /completion without n_probs
        info.token_ids = _ids(_get(out, "tokens"))
    if info.token_ids is None and info.logprobs is not None:
        info.token_ids = _entry_ids(raw_logprobs)
    return info
