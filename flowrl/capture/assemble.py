"""Turn a finished `RunRecord` into a trace dict. Runs on the writer thread, never on the host's loop.

Rules (docs/reference/flowagent-0.1.28.md §7):
- a tool call seen by both layers (the engine's `_execute_tool_call` and the nested `arun_function`)
  is one call: the engine's record, with the function's own timing and raw error attached;
- in `a_stream`, calls seen only as `tool_start`/`tool_result` chunks (e.g. `think`) are added when no
  layer recorded that call id;
- tool success is honest: an exception, or a result that is a failure (`Error`/`System-Error` head, a
  traceback, `success: False` in a dict or its text) is a failure whatever the framework said
  (`flowrl.trace.facts.tool_failed`, the rule every reader uses);
- `think` results are reasoning steps, one per `tool_call_id`;
- `final_answer` is the answer, not a tool call; its `success` argument is the model's own verdict;
- `success` is what the run said about itself (`flowrl.trace.facts.reported_success`: an exception, a failed
  status, an error answer, else the final_answer flag, else the stream's `done` flag); the facts
  (`flowrl.trace.facts`, outcome, tool tallies, task key) are filled when the dict is loaded as a trace;
- the transcript (arguments, tool-call shape, duplicate tool results, synthesis when the agent has none,
  the `final_answer` call) is read and written by `flowrl.trace.transcript`, as ingest and rewards read it.
"""

from __future__ import annotations

import datetime
from typing import Any

from flowrl.capture import client_read
from flowrl.capture.events import Event, LLMEvent, ToolEvent
from flowrl.capture.recorder import RunRecord
from flowrl.capture.registration import DEFAULT_MAX_CHARS
from flowrl.capture.tokens import token_info
from flowrl.capture.values import Values, type_name, unserialisable
from flowrl.trace.facts import reported_success, tool_failed
from flowrl.trace.transcript import (
    canonical_message,
    complete_messages,
    dedup_tool_results,
    field_of,
    final_answer_args,
    parse_arguments,
    tool_call_parts,
    transcript_calls,
)

ERROR_TEXT_CHARS = 500
LLM_CLIENT = "llm_client"  # metadata.transcript of a run whose messages are its last LLM client call's


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat()


# -- captured values -> JSON, one value at a time --------------------------------------------------


def _judged(v: Values, raw: Any, result: str) -> Any:
    """What a tool's success is judged by (`flowrl.trace.facts.tool_failed`): its result as JSON data (a string
    result is its text, already made)."""
    return result if isinstance(raw, str) or raw is None else v.plain(raw)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an object whose == raises is not the same
        return False


def _judge(result: str, raw: Any, exc: str | None) -> tuple[bool, str | None]:
    if exc:
        return False, exc
    if tool_failed(raw if raw is not None else result):
        return False, result[:ERROR_TEXT_CHARS]
    return True, None


class _Builder:
    def __init__(self, rec: RunRecord, values: Values) -> None:
        self.rec = rec
        self.v = values
        self.calls: list[tuple[float, dict[str, Any]]] = []
        self.reasoning: list[dict[str, Any]] = []
        self.think_ids: set[Any] = set()
        self.seen_ids: set[Any] = set()
        self.final_args: dict[str, Any] | None = None
        self.unreadable_messages = 0  # transcript entries that are not messages (left out, counted)

    def ts(self, t0: float | None) -> str:
        rec = self.rec
        return _iso(rec.wall0 + ((t0 or rec.perf0) - rec.perf0))

    def call_id(self, value: Any) -> str | None:
        return None if value is None else self.v.text(value)

    def arguments(self, raw: Any) -> Any:
        """A call's arguments (`parse_arguments`), as JSON data. Text too long to keep whole is kept as
        (cut) text, not parsed: parsing it would hold the writer for as long as it is."""
        v = self.v
        if isinstance(raw, str) and v.limit is not None and len(raw) > v.limit:
            return v.string(raw)
        try:
            parsed = parse_arguments(raw)
        except BaseException:
            parsed = raw
        return v.plain(parsed)

    def add_reasoning(self, call_id: Any, args: Any, result: str) -> None:
        if call_id is not None and call_id in self.think_ids:
            return
        self.think_ids.add(call_id)
        thought = args.get("thought", "") if isinstance(args, dict) else self.v.text(args)
        self.reasoning.append(
            {
                "step_type": "internal_reasoning",
                "content": f"THOUGHT: {thought}\nASSESSMENT: {result}",
                "call_id": call_id,
                "thought": thought,
            }
        )

    def add_call(  # noqa: PLR0913  # one recorded call's fields, named at each call site
        self,
        t0: float | None,
        name: str,
        args: Any,
        result: str,
        raw: Any,
        exc: Any,
        dur: float | None,
        call_id: str | None,
        layer: str,
        **extra: Any,
    ) -> None:
        """One tool call; `args` and `raw` are JSON data already, `exc` is text (or an ErrorText)."""
        if name == "final_answer":
            if isinstance(args, dict):
                self.final_args = args
            return
        if call_id is not None:
            self.seen_ids.add(call_id)
        error_text = self.v.text(exc) if exc else None
        if name == "think" and error_text is None:
            self.add_reasoning(call_id, args, result)
        success, error = _judge(result, raw, error_text)
        entry = {
            "tool_name": name,
            "arguments": args,
            "result": result,
            "success": success,
            "duration_ms": round((dur or 0.0) * 1000.0, 3),
            "error": error,
            "timestamp": self.ts(t0),
            "call_id": call_id,
            "layer": layer,
            **extra,
        }
        self.calls.append((t0 or 0.0, entry))

    # -- events -----------------------------------------------------------------------------------
    def tool(self, ev: ToolEvent) -> None:
        if ev.source == "engine":
            self.engine_tool(ev)
        elif ev.source == "function":
            self.function_tool(ev)
        else:
            self.generic_tool(ev)

    def engine_tool(self, ev: ToolEvent) -> None:
        v = self.v
        tc = ev.tool_call
        try:
            name, raw_args, call_id = tool_call_parts(tc)
        except Exception as err:  # a name or id whose str() raises
            name, raw_args, call_id = unserialisable(type_name(tc), f"reading it raised {type_name(err)}"), None, None
        out = ev.result
        result = out[0] if isinstance(out, tuple) and len(out) == 2 else out
        fn = ev.inner
        extra: dict[str, Any] = {}
        exc = ev.error
        if fn is not None and _same(fn.name, name):
            if fn.duration is not None:
                extra["function_duration_ms"] = round(fn.duration * 1000.0, 3)
            if fn.error:
                extra["function_error"] = v.text(fn.error)
                exc = exc or fn.error
        elif fn is not None:  # a different tool ran inside this one: its own call
            self.function_tool(fn)
        self.add_call(
            ev.started,
            v.text(name),
            self.arguments(raw_args),
            v.text(result),
            None,
            exc,
            ev.duration,
            self.call_id(call_id),
            "engine",
            **extra,
        )

    def function_tool(self, ev: ToolEvent) -> None:
        v = self.v
        raw = ev.result
        kw = {k: val for k, val in (ev.kwargs or {}).items() if k != "function_name"}
        result = v.text(raw)
        self.add_call(
            ev.started,
            v.text(ev.name),
            v.plain(kw),
            result,
            _judged(v, raw, result),
            ev.error,
            ev.duration,
            None,
            "function",
        )

    def generic_tool(self, ev: ToolEvent) -> None:
        v = self.v
        name, arguments = generic_call_arguments(ev)
        raw = ev.result
        result = v.text(raw)
        self.add_call(
            ev.started,
            v.text(name),
            v.plain(arguments),
            result,
            _judged(v, raw, result),
            ev.error,
            ev.duration,
            None,
            "generic",
        )

    def stream_tools(self) -> None:
        v = self.v
        starts: dict[Any, tuple[float, dict[str, Any]]] = {}
        for t, chunk in self.rec.chunks:
            kind = chunk.get("type")
            if kind == "tool_start":
                starts[self.call_id(chunk.get("id"))] = (t, chunk)
            elif kind == "tool_result":
                call_id = self.call_id(chunk.get("id"))
                if call_id in self.seen_ids:
                    continue
                t0, start = starts.get(call_id, (t, {}))
                name = v.text(chunk.get("name") or start.get("name"))
                self.add_call(
                    t0,
                    name,
                    self.arguments(start.get("args")),
                    v.text(chunk.get("result")),
                    None,
                    None,
                    t - t0,
                    call_id,
                    "stream",
                )

    def messages(self, raw: Any) -> list[dict[str, Any]]:
        """The agent's own transcript in canonical form, as JSON data, one message at a time: a message
        that cannot be made canonical as it is, is made so from its JSON data; one that is not a dict
        then is left out (counted in metadata `unreadable_messages`)."""
        v = self.v
        try:
            messages = dedup_tool_results(list(raw))
        except BaseException:
            messages = list(raw) if isinstance(raw, list) else []
        out = []
        for message in messages:
            try:
                done = v.plain(canonical_message(message))
            except BaseException:
                try:
                    done = canonical_message(v.plain(message))
                except BaseException:
                    done = None
            if isinstance(done, dict):
                out.append(done)
            else:
                self.unreadable_messages += 1
        return out


NAME_PARAMS = ("name", "tool", "tool_name", "function_name", "tool_id")
ARGS_PARAMS = ("args", "arguments", "params", "parameters", "input", "kwargs", "tool_input")


def generic_call_arguments(ev: ToolEvent) -> tuple[Any, Any]:
    """(tool name, arguments) of a generic tool method call.

    `call_tool("search", {"q": 1})` and `call_tool(name="search", q=1)` name the tool by a parameter
    called name/tool/tool_name/function_name; otherwise the method's name is the tool name. Arguments
    are the call's arguments by parameter name, `**kwargs` flattened, a lone `args`-like dict unwrapped.
    """
    args, kw = tuple(ev.args or ()), dict(ev.kwargs or {})
    name: Any = ev.method
    sig = ev.signature
    try:
        bound = sig.bind(*args, **kw) if sig is not None else None
    except TypeError:
        bound = None
    if bound is None or sig is None:
        if args and isinstance(args[0], str):
            name, args = args[0], args[1:]
        return name, (
            dict(args[0])
            if len(args) == 1 and isinstance(args[0], dict) and not kw
            else ({"args": list(args), **kw} if args else kw)
        )
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
        ((only, value),) = arguments.items()
        if only in ARGS_PARAMS and isinstance(value, dict):
            return name, dict(value)
    return name, arguments


def _llm_output(v: Values, out: Any) -> tuple[str | None, list[dict[str, Any]] | None]:
    if out is None or callable(out):
        return None, None
    if isinstance(out, str):
        return v.string(out), None
    content = field_of(out, "content")
    raw_calls = field_of(out, "tool_calls")
    if content is None and raw_calls is None:  # a whole response: OpenAI-style choices, Ollama's message
        choices = field_of(out, "choices")
        inner = (
            field_of(choices[0], "message")
            if isinstance(choices, (list, tuple)) and choices
            else field_of(out, "message")
        )
        if inner is not None and not isinstance(inner, str):
            content, raw_calls = field_of(inner, "content"), field_of(inner, "tool_calls")
            if content is None and raw_calls is None:
                return None, None
    if content is None and raw_calls is None:
        return v.text(out), None
    calls = None
    if raw_calls:
        calls = []
        for tc in raw_calls:
            name, args, call_id = tool_call_parts(tc)
            calls.append(
                {
                    "id": None if call_id is None else v.text(call_id),
                    "type": "function",
                    "function": {"name": v.text(name), "arguments": v.text(args)},
                }
            )
    return (None if content is None else v.text(content)), calls


def _llm_call(ev: LLMEvent, v: Values | None = None) -> dict[str, Any]:
    v = v or Values()
    out = ev.output
    try:
        output, calls = _llm_output(v, out)
    except BaseException:  # an attribute that raises: the output as text
        output, calls = v.text(out), None
    model = ev.model
    entry: dict[str, Any] = {
        "model": None if model is None else v.text(model),
        "tokens_in": ev.tokens_in,
        "tokens_out": ev.tokens_out,
        "latency_ms": None if ev.duration is None else round(ev.duration * 1000.0, 3),
        "output": output,
        "stream": bool(ev.stream),
    }
    if calls:
        entry["tool_calls"] = calls
    if ev.cost is not None:
        entry["cost"] = ev.cost
    if ev.error:
        entry["error"] = v.text(ev.error)
    tokens = None if entry["stream"] else token_info(out)  # a stream's last chunk holds only its own ids
    if tokens is not None:
        entry.update(tokens.fields())
    return entry


def _offered(ev: Event) -> list[Any]:
    """The tools an LLM event offered: its own `tools=`, and those of the client calls made inside it."""
    if not isinstance(ev, LLMEvent):
        return []
    if ev.api is not None:
        return client_read.tools_of(ev)
    tools = (ev.kwargs or {}).get("tools")
    found = list(tools) if isinstance(tools, (list, tuple)) else []  # never iterate the host's generator
    for inner in ev.inner or ():
        found += client_read.tools_of(inner)
    return found


def _llm_entry(ev: LLMEvent, v: Values) -> dict[str, Any]:
    """One `llm_calls` entry: a hooked method's, a client call's (`openai_client`), or both merged."""
    try:
        if ev.api is not None:
            return client_read.call_entry(ev, v)
        entry = _llm_call(ev, v)
        return client_read.merged_entry(entry, ev.inner, v) if ev.inner else entry
    except BaseException:  # a response object that cannot be read: the call as a method saw it
        return _llm_call(ev, v)


def _seen_messages(ev: LLMEvent, earlier: list[LLMEvent]) -> list[Any] | None:
    try:
        return client_read.seen_messages(ev, earlier[: earlier.index(ev)] if ev in earlier else earlier)
    except BaseException:  # an object in the request that cannot be read: no transcript from it
        return None


def _calls_from_messages(b: _Builder, messages: list[dict[str, Any]], asked: dict[str, float]) -> None:
    """The tool calls of a run known by its transcript alone (no tool method hooked): each call the model
    asked for that a tool message answers, timed at the end of the LLM call that asked for it."""
    for call in transcript_calls(messages):
        if call.result is None and call.name != "final_answer":
            continue  # asked for, never answered: not run (it stays in `messages`)
        t0 = asked.get(call.call_id) if call.call_id else None
        result = call.result or ""
        b.add_call(t0, call.name, b.arguments(call.arguments), result, None, None, None, call.call_id, "transcript")


def _tools_offered(v: Values, events: list[Event]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for ev in events:
        try:
            tools = _offered(ev)
        except BaseException:
            continue
        for tool in tools:
            try:
                if isinstance(tool, dict):
                    name = field_of(tool.get("function") or {}, "name") or tool.get("name")
                    if isinstance(name, str) and name and name not in seen:
                        seen[name] = v.plain(tool)
            except BaseException:
                continue
    return [tool for tool in seen.values() if isinstance(tool, dict)]


def complete_trace(data: dict[str, Any]) -> dict[str, Any]:
    """Rebuild `messages` when the agent has no transcript of its own (after masking, from the masked
    query, tool calls and answer: each value is masked once; `flowrl.trace.transcript.complete_messages`).

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
            b.add_reasoning(call_id, thoughts.get(call_id, {}), b.v.text(msg.get("content")))


def values_for(hook: Any) -> Values:
    """The `Values` of one build: the hook's `max_chars`, and its edge masker when it masks."""
    reg = getattr(hook, "registration", None)
    return Values(getattr(reg, "max_chars", DEFAULT_MAX_CHARS), getattr(reg, "premask", None))


def build_trace(rec: RunRecord) -> dict[str, Any]:  # noqa: C901, PLR0915  # one run's record to the stored trace, in stored-field order
    """The trace dict of a finished run, every value in it JSON data (`Values`): a value that cannot be
    written is marked, never the whole trace lost for it."""
    hook = rec.hook
    v = values_for(hook)
    b = _Builder(rec, v)
    events = list(rec.events)
    llm_calls = []
    client_seen: LLMEvent | None = None  # the last client call that carries its request (what the model saw)
    clients: list[LLMEvent] = []  # every client call, in order (a Responses call may continue an earlier one)
    asked: dict[str, float] = {}  # tool call id -> when the call that asked for it returned
    has_tool_events = False
    for ev in events:
        if isinstance(ev, ToolEvent):
            has_tool_events = True
            b.tool(ev)
            continue
        entry = _llm_entry(ev, v)
        llm_calls.append(entry)
        for client in client_read.client_events(ev):
            clients.append(client)
            if client.request is not None or client.kwargs.get("instructions"):
                client_seen = client
        end = ev.started + (ev.duration or 0.0)
        for tc in entry.get("tool_calls") or ():
            if isinstance(tc, dict) and tc.get("id"):
                asked.setdefault(tc["id"], end)
    b.stream_tools()
    b.calls.sort(key=lambda pair: pair[0])
    tool_calls = [entry for _, entry in b.calls]

    chunks = {c.get("type"): c for _, c in rec.chunks if c.get("type") in ("final_answer", "done", "error")}
    final = rec.result
    if final is None and rec.method != "a_run":
        final = field_of(chunks.get("done"), "final_answer") or field_of(chunks.get("final_answer"), "answer")
    final_text = v.text(final)

    messages: list[dict[str, Any]] | None = None  # None: rebuilt by complete_trace() once masked
    transcript = None
    if rec.messages is not None:  # the adapter's own transcript (FlowAgent's working history)
        messages = b.messages(rec.messages)
    elif client_seen is not None:  # what the model saw: the last client call's request and its response
        seen = _seen_messages(client_seen, clients)
        if seen is not None:
            messages, transcript = b.messages(seen), LLM_CLIENT
            if not has_tool_events:  # no tool method hooked: the transcript's answered calls are the tool calls
                _calls_from_messages(b, messages, asked)
                b.calls.sort(key=lambda pair: pair[0])
                tool_calls = [entry for _, entry in b.calls]
    if messages is not None:
        _reasoning_from_messages(b, messages)

    fa = (
        (final_answer_args(messages) if messages is not None else None)
        or (chunks.get("final_answer") and {"success": chunks["final_answer"].get("success")})
        or b.final_args
        or {}
    )
    fa_success = fa.get("success") if isinstance(fa.get("success"), bool) else None
    done_success = field_of(chunks.get("done"), "success")

    status = None if rec.status is None else v.text(rec.status)
    error = None if rec.exc is None else v.text(rec.exc)
    success = (
        False
        if error is not None
        else reported_success(
            answers=(v.plain(fa.get("answer")), final_text),
            status=status,
            final_answer_success=fa_success,
            reported=done_success,
        )
    )

    tins = [c["tokens_in"] for c in llm_calls if isinstance(c.get("tokens_in"), (int, float))]
    touts = [c["tokens_out"] for c in llm_calls if isinstance(c.get("tokens_out"), (int, float))]
    costs = [c["cost"] for c in llm_calls if isinstance(c.get("cost"), (int, float))]
    timestamp = _iso(rec.wall0)
    run_id = None if rec.run_id is None else v.text(rec.run_id)
    query = v.text(rec.query)
    task = {"task_id": run_id or "", "type": "execution_run", "description": query, "timestamp": timestamp}
    metadata = v.plain({"adapter": rec.adapter, "method": rec.method, **hook.metadata, **rec.meta})
    if fa_success is not None:
        metadata["final_answer_success"] = fa_success
    if error is not None:
        metadata["error"] = error
    if rec.overflow:
        metadata["events_over_limit"] = rec.overflow
    if b.unreadable_messages:
        metadata["unreadable_messages"] = b.unreadable_messages
    if transcript is not None:
        metadata["transcript"] = transcript

    return {
        "trace_id": rec.trace_id,
        "session_id": v.text(rec.session_id) or "default",
        "timestamp": timestamp,
        "user_query": query,
        "tool_calls": tool_calls,
        "reasoning_steps": b.reasoning,
        "tasks_created": [task],
        "tasks_completed": [{**task, "status": status, "result": final_text}] if success is True else [],
        "tasks_failed": [{**task, "status": status, "error": error or final_text}] if success is False else [],
        "final_response": final_text,
        "total_tokens_in": sum(tins) if tins else None,
        "total_tokens_out": sum(touts) if touts else None,
        "total_cost": sum(costs) if costs else None,
        "execution_duration_ms": None if rec.duration is None else round(rec.duration * 1000.0, 3),
        "llm_calls_count": len(llm_calls),
        "agent_name": hook.agent_name,
        "run_id": run_id,
        "source": hook.source,
        "success": success,
        "status": status,
        "messages": messages,
        "tools": _tools_offered(v, events),
        "llm_calls": llm_calls,
        "metadata": metadata,
        "outcomes": [o.model_dump(mode="json") for o in rec.take_outcomes()],
    }
