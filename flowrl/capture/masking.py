"""Masking a trace before it is written (on the writer thread).

Only what can hold user content is masked: ids, names, roles, timings and the schema's own enums are
kept as they are, so a failing user mask (which masks a value whole) still leaves a valid trace.
A trace repeats its strings (tool results in tool_calls and messages, the query in messages and
tasks), so each distinct string is masked once per trace (the Redactor's own quick check, case-blind,
passes over text that holds no secret word). Metadata is masked too, all but flowrl's own entries
(`OWN_METADATA`): what a host passes as `metadata=` can hold anything.
"""

from __future__ import annotations

from typing import Any

# metadata entries flowrl itself writes (names and flags, never user content): kept as they are
OWN_METADATA = frozenset({"adapter", "method", "transcript", "final_answer_success", "events_over_limit"})


class _Masker:
    """A per-trace front of `flowrl.trace.redact.Redactor`: same results, each distinct unkeyed string once.
    `changed` counts the strings it returned altered (a cached one each time it is asked again)."""

    def __init__(self, redactor: Any) -> None:
        self.redactor = redactor
        self.cache: dict[str, str] = {}
        self.changed = 0

    def text(self, value: str) -> str:
        done = self.cache.get(value)
        if done is None:
            done = self.cache[value] = self.redactor.redact_text(value)  # its own quick check comes first
        return done

    def redact(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, str):
            # under a key: the Redactor masks it whole when the key names a secret, else scans it
            done = self.redactor.redact(value, key=key) if key is not None else self.text(value)
            if done != value:
                self.changed += 1
            return done
        if isinstance(value, dict):
            return {k: self.redact(v, k if isinstance(k, str) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact(v, key) for v in value]  # `{"credentials": ["u", "pw"]}`: masked by its key
        return value


def _mask_call(redactor: Any, call: Any) -> Any:
    if not isinstance(call, dict):
        return redactor.redact(call)
    out = dict(call)
    fn = out.get("function")
    if isinstance(fn, dict):
        out["function"] = {**fn, "arguments": redactor.redact(fn.get("arguments"), key="arguments")}
    return out


def _mask_fields(redactor: Any, item: Any, fields: tuple[str, ...]) -> Any:
    if not isinstance(item, dict):
        return redactor.redact(item)
    out = dict(item)
    for name in fields:
        if name in out:
            out[name] = redactor.redact(out[name], key=name)
    return out


def _mask_message(redactor: Any, msg: Any) -> Any:
    if not isinstance(msg, dict):
        return redactor.redact(msg)
    out = {}
    for key, value in msg.items():
        if key in ("role", "tool_call_id", "name"):
            out[key] = value
        elif key == "tool_calls" and isinstance(value, list):
            out[key] = [_mask_call(redactor, c) for c in value]
        else:
            out[key] = redactor.redact(value, key=key)
    return out


def redact_outcomes(redactor: Any, outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mask secrets in the host's outcomes (`flowrl.trace.outcomes`): their reference and feedback texts (copies)."""
    if not isinstance(redactor, _Masker):
        redactor = _Masker(redactor)
    return [_mask_fields(redactor, o, ("reference", "feedback")) for o in outcomes]


def redact_trace(redactor: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Mask secrets in every field of a trace dict that can hold user content (a copy).

    A call's token ids encode text: its completion ids its own output, its prompt ids the conversation
    so far. Where masking changed such text, the ids would still hold the secret, so they are dropped
    (`token_ids_dropped = "redacted"`; logprobs stay). Per call for outputs (a call's own, and any
    earlier call's, which its prompt contains); per trace for the conversation (query, messages, tool
    calls, reasoning, tool schemas), since which messages a call's prompt held is not recorded.
    """
    redactor = _Masker(redactor)
    out = dict(data)
    if "user_query" in out:
        out["user_query"] = redactor.redact(out["user_query"])
    if out.get("messages") is not None:
        out["messages"] = [_mask_message(redactor, m) for m in out["messages"]]
    out["tool_calls"] = [
        _mask_fields(redactor, c, ("arguments", "result", "error", "function_error"))
        for c in out.get("tool_calls") or []
    ]
    out["reasoning_steps"] = [
        _mask_fields(redactor, s, ("content", "thought", "insights", "issues"))
        for s in out.get("reasoning_steps") or []
    ]
    context_changed = redactor.changed
    for name in ("final_response", "review_notes"):
        if name in out:
            out[name] = redactor.redact(out[name])
    if out.get("outcomes"):
        out["outcomes"] = redact_outcomes(redactor, out["outcomes"])
    llm_calls, outputs_changed = [], []
    for call in out.get("llm_calls") or []:
        before = redactor.changed
        masked = _mask_fields(redactor, call, ("output",))
        if isinstance(masked, dict) and isinstance(masked.get("tool_calls"), list):
            masked["tool_calls"] = [_mask_call(redactor, c) for c in masked["tool_calls"]]
        outputs_changed.append(redactor.changed > before)
        llm_calls.append(_mask_fields(redactor, masked, ("error",)) if isinstance(masked, dict) else masked)
    out["llm_calls"] = llm_calls
    for name in ("tasks_created", "tasks_completed", "tasks_failed"):
        out[name] = [_mask_fields(redactor, t, ("description", "result", "error")) for t in out.get(name) or []]
    before_tools = redactor.changed
    tools = []
    for tool in out.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict):
            tools.append({**tool, "function": _mask_fields(redactor, fn, ("description", "parameters"))})
        else:
            tools.append(redactor.redact(tool))
    out["tools"] = tools
    context_changed += redactor.changed - before_tools
    _drop_token_ids(llm_calls, outputs_changed, context_changed > 0)
    if isinstance(out.get("metadata"), dict):  # the host's `metadata=` values and the run's error included
        out["metadata"] = {
            k: v if k in OWN_METADATA else redactor.redact(v, k if isinstance(k, str) else None)
            for k, v in out["metadata"].items()
        }
    return out


def _drop_token_ids(calls: list[Any], outputs_changed: list[bool], context_changed: bool) -> None:
    earlier_changed = False  # an earlier call's output is in this call's prompt
    for call, own_changed in zip(calls, outputs_changed):
        if (
            (own_changed or context_changed or earlier_changed)
            and isinstance(call, dict)
            and (call.get("prompt_token_ids") is not None or call.get("token_ids") is not None)
        ):
            call["prompt_token_ids"] = call["token_ids"] = None
            call["token_ids_dropped"] = "redacted"
        earlier_changed = earlier_changed or own_changed
