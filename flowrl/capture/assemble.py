"""Turn a finished `RunRecord` into a trace dict. Runs on the writer thread, never on the host's loop.

Rules (reference flowagent-0.1.28 §7):
- a tool call seen by both layers (the engine's `_execute_tool_call` and the nested `arun_function`)
  is one call: the engine's record, with the function's own timing and raw error attached;
- in `a_stream`, calls seen only as `tool_start`/`tool_result` chunks (e.g. `think`) are added when no
  layer recorded that call id;
- tool success is honest: an exception, or a result that is a failure (`Error`/`System-Error` head, a
  traceback, `success: False` in a dict or its text) is a failure whatever the framework said
  (`flowrl.facts.tool_failed`, the rule every reader uses);
- `think` results are reasoning steps, one per `tool_call_id`;
- `final_answer` is the answer, not a tool call; its `success` argument is the model's own verdict;
- `success` is what the run said about itself (`flowrl.facts.reported_success`: an exception, a failed
  status, an error answer, else the final_answer flag, else the stream's `done` flag); the facts
  (`flowrl.facts`, outcome, tool tallies, task key) are filled when the dict is loaded as a trace;
- the transcript (arguments, tool-call shape, duplicate tool results, synthesis when the agent has none,
  the `final_answer` call) is read and written by `flowrl.transcript`, as ingest and rewards read it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flowrl.capture.recorder import RunRecord
from flowrl.facts import reported_success, tool_failed
from flowrl.transcript import (
    canonical_messages,
    complete_messages,
    field_of,
    final_answer_args,
    parse_arguments,
    tool_call_parts,
)

ERROR_TEXT_CHARS = 500


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).isoformat()


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _judge(result: str, raw: Any, exc: str | None) -> tuple[bool, str | None]:
    if exc:
        return False, exc
    if tool_failed(raw if raw is not None else result):
        return False, result[:ERROR_TEXT_CHARS]
    return True, None


class _Builder:
    def __init__(self, rec: RunRecord) -> None:
        self.rec = rec
        self.calls: list[tuple[float, dict[str, Any]]] = []
        self.reasoning: list[dict[str, Any]] = []
        self.think_ids: set[Any] = set()
        self.seen_ids: set[Any] = set()
        self.final_args: dict[str, Any] | None = None

    def ts(self, t0: float | None) -> str:
        rec = self.rec
        return _iso(rec.wall0 + ((t0 or rec.perf0) - rec.perf0))

    def add_reasoning(self, call_id: Any, args: Any, result: str) -> None:
        if call_id is not None and call_id in self.think_ids:
            return
        self.think_ids.add(call_id)
        thought = args.get("thought", "") if isinstance(args, dict) else _text(args)
        self.reasoning.append({"step_type": "internal_reasoning", "content": f"THOUGHT: {thought}\nASSESSMENT: {result}",
                               "call_id": call_id, "thought": thought})

    def add_call(self, t0: float | None, name: str, args: Any, result: str, raw: Any, exc: str | None,
                 dur: float | None, call_id: Any, layer: str, **extra: Any) -> None:
        if name == "final_answer":
            if isinstance(args, dict):
                self.final_args = args
            return
        if call_id is not None:
            self.seen_ids.add(call_id)
        if name == "think" and exc is None:
            self.add_reasoning(call_id, args, result)
        success, error = _judge(result, raw, exc)
        entry = {"tool_name": name, "arguments": args, "result": result, "success": success,
                 "duration_ms": round((dur or 0.0) * 1000.0, 3), "error": error, "timestamp": self.ts(t0),
                 "call_id": call_id, "layer": layer, **extra}
        self.calls.append((t0 or 0.0, entry))

    # -- events -----------------------------------------------------------------------------------
    def engine_tool(self, ev: dict[str, Any]) -> None:
        name, raw_args, call_id = tool_call_parts(ev.get("tc"))
        args = parse_arguments(raw_args)
        out = ev.get("out")
        result = out[0] if isinstance(out, tuple) and len(out) == 2 else out
        fn = ev.get("fn")
        extra: dict[str, Any] = {}
        exc = ev.get("exc")
        if fn is not None and fn.get("name") == name:
            if fn.get("dur") is not None:
                extra["function_duration_ms"] = round(fn["dur"] * 1000.0, 3)
            if fn.get("exc"):
                extra["function_error"] = fn["exc"]
                exc = exc or fn["exc"]
        elif fn is not None:  # a different tool ran inside this one: its own call
            self.function_tool(fn)
        self.add_call(ev.get("t0"), name, args, _text(result), None, exc, ev.get("dur"), call_id, "engine", **extra)

    def function_tool(self, ev: dict[str, Any]) -> None:
        raw = ev.get("raw")
        kw = {k: v for k, v in (ev.get("kw") or {}).items() if k != "function_name"}
        self.add_call(ev.get("t0"), _text(ev.get("name")), kw, _text(raw), raw, ev.get("exc"), ev.get("dur"),
                      None, "function")

    def generic_tool(self, ev: dict[str, Any]) -> None:
        name, arguments = generic_call_arguments(ev)
        raw = ev.get("raw")
        self.add_call(ev.get("t0"), _text(name), arguments, _text(raw), raw, ev.get("exc"), ev.get("dur"),
                      None, "generic")

    def stream_tools(self) -> None:
        starts: dict[Any, tuple[float, dict[str, Any]]] = {}
        for t, chunk in self.rec.chunks:
            kind = chunk.get("type")
            if kind == "tool_start":
                starts[chunk.get("id")] = (t, chunk)
            elif kind == "tool_result":
                call_id = chunk.get("id")
                if call_id in self.seen_ids:
                    continue
                t0, start = starts.get(call_id, (t, {}))
                name = _text(chunk.get("name") or start.get("name"))
                self.add_call(t0, name, parse_arguments(start.get("args")), _text(chunk.get("result")), None, None,
                              t - t0, call_id, "stream")


NAME_PARAMS = ("name", "tool", "tool_name", "function_name", "tool_id")
ARGS_PARAMS = ("args", "arguments", "params", "parameters", "input", "kwargs", "tool_input")


def generic_call_arguments(ev: dict[str, Any]) -> tuple[Any, Any]:
    """(tool name, arguments) of a generic tool method call.

    `call_tool("search", {"q": 1})` and `call_tool(name="search", q=1)` name the tool by a parameter
    called name/tool/tool_name/function_name; otherwise the method's name is the tool name. Arguments
    are the call's arguments by parameter name, `**kwargs` flattened, a lone `args`-like dict unwrapped.
    """
    args, kw = tuple(ev.get("args") or ()), dict(ev.get("kw") or {})
    name: Any = ev.get("method")
    sig = ev.get("sig")
    try:
        bound = sig.bind(*args, **kw) if sig is not None else None
    except TypeError:
        bound = None
    if bound is None:
        if args and isinstance(args[0], str):
            name, args = args[0], args[1:]
        return name, (dict(args[0]) if len(args) == 1 and isinstance(args[0], dict) and not kw
                      else ({"args": list(args), **kw} if args else kw))
    arguments: dict[str, Any] = {}
    for pname, value in bound.arguments.items():
        param = sig.parameters[pname]
        if param.kind is param.VAR_KEYWORD:
            arguments.update(value)
        elif param.kind is param.VAR_POSITIONAL:
            arguments[pname] = list(value)
        else:
            arguments[pname] = value
    first = next(iter(sig.parameters), None)
    if first in NAME_PARAMS and isinstance(arguments.get(first), str):
        name = arguments.pop(first)
    if len(arguments) == 1:
        (only, value), = arguments.items()
        if only in ARGS_PARAMS and isinstance(value, dict):
            return name, dict(value)
    return name, arguments


def _llm_output(out: Any) -> tuple[str | None, list[dict[str, Any]] | None]:
    if out is None or callable(out):
        return None, None
    if isinstance(out, str):
        return out, None
    content = field_of(out, "content")
    raw_calls = field_of(out, "tool_calls")
    if content is None and raw_calls is None:  # a whole response: OpenAI-style choices, Ollama's message
        choices = field_of(out, "choices")
        inner = field_of(choices[0], "message") if isinstance(choices, (list, tuple)) and choices else field_of(out, "message")
        if inner is not None and not isinstance(inner, str):
            content, raw_calls = field_of(inner, "content"), field_of(inner, "tool_calls")
            if content is None and raw_calls is None:
                return None, None
    if content is None and raw_calls is None:
        return str(out), None
    calls = None
    if raw_calls:
        calls = []
        for tc in raw_calls:
            name, args, call_id = tool_call_parts(tc)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": _text(args)}})
    return (None if content is None else _text(content)), calls


def _llm_call(ev: dict[str, Any]) -> dict[str, Any]:
    from flowrl.capture.tokens import token_info

    out = ev.get("out")
    output, calls = _llm_output(out)
    entry: dict[str, Any] = {"model": ev.get("model"), "tokens_in": ev.get("tin"), "tokens_out": ev.get("tout"),
                             "latency_ms": None if ev.get("dur") is None else round(ev["dur"] * 1000.0, 3),
                             "output": output, "stream": bool(ev.get("stream"))}
    if calls:
        entry["tool_calls"] = calls
    if ev.get("cost") is not None:
        entry["cost"] = ev["cost"]
    if ev.get("exc"):
        entry["error"] = ev["exc"]
    tokens = None if entry["stream"] else token_info(out)  # a stream's last chunk holds only its own ids
    if tokens is not None:
        entry.update(tokens.fields())
    return entry


def _tools_offered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for ev in events:
        tools = ev.get("kw", {}).get("tools") if ev.get("k") == "llm" else None
        for tool in tools or ():
            if isinstance(tool, dict):
                name = field_of(tool.get("function") or {}, "name") or tool.get("name")
                if name and name not in seen:
                    seen[name] = tool
    return list(seen.values())


def complete_trace(data: dict[str, Any]) -> dict[str, Any]:
    """Rebuild `messages` when the agent has no transcript of its own (after masking, from the masked
    query, tool calls and answer: each value is masked once; `flowrl.transcript.complete_messages`).

    The dict is then what schema version 2 asks for (honest tool success, canonical messages), so loading it
    runs only the later upgrades (the facts), not the transcript a second time."""
    data = complete_messages(data)
    data["schema_version"] = 2
    return data


def _reasoning_from_messages(b: _Builder, messages: list[dict[str, Any]]) -> None:
    thoughts: dict[Any, Any] = {}
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        for tc in msg.get("tool_calls") or ():
            name, args, call_id = tool_call_parts(tc)
            if name == "think":
                thoughts[call_id] = parse_arguments(args)
        if msg.get("role") == "tool" and msg.get("name") == "think":
            call_id = msg.get("tool_call_id")
            b.add_reasoning(call_id, thoughts.get(call_id, {}), _text(msg.get("content")))


def build_trace(rec: RunRecord) -> dict[str, Any]:
    hook = rec.hook
    b = _Builder(rec)
    events = list(rec.events)
    for ev in events:
        kind = ev.get("k")
        if kind == "tool":
            src = ev.get("src")
            if src == "engine":
                b.engine_tool(ev)
            elif src == "fn":
                b.function_tool(ev)
            else:
                b.generic_tool(ev)
    b.stream_tools()
    b.calls.sort(key=lambda pair: pair[0])
    tool_calls = [entry for _, entry in b.calls]
    llm_calls = [_llm_call(ev) for ev in events if ev.get("k") == "llm"]

    chunks = {c.get("type"): c for _, c in rec.chunks if c.get("type") in ("final_answer", "done", "error")}
    final = rec.result
    if final is None and rec.method != "a_run":
        final = field_of(chunks.get("done"), "final_answer") or field_of(chunks.get("final_answer"), "answer")
    final_text = _text(final)

    messages: list[dict[str, Any]] | None = None  # None: rebuilt by complete_trace() once masked
    if rec.messages is not None:
        messages = canonical_messages(rec.messages)
        _reasoning_from_messages(b, messages)

    fa = (final_answer_args(messages) if messages is not None else None) or (chunks.get("final_answer") and {"success": chunks["final_answer"].get("success")}) \
        or b.final_args or {}
    fa_success = fa.get("success") if isinstance(fa.get("success"), bool) else None
    done_success = field_of(chunks.get("done"), "success")

    status = rec.status
    success = False if rec.exc is not None else reported_success(
        answers=(fa.get("answer"), final_text), status=status, final_answer_success=fa_success, reported=done_success)

    tins = [c["tokens_in"] for c in llm_calls if isinstance(c.get("tokens_in"), (int, float))]
    touts = [c["tokens_out"] for c in llm_calls if isinstance(c.get("tokens_out"), (int, float))]
    costs = [c["cost"] for c in llm_calls if isinstance(c.get("cost"), (int, float))]
    timestamp = _iso(rec.wall0)
    task = {"task_id": rec.run_id or "", "type": "execution_run", "description": _text(rec.query), "timestamp": timestamp}
    metadata = {"adapter": rec.adapter, "method": rec.method, **hook.metadata, **rec.meta}
    if fa_success is not None:
        metadata["final_answer_success"] = fa_success
    if rec.exc is not None:
        metadata["error"] = rec.exc
    if rec.overflow:
        metadata["events_over_limit"] = rec.overflow

    return {
        "session_id": _text(rec.session_id) or "default",
        "timestamp": timestamp,
        "user_query": _text(rec.query),
        "tool_calls": tool_calls,
        "reasoning_steps": b.reasoning,
        "tasks_created": [task],
        "tasks_completed": [{**task, "status": status, "result": final_text}] if success is True else [],
        "tasks_failed": [{**task, "status": status, "error": rec.exc or final_text}] if success is False else [],
        "final_response": final_text,
        "total_tokens_in": sum(tins) if tins else None,
        "total_tokens_out": sum(touts) if touts else None,
        "total_cost": sum(costs) if costs else None,
        "execution_duration_ms": None if rec.duration is None else round(rec.duration * 1000.0, 3),
        "llm_calls_count": len(llm_calls),
        "agent_name": hook.agent_name,
        "run_id": rec.run_id,
        "source": hook.source,
        "success": success,
        "status": status,
        "messages": messages,
        "tools": _tools_offered(events),
        "llm_calls": llm_calls,
        "metadata": metadata,
    }
