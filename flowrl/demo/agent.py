"""An example agent that behaves like a toolboxv2 FlowAgent, driven by a local model.

It has FlowAgent's shape, so `hook_into_agent` captures it the same way: `a_run(query, session_id,
get_ctx=...)` never raises, an execution engine (`_get_execution_engine()`) runs a ReAct loop that
calls `a_run_llm_completion(..., get_response_message=True)` and `_execute_tool_call(ctx, tool_call)`,
which handles `final_answer` itself and sends every other tool to `arun_function(name, **kwargs)`.
The transcript lives in `ExecutionContext.working_history` in OpenAI format.

Tools: `exec_code` (a Python calculator, run in flowrl's sandbox), `lookup` (a small fact table),
`get_weather` (fails about one call in three), and `final_answer(answer, success)`.

The model writes tool calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; text
without a tool call is taken as the final answer. Its outputs are real model output: good and bad
traces come from the model, not from a script.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

FACTS = {
    "capital of france": "Paris", "capital of japan": "Tokyo", "capital of italy": "Rome",
    "boiling point of water": "100 degrees Celsius", "days in a week": "7", "speed of light": "299792458 m/s",
}
WEATHER = {"berlin": "sunny, 21C", "rome": "cloudy, 18C", "paris": "rainy, 15C"}

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "exec_code", "description": "Run Python code and return what it prints.",
     "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Look up a fact, e.g. 'capital of france'.",
     "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "final_answer", "description": "Give the final answer to the user.",
     "parameters": {"type": "object", "properties": {"answer": {"type": "string"}, "success": {"type": "boolean"}},
                    "required": ["answer"]}}},
]

SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Tools:\n"
    + "\n".join(f"- {t['function']['name']}: {t['function']['description']} "
                f"arguments: {json.dumps(list(t['function']['parameters']['properties']))}" for t in TOOLS)
    + "\nTo use a tool, reply with exactly one line: "
    '<tool_call>{"name": "exec_code", "arguments": {"code": "print(2 + 2)"}}</tool_call>\n'
    'When you know the answer, reply: <tool_call>{"name": "final_answer", "arguments": {"answer": "4"}}</tool_call>'
)

# One worked example before the user's turn: small models copy its shape.
FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": '<tool_call>{"name": "exec_code", "arguments": {"code": "print(2 + 3)"}}</tool_call>'},
    {"role": "user", "content": "[exec_code result] 5"},
    {"role": "assistant", "content": '<tool_call>{"name": "final_answer", "arguments": {"answer": "5"}}</tool_call>'},
]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass
class Completion:
    """A backend's reply. The token fields are what the model was given and what it sampled (end-of-turn
    token included) with each sampled token's log-probability, when the backend knows them; capture records
    them on the LLM call, so datasets train on exactly these ids (docs/datasets.md)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None


class ChatBackend(Protocol):
    model_name: str

    def complete(self, messages: list[dict[str, Any]]) -> Completion | tuple[str, int, int]:
        """Return a `Completion`, or (text, prompt tokens, completion tokens)."""


@dataclass
class _ToolFunction:
    name: str
    arguments: str


@dataclass
class _ToolCall:
    id: str
    function: _ToolFunction
    type: str = "function"


@dataclass
class _AssistantMessage:
    content: str | None
    tool_calls: list[_ToolCall] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None


@dataclass
class ExecutionContext:
    run_id: str
    session_id: str
    query: str
    status: str = "running"
    working_history: list[dict[str, Any]] = field(default_factory=list)
    current_iteration: int = 0
    max_iterations: int = 4
    tools_dict: list[dict[str, Any]] = field(default_factory=list)


def parse_tool_calls(text: str) -> list[_ToolCall]:
    calls = []
    for raw in _TOOL_CALL.findall(text or ""):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            calls.append(_ToolCall(f"call_{uuid.uuid4().hex[:8]}", _ToolFunction("invalid_tool_call", raw)))
            continue
        if isinstance(data, list):
            data = data[0] if data else {}
        if not isinstance(data, dict):
            continue
        args = data.get("arguments", {})
        calls.append(_ToolCall(f"call_{uuid.uuid4().hex[:8]}",
                               _ToolFunction(str(data.get("name", "")), args if isinstance(args, str) else json.dumps(args))))
    return calls


class ExampleEngine:
    def __init__(self, agent: ExampleAgent) -> None:
        self.agent = agent
        self._active_executions: dict[str, ExecutionContext] = {}
        self._session_last_run: dict[str, str] = {}

    async def execute(self, query: str, session_id: str, max_iterations: int) -> tuple[str, ExecutionContext]:
        ctx = ExecutionContext(uuid.uuid4().hex[:8], session_id, query, max_iterations=max_iterations)
        ctx.working_history = [{"role": "system", "content": SYSTEM_PROMPT}, *FEW_SHOT, {"role": "user", "content": query}]
        self._active_executions[ctx.run_id] = ctx
        self._session_last_run[session_id] = ctx.run_id
        answer = ""
        for _ in range(max_iterations):
            ctx.current_iteration += 1
            msg = await self.agent.a_run_llm_completion(messages=list(ctx.working_history), tools=TOOLS,
                                                        get_response_message=True, with_context=False)
            ctx.working_history.append({"role": "assistant", "content": msg.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in msg.tool_calls] or None})
            if not ctx.working_history[-1]["tool_calls"]:
                ctx.working_history[-1].pop("tool_calls")
                answer, ctx.status = (msg.content or "").strip(), "completed"
                return answer, ctx
            for call in msg.tool_calls:
                result, is_final = await self._execute_tool_call(ctx, call)
                if is_final:
                    ctx.status = "completed"
                    return result, ctx
        ctx.status = "max_iterations"
        return answer or "I could not finish the task.", ctx

    async def _execute_tool_call(self, ctx: ExecutionContext, tool_call: _ToolCall) -> tuple[str, bool]:
        name = tool_call.function.name
        try:
            args = json.loads(tool_call.function.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be an object")
        except (json.JSONDecodeError, ValueError):
            result = "System-Error: Invalid JSON in tool arguments"
            ctx.working_history.append({"role": "tool", "tool_call_id": tool_call.id, "name": name, "content": result})
            return result, False
        if name == "final_answer":
            ctx.final_success = bool(args.get("success", True))  # type: ignore[attr-defined]
            return str(args.get("answer", "")), True
        try:
            result = str(await self.agent.arun_function(name, **args))
        except Exception as exc:
            result = f"Error executing {name}: {exc}"
        ctx.working_history.append({"role": "tool", "tool_call_id": tool_call.id, "name": name, "content": result})
        ctx.tools_dict.append({"name": name, "args": args, "result": result})
        return result, False


class ExampleAgent:
    """A FlowAgent look-alike. `backend` produces the model's text; `sandbox` runs `exec_code`."""

    def __init__(self, backend: ChatBackend, *, name: str = "example_agent", sandbox: Any = None, seed: int = 0) -> None:
        self.amd = SimpleNamespace(name=name, fast_llm_model=backend.model_name, complex_llm_model=backend.model_name)
        self.backend = backend
        self.sandbox = sandbox
        self._rng = random.Random(seed)
        self._execution_engine_cache: ExampleEngine | None = None
        self.total_tokens_in = self.total_tokens_out = self.total_llm_calls = 0

    def _get_execution_engine(self) -> ExampleEngine:
        if self._execution_engine_cache is None:
            self._execution_engine_cache = ExampleEngine(self)
        return self._execution_engine_cache

    async def a_run(self, query: str, session_id: str = "default", execution_id: str | None = None,
                    max_iterations: int = 4, get_ctx: bool = False, **kwargs: Any) -> Any:
        ctx = None
        try:
            answer, ctx = await self._get_execution_engine().execute(query, session_id, max_iterations)
        except Exception as exc:  # FlowAgent's a_run never raises
            answer = f"Error: {exc}"
        return (answer, ctx) if get_ctx else answer

    async def a_run_llm_completion(self, messages: list[dict[str, Any]], tools: Any = None,
                                   get_response_message: bool = False, **kwargs: Any) -> Any:
        reply = await asyncio.to_thread(self.backend.complete, messages)
        if not isinstance(reply, Completion):
            reply = Completion(*reply)
        text = reply.text
        self.total_tokens_in += reply.prompt_tokens
        self.total_tokens_out += reply.completion_tokens
        self.total_llm_calls += 1
        if not get_response_message:
            return text
        calls = parse_tool_calls(text)
        content = _TOOL_CALL.sub("", text).strip() or None
        return _AssistantMessage(content if not calls else (content or None), calls, reply.prompt_token_ids,
                                 reply.token_ids, reply.logprobs, reply.tokenizer)

    async def arun_function(self, function_name: str, **kwargs: Any) -> Any:
        if function_name == "exec_code":
            return await asyncio.to_thread(self._exec_code, str(kwargs.get("code", "")))
        if function_name == "lookup":
            key = str(kwargs.get("key", "")).lower().strip(" ?.")
            for fact, value in FACTS.items():
                if fact in key or key in fact and key:
                    return value
            raise KeyError(f"no fact for {kwargs.get('key')!r}")
        if function_name == "get_weather":
            if self._rng.random() < 0.34:
                raise TimeoutError("weather service unreachable")
            city = str(kwargs.get("city", "")).lower()
            if city not in WEATHER:
                raise KeyError(f"unknown city {kwargs.get('city')!r}")
            return WEATHER[city]
        raise KeyError(f"unknown tool {function_name!r}")

    def _exec_code(self, code: str) -> dict[str, Any]:
        if self.sandbox is None:
            raise RuntimeError("exec_code needs a sandbox")
        res = self.sandbox.run(code, "python", timeout=5.0)
        return {"success": res.status == "ok", "output": (res.stdout or "").strip()[:500],
                "error": (res.stderr or "").strip()[-500:] or None}
