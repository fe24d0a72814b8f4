"""Drive a real toolboxv2 FlowAgent (0.1.28) offline, with and without flowrl's live capture.

Run by tests/integration/test_real_flowagent.py in the separate toolboxv2 venv (see
scripts/setup_toolboxv2_env.sh), never in flowrl's own venv. It can also be run by hand:

    .venv-toolbox/bin/python tests/integration/flowagent_driver.py --store /tmp/st --out /tmp/summary.json

What is real: FlowAgent, its ExecutionEngine (ReAct loop, auto-resume, sidecar checks), ToolManager,
sessions, checkpoints and obs files. What is swapped out, as in toolboxv2's own tests:

* `agent._router` -> `ScriptRouter`, a subclass of FlowAgent's own `MockRouter` (flow_agent.py) that
  replays scripted assistant turns (tool calls included); no LLM is contacted;
* `SessionManager._get_memory` -> an in-memory stub (the real one needs faiss and embeddings);
* `narrator._call_blitz` -> a no-op (it would call a "blitz" model through its own router).

The same scenario runs twice: once on an unhooked agent (the baseline) and once on an agent hooked with
`flowrl.hook_into_agent`. The summary (JSON, written to --out and printed last on stdout) holds both
runs' return values and what the hook reported, so the test can compare them and then read the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# The narrator's and the think tool's model names; nothing may resolve to a real provider.
os.environ.setdefault("LIGHNIGMODEL", "mock/blitz")
os.environ.setdefault("BLITZMODEL", "mock/blitz")

# A key shaped like a real OpenAI project key. It must never reach the trace store unmasked.
SECRET = "sk-proj-" + "Q7fZ2kLm9XwP4tRv8YbN3cHs6JdE1gUa"

WEATHER = {
    "Berlin": "Berlin: 21C, sunny",
    "Rome": "Rome: 25C, clear",
    "Oslo": "Oslo: 4C, rain",
    "Paris": "Paris: 18C, cloudy",
}


# ------------------------------------------------------------------------------------------------
# offline FlowAgent


def _install_offline_stubs() -> None:
    """Memory and narrator stubs (module level, before any agent exists)."""
    import toolboxv2.mods.isaa.base.Agent.narrator as narrator
    from toolboxv2.mods.isaa.base.Agent import session_manager

    async def _no_blitz(*_a: Any, **_k: Any) -> None:
        return None

    narrator._call_blitz = _no_blitz

    class StubMemory:
        """Just enough of AISemanticMemory for sessions to be created, saved and checkpointed."""

        def __init__(self) -> None:
            self.spaces: dict[str, list] = {}

        def load_memory(self, name: str, path: Any) -> bool:
            return name in self.spaces

        def create_memory(self, name: str, *_a: Any, **_k: Any) -> bool:
            self.spaces.setdefault(name, [])
            return True

        async def add_data(self, name: str, data: Any, metadata: Any = None, direct: bool = False, **_k: Any) -> bool:
            self.spaces.setdefault(name, []).append((data, metadata))
            return True

        def save_memory(self, name: str, path: Any) -> bytes:
            return b"PK\x03\x04stub-memory"

        async def query(self, *_a: Any, **_k: Any) -> list:
            return []

        def get_memory_size(self, name: str) -> int:
            return len(self.spaces.get(name, []))

    stub = StubMemory()

    def _get_memory(self: Any) -> StubMemory:
        self._memory_instance = stub
        return stub

    session_manager.SessionManager._get_memory = _get_memory


def _make_router_class() -> type:
    from toolboxv2.mods.isaa.base.Agent.flow_agent import MockRouter

    class ScriptRouter(MockRouter):
        """Main-loop calls (offered tools include final_answer) pop the next scripted turn; the think
        sub-call (a stream without final_answer) pops from `thinks`; anything else (run summary,
        a_format_class, ...) gets a fixed short text."""

        def __init__(self) -> None:
            super().__init__([])
            self.main: list[dict] = []
            self.thinks: list[str] = []
            self.unscripted_main_calls = 0
            self.sidecar_calls = 0
            # While set and not released, "other" complete() calls (FlowAgent's run summary in its
            # background commit) wait: that keeps the finished run "running" for the sidecar check.
            self.hold: asyncio.Event | None = None
            self.hold_timeouts = 0

        @staticmethod
        def _is_main(tools: Any) -> bool:
            return bool(tools) and any(((t or {}).get("function") or {}).get("name") == "final_answer" for t in tools)

        def _next_main(self) -> dict:
            if self.main:
                return self.main.pop(0)
            # A script ran dry: end the run instead of raising inside the engine.
            self.unscripted_main_calls += 1
            return {
                "content": "",
                "tool_calls": [tc("call_unscripted", "final_answer", {"answer": "UNSCRIPTED", "success": False})],
            }

        @staticmethod
        def _is_sidecar(tools: Any) -> bool:
            return bool(tools) and any(((t or {}).get("function") or {}).get("name") == "steering" for t in tools)

        async def complete(self, *, model: str = "mock", messages: Any = None, tools: Any = None, **kw: Any) -> Any:
            if self._is_main(tools):
                self.queue.append(self._next_main())
            elif self._is_sidecar(tools):
                self.sidecar_calls += 1
                self.queue.append({"content": SIDECAR_REPLY})
            else:
                if self.hold is not None and not self.hold.is_set():
                    try:
                        await asyncio.wait_for(self.hold.wait(), timeout=10)
                    except TimeoutError:
                        self.hold_timeouts += 1
                self.queue.append("Compact run summary by the mock model.")
            return await super().complete(model=model, messages=messages, tools=tools, **kw)

        async def stream(self, *, model: str = "mock", messages: Any = None, tools: Any = None, **kw: Any) -> Any:
            if self._is_main(tools):
                self.queue.append(self._next_main())
            else:
                self.queue.append(self.thinks.pop(0) if self.thinks else "ok")
            async for chunk in super().stream(model=model, messages=messages, tools=tools, **kw):
                yield chunk

    return ScriptRouter


def tc(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "name": name, "arguments": json.dumps(args)}


def get_weather(city: str) -> str:
    """Return the current weather for a city."""
    return WEATHER.get(city, f"{city}: no data")


def fetch_stock(symbol: str) -> str:
    """Fetch the current price of a stock symbol."""
    raise ConnectionError(f"quote service unreachable for {symbol}")


def build_agent(name: str) -> tuple[Any, Any]:
    from toolboxv2.mods.isaa.base.Agent.flow_agent import FlowAgent
    from toolboxv2.mods.isaa.base.Agent.types import AgentModelData

    amd = AgentModelData(
        name=name,
        fast_llm_model="mock/fast",
        complex_llm_model="mock/complex",
        system_message="You are a helpful assistant.",
        enable_docker=False,
        enable_lsp=False,
    )
    agent = FlowAgent(amd, stream=False, auto_load_checkpoint=False)
    agent.add_tool(get_weather, name="get_weather", description="Current weather for a city", category=["web"])
    agent.add_tool(fetch_stock, name="fetch_stock", description="Current stock price", category=["finance"])
    router = _make_router_class()()
    agent._router = router
    return agent, router


# ------------------------------------------------------------------------------------------------
# the scenario (identical for the baseline and the hooked agent)

Q_WEATHER = f"What's the weather in Berlin? My OpenAI key is {SECRET}, keep it safe."
Q_FOLLOWUP = "And in Rome?"
Q_STOCK = "What is the current ACME stock price?"
Q_SIDECAR = "Is the price lookup done yet?"
Q_STREAM = "Weather in Oslo, please."
SIDECAR_REPLY = "Yes: the ACME lookup finished, the quote service was unreachable."
Q_AFTER_UNHOOK = "Weather in Paris?"

ANSWERS = {
    "weather": "Berlin: 21C and sunny.",
    "followup": "Rome: 25C and clear.",
    "stock": "I could not get the ACME price: the quote service is unreachable.",
    "stream": "Oslo: 4C with rain.",
    "after_unhook": "Paris: 18C and cloudy.",
}


def _script_weather(router: Any) -> None:
    router.main = [
        {
            "content": "",
            "tool_calls": [
                tc("call_w1", "think", {"thought": "Look up Berlin with get_weather, then answer.", "effort": "fast"})
            ],
        },
        {"content": "Checking the weather.", "tool_calls": [tc("call_w2", "get_weather", {"city": "Berlin"})]},
        {"content": "", "tool_calls": [tc("call_w3", "final_answer", {"answer": ANSWERS["weather"], "success": True})]},
    ]
    router.thinks = ["Plan: one get_weather call for Berlin, then final_answer."]


def _script_followup(router: Any) -> None:
    router.main = [
        {"content": "", "tool_calls": [tc("call_f1", "get_weather", {"city": "Rome"})]},
        {
            "content": "",
            "tool_calls": [tc("call_f2", "final_answer", {"answer": ANSWERS["followup"], "success": True})],
        },
    ]


def _script_stock(router: Any) -> None:
    router.main = [
        {"content": "", "tool_calls": [tc("call_s1", "fetch_stock", {"symbol": "ACME"})]},
        {"content": "", "tool_calls": [tc("call_s2", "final_answer", {"answer": ANSWERS["stock"], "success": False})]},
    ]


def _script_stream(router: Any) -> None:
    router.main = [
        {"content": "", "tool_calls": [tc("call_o1", "get_weather", {"city": "Oslo"})]},
        {"content": "", "tool_calls": [tc("call_o2", "final_answer", {"answer": ANSWERS["stream"], "success": True})]},
    ]


def _script_after_unhook(router: Any) -> None:
    router.main = [
        {"content": "", "tool_calls": [tc("call_p1", "get_weather", {"city": "Paris"})]},
        {
            "content": "",
            "tool_calls": [tc("call_p2", "final_answer", {"answer": ANSWERS["after_unhook"], "success": True})],
        },
    ]


async def _settle(agent: Any) -> None:
    """Wait for FlowAgent's background commit of finished runs (persist_blocking=False).

    Until it has run, the finished run's ExecutionContext keeps status "running", so a new query in
    that session goes to the *sidecar* instead of auto-resuming (flow_agent.py a_run, sidecar block).
    A person typing a follow-up gives it that time; a script has to wait for it."""
    await agent._get_execution_engine().wait_all_pending_finalizes()


def _last_run_id(agent: Any, session_id: str) -> str | None:
    engine = agent._get_execution_engine()
    return engine._session_last_run.get(session_id)


_STABLE_CHUNK_KEYS = ("type", "chunk", "name", "answer", "success", "final_answer", "is_final")


def _stable_chunk(chunk: Any) -> Any:
    """The part of an a_stream chunk that must not depend on timing or on the hook."""
    if not isinstance(chunk, dict):
        return {"non_dict": type(chunk).__name__}
    out = {k: chunk[k] for k in _STABLE_CHUNK_KEYS if k in chunk}
    if chunk.get("type") == "tool_result":
        out["result"] = str(chunk.get("result"))[:200]
    return out


async def run_scenario(agent: Any, router: Any, settle_last: bool = True) -> dict[str, Any]:
    """Runs 1-4 (the part that is captured). Returns what the agent returned, per run.

    settle_last=False leaves the last run's background commit pending, as a program does that calls
    `hook.flush()` right after its last `a_run`/`a_stream`."""
    out: dict[str, Any] = {"runs": {}}

    # 1. think + custom tool + final_answer(success=True); the query carries a secret.
    _script_weather(router)
    t = time.perf_counter()
    res = await agent.a_run(Q_WEATHER, session_id="s1")
    out["runs"]["weather"] = {
        "query": Q_WEATHER,
        "session_id": "s1",
        "result": res,
        "result_type": type(res).__name__,
        "run_id": _last_run_id(agent, "s1"),
        "seconds": round(time.perf_counter() - t, 3),
    }
    await _settle(agent)

    # 2. follow-up in the same session: FlowAgent auto-resumes run 1's ExecutionContext.
    _script_followup(router)
    t = time.perf_counter()
    res = await agent.a_run(Q_FOLLOWUP, session_id="s1")
    out["runs"]["followup"] = {
        "query": Q_FOLLOWUP,
        "session_id": "s1",
        "result": res,
        "result_type": type(res).__name__,
        "run_id": _last_run_id(agent, "s1"),
        "seconds": round(time.perf_counter() - t, 3),
    }
    await _settle(agent)

    # 3. a tool that raises + final_answer(success=False); the caller asks for the ctx.
    router.hold = asyncio.Event()  # keep run 3's background commit from finishing before 3b
    _script_stock(router)
    t = time.perf_counter()
    res = await agent.a_run(Q_STOCK, session_id="s2", get_ctx=True)
    is_tuple = isinstance(res, tuple) and len(res) == 2
    result, ctx = res if is_tuple else (res, None)
    out["runs"]["stock"] = {
        "query": Q_STOCK,
        "session_id": "s2",
        "result": result,
        "result_type": "tuple" if is_tuple else type(res).__name__,
        "ctx_type": type(ctx).__name__,
        "ctx_run_id": getattr(ctx, "run_id", None),
        "run_id": _last_run_id(agent, "s2"),
        "seconds": round(time.perf_counter() - t, 3),
    }

    # 3b. an immediate second query in s2: run 3's commit is still pending, its ctx says "running",
    # so FlowAgent answers from the sidecar (one LLM call, a single `steering` tool, no ReAct loop).
    engine = agent._get_execution_engine()
    pending = sorted(engine._pending_finalize_tasks)
    sidecar_before = router.sidecar_calls
    t = time.perf_counter()
    res = await agent.a_run(Q_SIDECAR, session_id="s2")
    out["runs"]["sidecar"] = {
        "query": Q_SIDECAR,
        "session_id": "s2",
        "result": res,
        "result_type": type(res).__name__,
        "pending_finalize_before": pending,
        "took_sidecar_path": router.sidecar_calls > sidecar_before,
        "run_id": _last_run_id(agent, "s2"),
        "seconds": round(time.perf_counter() - t, 3),
    }
    router.hold.set()
    router.hold = None
    await _settle(agent)

    # 4. a_stream in a fresh session.
    _script_stream(router)
    t = time.perf_counter()
    chunks = []
    async for chunk in agent.a_stream(Q_STREAM, session_id="s3"):
        chunks.append(chunk)
    done = [c for c in chunks if isinstance(c, dict) and c.get("type") == "done"]
    out["runs"]["stream"] = {
        "query": Q_STREAM,
        "session_id": "s3",
        "result": (done[-1].get("final_answer") if done else None),
        "done_success": (done[-1].get("success") if done else None),
        "chunk_types": [c.get("type") if isinstance(c, dict) else type(c).__name__ for c in chunks],
        "stable_chunks": [_stable_chunk(c) for c in chunks],
        "run_id": _last_run_id(agent, "s3"),
        "seconds": round(time.perf_counter() - t, 3),
    }
    if settle_last:
        await _settle(agent)
    out["unscripted_main_calls"] = router.unscripted_main_calls
    out["hold_timeouts"] = router.hold_timeouts
    return out


async def run_after_unhook(agent: Any, router: Any) -> dict[str, Any]:
    _script_after_unhook(router)
    res = await agent.a_run(Q_AFTER_UNHOOK, session_id="s4")
    await _settle(agent)
    return {"query": Q_AFTER_UNHOOK, "session_id": "s4", "result": res, "run_id": _last_run_id(agent, "s4")}


# ------------------------------------------------------------------------------------------------
# main


def _patch_snapshot(agent: Any) -> dict[str, Any]:
    """Identity of every attribute of FlowAgent's and ExecutionEngine's classes (MRO included), and
    the callables shadowing methods on the two instances: unhook() must put back exactly this."""
    engine = agent._get_execution_engine()
    snap: dict[str, Any] = {"class": {}, "instance": {}}
    for obj in (agent, engine):
        cls = type(obj)
        for klass in cls.__mro__:
            if klass is object:
                continue
            for name, value in vars(klass).items():
                snap["class"].setdefault(f"{cls.__name__}.{name}", f"{type(value).__name__}@{id(value):x}")
        for name, value in vars(obj).items():
            shadows = any(name in vars(k) for k in cls.__mro__ if k is not object)
            if callable(value) and (shadows or hasattr(value, "__wrapped__")):
                snap["instance"][f"{cls.__name__}().{name}"] = f"{type(value).__name__}@{id(value):x}"
    return snap


def _snapshot_diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    diff = []
    for part in ("class", "instance"):
        a, b = before[part], after[part]
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diff.append(f"{key}: {a.get(key)} -> {b.get(key)}")
    return diff


def _file_listing(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    from toolboxv2 import get_app

    get_app("flowrl-it")
    _install_offline_stubs()
    timings["import_toolboxv2"] = round(time.perf_counter() - t0, 3)
    summary: dict[str, Any] = {"secret": SECRET, "answers": ANSWERS, "timings": timings, "errors": []}

    from importlib.metadata import version

    import toolboxv2

    summary["toolboxv2_version"] = version("toolboxv2")  # toolboxv2.__version__ says "x.x.x" outside its repo
    summary["toolboxv2_path"] = os.path.dirname(toolboxv2.__file__)

    # Baseline: the same scenario on an agent that is never hooked.
    if not args.skip_baseline:
        t = time.perf_counter()
        base_agent, base_router = build_agent("flowrl_it_baseline")
        summary["baseline"] = await run_scenario(base_agent, base_router)
        await base_agent.close(no_save=True)
        timings["baseline"] = round(time.perf_counter() - t, 3)

    if args.no_hook:
        return summary

    import flowrl
    from flowrl import TraceStore, hook_into_agent

    summary["flowrl_path"] = os.path.dirname(flowrl.__file__)
    store_dir = Path(args.store)
    t = time.perf_counter()
    agent, router = build_agent("flowrl_it")
    before = _patch_snapshot(agent)
    hook = hook_into_agent(agent, store=TraceStore(store_dir))
    summary["patched_while_hooked"] = _snapshot_diff(before, _patch_snapshot(agent))
    summary["hooked"] = await run_scenario(agent, router, settle_last=False)
    # flush() straight after the last run, on the event loop's thread, while FlowAgent's commit of
    # that run is still pending: it must neither deadlock nor lose the run.
    summary["pending_commit_at_flush"] = sorted(agent._get_execution_engine()._pending_finalize_tasks)
    t_flush = time.perf_counter()
    flushed = hook.flush(timeout=30)
    summary["flush_seconds"] = round(time.perf_counter() - t_flush, 3)
    summary["flush_returned"] = repr(flushed)
    await _settle(agent)
    summary["files_after_flush"] = _file_listing(store_dir)
    summary["stats_after_flush"] = _jsonable(getattr(hook, "stats", None))
    timings["hooked"] = round(time.perf_counter() - t, 3)

    hook.unhook()
    summary["not_restored_after_unhook"] = _snapshot_diff(before, _patch_snapshot(agent))
    summary["after_unhook"] = await run_after_unhook(agent, router)
    # Nothing should be pending, but give a still-running writer every chance to show a leak.
    try:
        hook.flush()
    except Exception as exc:  # flushing after unhook may legitimately be refused
        summary["flush_after_unhook_error"] = repr(exc)
    await asyncio.sleep(0.3)
    summary["files_after_unhook_run"] = _file_listing(store_dir)
    summary["stats_final"] = _jsonable(getattr(hook, "stats", None))
    await agent.close(no_save=True)
    timings["total_driver"] = round(time.perf_counter() - t0, 3)
    summary["web_helper_imported"] = "toolboxv2.mods.isaa.extras.web_helper.web_agent" in sys.modules
    return summary


def _jsonable(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    for attr in ("model_dump", "_asdict", "as_dict", "to_dict"):
        fn = getattr(obj, attr, None)
        if callable(fn):
            try:
                return _jsonable(fn())
            except Exception:
                pass
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return _jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "__dict__"):
        return {k: _jsonable(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return repr(obj)


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="./flowrl-it-store", help="TraceStore root for the hooked agent")
    parser.add_argument("--out", default=None, help="write the JSON summary here as well")
    parser.add_argument("--no-hook", action="store_true", help="only run the unhooked baseline (no flowrl import)")
    parser.add_argument("--skip-baseline", action="store_true", help="skip the unhooked baseline run")
    parser.add_argument(
        "--fast-exit",
        action="store_true",
        help="os._exit after writing the summary: skips toolboxv2's ~12 s of MinIO retries at exit",
    )
    args = parser.parse_args()
    try:
        summary = asyncio.run(main(args))
        rc = 0
    except Exception:
        summary = {"fatal": traceback.format_exc()}
        rc = 1
    text = json.dumps(summary, ensure_ascii=False, default=repr)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    print("FLOWRL_DRIVER_SUMMARY " + text, flush=True)
    sys.stderr.flush()
    if args.fast_exit:
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(cli())
