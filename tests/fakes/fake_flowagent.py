"""A faithful, offline stand-in for toolboxv2 0.1.28's FlowAgent (the V2 agent).

It mirrors the call chain and the signatures that capture depends on (reference
flowagent-0.1.28.md §1.1, §1.2, §2, §3.6), so the tests exercise the same paths as the real agent:

- `a_run(query, session_id="default", execution_id=None, human_online=False, max_iterations=30,
  get_ctx=False, persist_blocking=False, **kwargs)` never raises: it returns "Error: ..." on failure,
  and `(answer, ctx)` when `get_ctx=True`; `finally: await self.save()`.
- a sidecar answer when the session's last run is still `running`; auto-resume of the session's
  last context while it is still in memory (the engine appends `system: "Continue with old task
  using new user information's"` + the new user turn to the same `working_history` and re-runs
  `execute(query=ctx.query)`); a fresh run evicts completed contexts; " #new-ctx" forces a fresh one.
- `_get_execution_engine()` returns the cached `ExecutionEngine` (`agent._execution_engine_cache`).
- the engine's loop calls `self.agent.a_run_llm_completion(messages=..., tools=..., max_tokens=16384,
  stream=False, get_response_message=True, with_context=False, model_preference=...)`, appends the
  assistant message (OpenAI `tool_calls` dicts) to `ctx.working_history`, ends on a lone
  `final_answer`, and runs the other calls in parallel through `self._execute_tool_call(ctx, tc)`,
  which returns `(result_str, is_final)`; `think`, `final_answer`, `load_tools`, `spawn_sub_agent`
  are handled in the engine, every other tool goes to `self.agent.arun_function(name, **args)`.
- `think` runs a stream-mode LLM call (`a_run_llm_completion(stream=True)` returns an async-generator
  *function*, uncalled; its last item is the final text) and in the non-stream path its result is
  appended to the transcript twice with the same `tool_call_id`.
- tool exceptions become "Error executing {name}: {e}" (loaded tools) or "Error: Tool '{name}' war
  noch nicht geladen ..." ; bad JSON arguments give "System-Error: Invalid JSON in tool arguments".
- `a_stream(...)` is an async generator of dict chunks (status, iteration_start, content, reasoning,
  tool_start{name,args,id}, tool_result{name,is_final,result,id}, final_answer{answer,success},
  max_iterations, error, done{success,final_answer}); think calls there bypass `_execute_tool_call`.
- after the loop a run summary is committed in a background task unless `persist_blocking=True`
  (it makes one more LLM call, after `a_run` has returned); only that commit turns the context's
  status from "running" into "completed" ("max_iterations" is set by the loop itself).

The LLM is scripted per query (`ScriptedLLM.script`), so concurrent sessions get their own turns.
Plain data only: a fake agent copies and pickles (tools must be module-level functions).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

SUMMARY_TEXT = "Compact run summary written by the fast model."
RESUME_TEXT = "Continue with old task using new user information's"
STATIC_TOOLS = ("think", "final_answer", "load_tools", "spawn_sub_agent")


def tc(i: Any, name: str, args: dict[str, Any] | str) -> dict[str, Any]:
    """One scripted tool call: `tc(1, "get_weather", {"city": "Paris"})`."""
    return {
        "id": i if isinstance(i, str) else f"call_{i}",
        "name": name,
        "arguments": args if isinstance(args, str) else json.dumps(args),
    }


def turn(*calls: dict[str, Any], content: str = "") -> dict[str, Any]:
    return {"content": content, "tool_calls": list(calls)}


@dataclass
class AgentModelData:
    name: str = "fake_agent"
    fast_llm_model: str = "mock/fast"
    complex_llm_model: str = "mock/complex"
    system_message: str = "You are a helpful assistant."


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
    tool_calls: list[_ToolCall] | None = None


@dataclass
class ExecutionContext:
    session_id: str = "default"
    query: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    status: str = "running"
    working_history: list[dict[str, Any]] = field(default_factory=list)
    tools_used: list[str] = field(default_factory=list)
    tools_dict: list[dict[str, Any]] = field(default_factory=list)
    loaded_tools: list[str] = field(default_factory=list)
    current_iteration: int = 0
    max_iterations: int = 30

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "query": self.query,
            "status": self.status,
            "working_history": list(self.working_history),
            "tools_used": list(self.tools_used),
            "current_iteration": self.current_iteration,
            "max_iterations": self.max_iterations,
        }


class ScriptedLLM:
    """Replays scripted assistant turns. Main-loop calls (tools include final_answer) pop the script
    of the last user message; think streams pop `thinks`; anything else gets the summary text."""

    def __init__(self, latency: float = 0.0005, tokens_in: int = 100, tokens_out: int = 10) -> None:
        self.scripts: dict[str, list[dict[str, Any]]] = {}
        self.thinks: list[str] = []
        self.latency = latency
        self.tokens_in, self.tokens_out = tokens_in, tokens_out
        self.calls = 0

    def script(self, query: str, turns: list[dict[str, Any]]) -> None:
        self.scripts[query] = list(turns)

    def _turn(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        query = users[-1] if users else ""
        turns = self.scripts.get(query)
        if not turns:
            return {"content": f"(no script for {query!r})", "tool_calls": []}
        return turns.pop(0)

    async def complete(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.calls += 1
        await asyncio.sleep(self.latency)
        is_main = any((t.get("function") or {}).get("name") == "final_answer" for t in tools or ())
        return self._turn(messages) if is_main else {"content": SUMMARY_TEXT, "tool_calls": []}

    async def stream(self, **kw: Any):
        self.calls += 1
        text = self.thinks.pop(0) if self.thinks else "ok"
        for word in text.split(" "):
            await asyncio.sleep(0)
            yield word


class ToolManager:
    def __init__(self) -> None:
        self.tools: dict[str, Any] = {}
        self.descriptions: dict[str, str] = {}

    async def execute(self, name: str, **kwargs: Any) -> Any:
        func = self.tools.get(name)
        if func is None:
            raise KeyError(f"Tool '{name}' not found")
        result = func(**kwargs)
        if asyncio.iscoroutine(result):
            result = await result
        return result


@dataclass
class AgentSession:
    session_id: str
    history: list[dict[str, Any]] = field(default_factory=list)
    tool_restrictions: dict[str, bool] = field(default_factory=dict)

    def is_tool_allowed(self, name: str) -> bool:
        return self.tool_restrictions.get(name, True)


class SessionManager:
    def __init__(self) -> None:
        self.sessions: dict[str, AgentSession] = {}

    async def get_or_create(self, session_id: str) -> AgentSession:
        if session_id not in self.sessions:
            self.sessions[session_id] = AgentSession(session_id)
        return self.sessions[session_id]


class ExecutionEngine:
    def __init__(self, agent: FlowAgent) -> None:
        self.agent = agent
        self._active_executions: dict[str, ExecutionContext] = {}
        self._session_last_run: dict[str, str] = {}
        self._pending_finalize_tasks: dict[str, asyncio.Task[Any]] = {}
        self._sub_counter = 0

    # -- setup ------------------------------------------------------------------------------------
    def _evict_if_over_limit(self) -> None:
        for run_id in [r for r, c in self._active_executions.items() if c.status != "running"]:
            del self._active_executions[run_id]

    def _new_context(self, query: str, session_id: str, max_iterations: int) -> ExecutionContext:
        self._evict_if_over_limit()
        session = self.agent.session_manager.sessions.get(session_id)
        ctx = ExecutionContext(session_id=session_id, query=query, max_iterations=max_iterations)
        ctx.working_history = [{"role": "system", "content": self.agent.amd.system_message}]
        ctx.working_history += [dict(m) for m in (session.history if session else [])[-6:]]
        ctx.working_history.append({"role": "user", "content": query})
        self._active_executions[ctx.run_id] = ctx
        self._session_last_run[session_id] = ctx.run_id
        return ctx

    def _current_tools(self, ctx: ExecutionContext) -> list[dict[str, Any]]:
        names = list(STATIC_TOOLS) + list(ctx.loaded_tools)
        return [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": self.agent.tool_manager.descriptions.get(n, n),
                    "parameters": {"type": "object", "properties": {}},
                },
            }
            for n in names
        ]

    # -- the loop -------------------------------------------------------------------------------
    async def execute(
        self,
        query: str,
        session_id: str = "default",
        max_iterations: int = 30,
        ctx: ExecutionContext | None = None,
        get_ctx: bool = False,
        persist_blocking: bool = False,
    ) -> Any:
        if ctx is None:
            ctx = self._new_context(query, session_id, max_iterations)
        ctx.status = "running"
        ctx.max_iterations = max_iterations
        final: str | None = None
        while ctx.current_iteration < ctx.max_iterations:
            ctx.current_iteration += 1
            msg = await self.agent.a_run_llm_completion(
                messages=list(ctx.working_history),
                tools=self._current_tools(ctx),
                max_tokens=16384,
                stream=False,
                get_response_message=True,
                with_context=False,
                model_preference="fast",
            )
            calls = msg.tool_calls or []
            if not calls:
                ctx.working_history.append({"role": "assistant", "content": msg.content})
                final = msg.content or ""
                break
            ctx.working_history.append(
                {
                    "role": "assistant",
                    "content": msg.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments},
                        }
                        for c in calls
                    ],
                }
            )
            if len(calls) == 1 and calls[0].function.name == "final_answer":
                args = json.loads(calls[0].function.arguments or "{}")
                final = args.get("answer", "")
                break
            results = await asyncio.gather(*(self._execute_tool_call(ctx, c) for c in calls))
            for call, (result, is_final) in zip(calls, results):
                ctx.working_history.append(
                    {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": str(result)}
                )
                ctx.tools_dict.append({"name": call.function.name, "args": call.function.arguments, "result": result})
                if is_final:
                    final = str(result)
            if final is not None:
                break
        else:
            ctx.status = "max_iterations"
            final = f"I reached the maximum of {ctx.max_iterations} iterations without a final answer."
        await self._record_and_finalize(ctx, final or "", persist_blocking)
        return (final, ctx) if get_ctx else final

    async def resume(
        self, ctx: ExecutionContext, query: str, max_iterations: int, get_ctx: bool, persist_blocking: bool
    ) -> Any:
        ctx.working_history.append({"role": "system", "content": RESUME_TEXT})
        ctx.working_history.append({"role": "user", "content": query})
        ctx.current_iteration = 0
        return await self.execute(ctx.query, ctx.session_id, max_iterations, ctx, get_ctx, persist_blocking)

    async def execute_stream(self, query: str, session_id: str, max_iterations: int, ctx: ExecutionContext | None):
        if ctx is None:
            ctx = self._new_context(query, session_id, max_iterations)
        ctx.status = "running"
        ctx.max_iterations = max_iterations
        name = self.agent.amd.name
        yield {"type": "status", "agent": name, "status_msg": "starting"}
        final, success = None, None
        while ctx.current_iteration < ctx.max_iterations:
            ctx.current_iteration += 1
            yield {
                "type": "iteration_start",
                "agent": name,
                "iter": ctx.current_iteration,
                "max_iter": ctx.max_iterations,
            }
            msg = await self.agent.a_run_llm_completion(
                messages=list(ctx.working_history),
                tools=self._current_tools(ctx),
                max_tokens=16384,
                stream=False,
                get_response_message=True,
                with_context=False,
                model_preference="fast",
            )
            if msg.content:
                yield {"type": "content", "agent": name, "chunk": msg.content}
            calls = msg.tool_calls or []
            ctx.working_history.append(
                {
                    "role": "assistant",
                    "content": msg.content or None,
                    **(
                        {
                            "tool_calls": [
                                {
                                    "id": c.id,
                                    "type": "function",
                                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                                }
                                for c in calls
                            ]
                        }
                        if calls
                        else {}
                    ),
                }
            )
            if not calls:
                final, success = msg.content or "", True
                break
            for call in calls:
                args = json.loads(call.function.arguments or "{}")
                if call.function.name == "final_answer":
                    final, success = args.get("answer", ""), args.get("success", True)
                    yield {"type": "final_answer", "agent": name, "answer": final, "success": success}
                    break
                yield {"type": "tool_start", "agent": name, "name": call.function.name, "args": args, "id": call.id}
                if call.function.name == "think":  # the stream path bypasses _execute_tool_call for think
                    result, is_final = await self._execute_think_streaming(ctx, call, args), False
                else:
                    result, is_final = await self._execute_tool_call(ctx, call)
                    ctx.working_history.append(
                        {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": str(result)}
                    )
                yield {
                    "type": "tool_result",
                    "agent": name,
                    "name": call.function.name,
                    "is_final": is_final,
                    "result": result,
                    "id": call.id,
                }
            if final is not None:
                break
        else:
            ctx.status = "max_iterations"
            final, success = "Max iterations reached.", False
            yield {"type": "max_iterations", "agent": name}
        await self._record_and_finalize(ctx, final or "", True)
        yield {"type": "done", "agent": name, "success": bool(success), "final_answer": final}

    # -- tools --------------------------------------------------------------------------------------
    async def _execute_tool_call(self, ctx: ExecutionContext, tool_call: Any) -> tuple[str, bool]:
        name = tool_call.function.name
        try:
            args = json.loads(tool_call.function.arguments or "{}")
        except json.JSONDecodeError as e:
            return f"System-Error: Invalid JSON in tool arguments for {name}: {e}", False
        if name == "think":
            return await self._execute_think_streaming(ctx, tool_call, args), False
        if name == "final_answer":
            return str(args.get("answer", "")), True
        if name == "load_tools":
            wanted = [t for t in args.get("tools", []) if t in self.agent.tool_manager.tools]
            ctx.loaded_tools += [t for t in wanted if t not in ctx.loaded_tools]
            return f"Geladen: {', '.join(wanted)}\nSlots: {len(ctx.loaded_tools)}/10 used", False
        if name == "spawn_sub_agent":
            self._sub_counter += 1
            sub = await self.execute(
                args.get("task", ""),
                f"{ctx.session_id}__sub__{self._sub_counter}",
                max_iterations=5,
                persist_blocking=True,
            )
            return f"Sub-agent result: {sub}", False
        ctx.tools_used.append(name)
        try:
            result = await self.agent.arun_function(name, **args)
            return str(result), False
        except Exception as e:
            if name in ctx.loaded_tools:
                return f"Error executing {name}: {e}", False
            ctx.loaded_tools.append(name)  # auto-loaded for the next try
            return (
                f"Error: Tool '{name}' war noch nicht geladen (auto lodet). Versuche es erneut. "
                f"Aufgetretener fehler : {e}"
            ), False

    async def _execute_think_streaming(self, ctx: ExecutionContext, tool_call: Any, args: dict[str, Any]) -> str:
        stream_fn = await self.agent.a_run_llm_completion(
            messages=[
                {"role": "system", "content": "strategic reasoning assistant"},
                {"role": "user", "content": args.get("thought", "")},
            ]
            + ctx.working_history[-25:],
            stream=True,
            model_preference="fast",
            with_context=False,
        )
        last = ""
        async for item in stream_fn():
            last = item
        ctx.working_history.append({"role": "tool", "tool_call_id": tool_call.id, "name": "think", "content": last})
        return last

    # -- after the loop ---------------------------------------------------------------------------
    async def _record_and_finalize(self, ctx: ExecutionContext, final: str, persist_blocking: bool) -> None:
        if persist_blocking:
            await self._commit_run_slow(ctx, final)
            return
        task = asyncio.ensure_future(self._commit_run_slow(ctx, final))
        self._pending_finalize_tasks[ctx.run_id] = task
        task.add_done_callback(lambda _t, rid=ctx.run_id: self._pending_finalize_tasks.pop(rid, None))

    async def _commit_run_slow(self, ctx: ExecutionContext, final: str) -> None:
        """Writes the run into the session history; only here does a finished run stop being "running"
        (so a query that arrives before this ran is answered by the sidecar)."""
        summary = await self.agent.a_run_llm_completion(
            messages=[{"role": "user", "content": f"Summarise run {ctx.run_id}"}], stream=False, model_preference="fast"
        )
        session = await self.agent.session_manager.get_or_create(ctx.session_id)
        session.history += [
            {"role": "user", "content": ctx.query},
            {"role": "assistant", "content": f"RUN SUMMARY [{ctx.run_id}]: {summary}"},
            {"role": "assistant", "content": final},
        ]
        if ctx.status == "running":
            ctx.status = "completed"

    async def wait_all_pending_finalizes(self) -> None:
        if self._pending_finalize_tasks:
            await asyncio.gather(*list(self._pending_finalize_tasks.values()))


class FlowAgent:
    def __init__(
        self,
        amd: AgentModelData | None = None,
        verbose: bool = False,
        max_parallel_tasks: int = 3,
        auto_load_checkpoint: bool = True,
        rule_config_path: str | None = None,
        stream_callback: Any = None,
        stream: bool = True,
        **kwargs: Any,
    ) -> None:
        self.amd = amd or AgentModelData()
        self.stream = stream
        self.verbose = verbose
        self.tool_manager = ToolManager()
        self.session_manager = SessionManager()
        self._router = ScriptedLLM()
        self._execution_engine_cache: ExecutionEngine | None = None
        self.total_tokens_in = 0
        self.total_tokens_out = 0
        self.total_cost_accumulated = 0.0
        self.total_llm_calls = 0
        self.saves = 0

    @property
    def router(self) -> ScriptedLLM:
        return self._router

    def add_tool(
        self,
        tool_func: Any,
        name: str | None = None,
        description: str | None = None,
        category: Any = None,
        **kwargs: Any,
    ) -> None:
        tool_name = name or tool_func.__name__
        self.tool_manager.tools[tool_name] = tool_func
        self.tool_manager.descriptions[tool_name] = description or (tool_func.__doc__ or tool_name)

    def _get_execution_engine(self) -> ExecutionEngine:
        if self._execution_engine_cache is None:
            self._execution_engine_cache = ExecutionEngine(self)
        return self._execution_engine_cache

    async def save(self) -> str:
        self.saves += 1
        return f"/fake/checkpoint/{self.amd.name}/agent_checkpoint_{self.saves}.pkl"

    async def a_run_llm_completion(
        self,
        messages: list[dict[str, Any]],
        model_preference: str = "fast",
        with_context: bool = True,
        stream: bool | None = None,
        get_response_message: bool = False,
        task_id: str = "unknown",
        session_id: str | None = None,
        do_tool_execution: bool = False,
        stream_callback: Any = False,
        _media_retry: int = 0,
        _removed_types: Any = None,
        max_iterations: int = 1,
        **kwargs: Any,
    ) -> Any:
        if stream is None:
            stream = self.stream
        model = getattr(self.amd, f"{model_preference}_llm_model", self.amd.fast_llm_model)
        if stream:
            router = self.router

            async def internal_stream():
                text = ""
                async for piece in router.stream(model=model, messages=messages, **kwargs):
                    text = f"{text} {piece}".strip()
                    yield piece
                self._count_usage()
                yield text  # the last item is the final result

            return internal_stream
        data = await self.router.complete(model=model, messages=messages, **kwargs)
        self._count_usage()
        if not get_response_message:
            return data.get("content") or ""
        calls = [
            _ToolCall(id=c["id"], function=_ToolFunction(c["name"], c["arguments"]))
            for c in data.get("tool_calls") or []
        ]
        return _AssistantMessage(content=data.get("content") or None, tool_calls=calls or None)

    def _count_usage(self) -> None:
        self.total_tokens_in += self.router.tokens_in
        self.total_tokens_out += self.router.tokens_out
        self.total_cost_accumulated += 0.001
        self.total_llm_calls += 1

    async def arun_function(self, function_name: str, **kwargs: Any) -> Any:
        session = next(iter(self.session_manager.sessions.values()), None)
        if session is not None and not session.is_tool_allowed(function_name):
            raise PermissionError(f"Tool {function_name} is not allowed in this session")
        return await self.tool_manager.execute(function_name, **kwargs)

    async def a_run(
        self,
        query: str,
        session_id: str = "default",
        execution_id: str | None = None,
        human_online: bool = False,
        max_iterations: int = 30,
        get_ctx: bool = False,
        persist_blocking: bool = False,
        **kwargs: Any,
    ) -> Any:
        try:
            await self.session_manager.get_or_create(session_id)
            engine = self._get_execution_engine()
            last = engine._active_executions.get(engine._session_last_run.get(session_id, ""))
            if last is not None and last.status == "running":  # sidecar: the real run is not touched
                answer = await self.a_run_llm_completion(messages=[{"role": "user", "content": query}], stream=False)
                return (answer, last) if get_ctx else answer
            if query.endswith(" #new-ctx"):
                query, last = query[: -len(" #new-ctx")], None
            if last is not None:
                return await engine.resume(last, query, max_iterations, get_ctx, persist_blocking)
            return await engine.execute(query, session_id, max_iterations, None, get_ctx, persist_blocking)
        except Exception as e:
            return f"Error: {e}"
        finally:
            await self.save()

    async def a_stream(
        self,
        query: str,
        session_id: str = "default",
        execution_id: str | None = None,
        human_online: bool = False,
        max_iterations: int = 30,
        user_lightning_model: Any = None,
        persist_blocking: bool = False,
        **kwargs: Any,
    ):
        try:
            await self.session_manager.get_or_create(session_id)
            engine = self._get_execution_engine()
            last = engine._active_executions.get(engine._session_last_run.get(session_id, ""))
            if last is not None and last.status != "running":
                last.working_history.append({"role": "system", "content": RESUME_TEXT})
                last.working_history.append({"role": "user", "content": query})
                last.current_iteration = 0
            else:
                last = None
            async for chunk in engine.execute_stream(query, session_id, max_iterations, last):
                yield chunk
        except Exception as e:
            yield {"type": "error", "error": str(e)}
            yield {"type": "done", "success": False, "final_answer": None}
        finally:
            await self.save()


# -- module-level tools (picklable) ----------------------------------------------------------------


def get_weather(city: str) -> str:
    """Return the weather for a city."""
    return f"Weather in {city}: 21C, sunny"


def fetch_stock(symbol: str) -> str:
    """Fetch a stock price."""
    raise ConnectionError(f"upstream quote service unreachable for {symbol}")


def exec_code(code: str) -> dict[str, Any]:
    """Run code (FlowAgent reports success even when the code raised)."""
    if "1/0" in code:
        return {
            "success": True,
            "output": 'Traceback (most recent call last):\n  File "<eval>", line 1\n'
            "ZeroDivisionError: division by zero",
            "error": None,
        }
    return {"success": True, "output": "385", "error": None}


async def slow_lookup(key: str, delay: float = 0.002) -> str:
    """An async tool that yields to the loop (for interleaving tests)."""
    await asyncio.sleep(delay)
    return f"value of {key}"


def make_agent(name: str = "fake_agent", stream: bool = False) -> FlowAgent:
    agent = FlowAgent(AgentModelData(name=name), stream=stream, auto_load_checkpoint=False)
    for func in (get_weather, fetch_stock, exec_code, slow_lookup):
        agent.add_tool(func)
    return agent
