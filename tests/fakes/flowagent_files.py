"""Write FlowAgent-shaped files without toolboxv2: checkpoints (V2, V1) and obs run files.

Test scaffolding (the tests and `bench/bench_ingest.py`), kept out of the package because it patches
`sys.modules`; the demo ships real FlowAgent files instead (`flowrl/demo/fixtures`). The pickles name the real
FlowAgent class paths (reference §6): the classes below report `toolboxv2.mods.isaa.base.Agent.*` as their
module and are registered under that name in `sys.modules` only while pickling (unless toolboxv2 itself is
imported, which is left alone). Real FlowAgent `pickle.load()` would rebuild them; flowrl reads them with its
restricted unpickler.
"""

from __future__ import annotations

import contextlib
import enum
import json
import pickle
import sys
import types
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

_CM = "toolboxv2.mods.isaa.base.Agent.checkpoint_manager"
_TYPES = "toolboxv2.mods.isaa.base.Agent.types"
_VFS = "toolboxv2.mods.isaa.base.Agent.vfs_v2"


class AgentCheckpoint:  # V2: checkpoint_manager.AgentCheckpoint
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


AgentCheckpoint.__module__ = _CM


class AgentCheckpointV1:  # V1: types.AgentCheckpoint
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


AgentCheckpointV1.__module__ = _TYPES
AgentCheckpointV1.__name__ = AgentCheckpointV1.__qualname__ = "AgentCheckpoint"


class FileBackingType(enum.Enum):
    MEMORY = 1
    SHADOW = 2
    MODIFIED = 3


FileBackingType.__module__ = _VFS


@contextlib.contextmanager
def _registered() -> Iterator[None]:
    added = []
    parts = _CM.split(".")
    for i in range(1, len(parts) - 1):  # the parent packages, so the import in pickle's lookup succeeds
        name = ".".join(parts[:i])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
            added.append(name)
    for name, attrs in (
        (_CM, {"AgentCheckpoint": AgentCheckpoint}),
        (_TYPES, {"AgentCheckpoint": AgentCheckpointV1}),
        (_VFS, {"FileBackingType": FileBackingType}),
    ):
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
        added.append(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def dumps(obj: Any) -> bytes:
    with _registered():
        return pickle.dumps(obj, protocol=4)


def turn(
    query: str, answer: str, run_id: str | None = None, summary: str = "The agent answered."
) -> list[dict[str, str]]:
    """The three chat_history messages `_commit_run_slow` appends for one run."""
    msgs = [{"role": "user", "content": query}]
    if run_id is not None:
        msgs.append(
            {"role": "assistant", "content": f"RUN SUMMARY [{run_id}]: {summary}\n(Task Map: /global/.memory/taskmap/)"}
        )
    msgs.append({"role": "assistant", "content": answer})
    return msgs


def session(
    session_id: str, agent: str, history: list[dict[str, Any]], *, max_history: int = 100, bulk: int = 0
) -> dict[str, Any]:
    """One `AgentSessionV2.to_checkpoint()` dict. `bulk` adds that many bytes of VFS file content."""
    now = datetime(2026, 11, 22, 16, 49, 45).isoformat()
    files = {}
    if bulk:
        files["/project/notes.md"] = {
            "filename": "notes.md",
            "backing_type": FileBackingType.MEMORY,
            "_content": "x" * bulk,
            "size_bytes": bulk,
            "line_count": 1,
            "state": "closed",
        }
    return {
        "session_id": session_id,
        "agent_name": agent,
        "created_at": now,
        "last_activity": now,
        "metadata": {},
        "tool_restrictions": {},
        "vfs": {
            "session_id": session_id,
            "agent_name": agent,
            "max_window_lines": 3000,
            "directories": {"/": {"name": "/", "created_at": now}},
            "files": files,
            "mounts": {},
        },
        "rule_set": {
            "tool_groups": {},
            "situation_rules": {},
            "learned_patterns": [],
            "current_situation": None,
            "current_intent": None,
            "active_tool_groups": [],
        },
        "skills": {"agent_name": agent, "skills": {}, "tool_groups": {}},
        "chat_history": history,
        "max_history": max_history,
        "kb": b"PK\x03\x04stub",
        "version": 2,
        "docker_enabled": False,
        "lsp_enabled": False,
    }


def v2_checkpoint(
    agent: str,
    sessions: dict[str, list[dict[str, Any]]],
    *,
    version: str = "2.0",
    timestamp: datetime | None = None,
    max_history: int = 100,
    bulk: int = 0,
    tools: int = 3,
) -> AgentCheckpoint:
    registry = {
        f"tool_{i}": {
            "name": f"tool_{i}",
            "description": f"Tool number {i}",
            "args_schema": "(a: str)",
            "category": ["local"],
            "flags": {"read": True},
            "source": "local",
            "call_count": i,
            "litellm_schema": {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": f"Tool number {i}",
                    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
                },
            },
        }
        for i in range(tools)
    }
    return AgentCheckpoint(
        version=version,
        timestamp=timestamp or datetime(2026, 11, 22, 16, 49, 45),
        agent_name=agent,
        agent_config={
            "name": agent,
            "fast_llm_model": "mock/fast",
            "complex_llm_model": "mock/complex",
            "system_message": "You are a helpful assistant.",
            "temperature": 0.7,
        },
        sessions_data={
            "version": 2,
            "agent_name": agent,
            "default_max_history": max_history,
            "sessions": {
                sid: session(sid, agent, h, max_history=max_history, bulk=bulk) for sid, h in sessions.items()
            },
            "skills_manager": None,
        },
        tool_registry_data={"tools": registry, "stats": {"total_calls": 0}},
        statistics={"total_tokens_in": 123456, "total_tokens_out": 7890, "total_cost": 1.5, "total_llm_calls": 99},
        bind_state=None,
        metadata={"created_by": "CheckpointManager", "agent_version": "2.0", "checkpoint_version": "2.0"},
    )


def v1_checkpoint(
    agent: str, sessions: dict[str, list[dict[str, Any]]], *, timestamp: datetime | None = None
) -> AgentCheckpointV1:
    return AgentCheckpointV1(
        timestamp=timestamp or datetime(2025, 12, 1, 10, 0, 0),
        agent_state={
            "is_running": False,
            "is_paused": False,
            "amd_data": {"name": agent},
            "total_tokens_in": 5000,
            "total_tokens_out": 900,
            "total_cost_accumulated": 0.2,
            "total_llm_calls": 12,
        },
        task_state={"t1": {"id": "t1", "type": "LLMTask", "status": "completed"}},
        world_model={},
        active_flows=[],
        metadata={
            "session_id": next(iter(sessions), "default"),
            "last_query": "",
            "checkpoint_version": "4.1_data_only",
            "agent_name": agent,
        },
        session_data={sid: {"history": h, "session_type": "chat"} for sid, h in sessions.items()},
        context_manager_state={},
        conversation_history=[],
        variable_system_state={},
        results_store={},
        tool_capabilities={},
        variable_scopes={},
        session_tool_restrictions={},
        performance_metrics={},
        execution_history=[],
    )


def write_checkpoint(directory: Path, obj: Any, stamp: str = "20261122_164945") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"agent_checkpoint_{stamp}.pkl"
    path.write_bytes(dumps(obj))
    return path


def obs_run(
    run_id: str,
    agent: str,
    session_id: str,
    query: str,
    answer: str,
    *,
    tools: list[tuple[str, dict, str]] = (),
    success: bool = True,
    t_start: float = 1795366182.0,
    tokens: tuple[int, int] = (100, 10),
    followups: list[tuple[str, str, list[tuple[str, dict, str]]]] = (),
) -> dict[str, Any]:
    """An obs `run_{run_id}.json` dict: one step per tool call, then a final_answer step.

    `followups` are auto-resumed parts of the same run, as FlowAgent records them: a resume-point step,
    then the working history continues after `system: Continue with old task ...` + the follow-up query."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": query},
    ]
    steps: list[dict[str, Any]] = []
    t = t_start
    parts = [(query, answer, list(tools))] + [(q, a, list(tl)) for q, a, tl in followups]
    n = 0
    for k, (_q, ans, part_tools) in enumerate(parts):
        if k > 0:
            steps.append(
                {
                    "step_id": len(steps) + 1,
                    "t_start": t,
                    "t_end": t,
                    "duration_s": 0.0,
                    "llm": None,
                    "tool_calls": [],
                    "vfs_deltas": [],
                    "compression": None,
                    "is_resume_point": True,
                }
            )
            history.append({"role": "system", "content": "Continue with old task using new user information's"})
            history.append({"role": "user", "content": _q})
        calls = part_tools + [("final_answer", {"answer": ans, "success": success}, "break loop")]
        for name, args, result in calls:
            cid = f"call_{run_id}_{n}"
            n += 1
            steps.append(
                {
                    "step_id": len(steps) + 1,
                    "t_start": t,
                    "t_end": t + 0.5,
                    "duration_s": 0.5,
                    "llm": {
                        "model": "mock/fast",
                        "t_start": t,
                        "t_first_token": 0.0,
                        "t_end": t + 0.1,
                        "ttft_s": 0.0,
                        "duration_s": 0.1,
                        "tokens_in": tokens[0],
                        "tokens_out": tokens[1],
                        "tokens_per_sec": 100.0,
                        "input_messages": [dict(m) for m in history],
                        "output_text": "",
                    },
                    "tool_calls": [
                        {
                            "name": name,
                            "args_summary": json.dumps(args),
                            "t_start": t + 0.1,
                            "t_end": t + 0.4,
                            "duration_s": 0.3,
                            "result_summary": result,
                            "status": "error" if result.startswith("Error") else "ok",
                            "error": "",
                        }
                    ],
                    "vfs_deltas": [],
                    "compression": None,
                }
            )
            history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    ],
                }
            )
            if name != "final_answer":
                history.append({"role": "tool", "tool_call_id": cid, "name": name, "content": result})
            t += 1.0
    llm_steps = [s for s in steps if s["llm"]]
    return {
        "run_id": run_id,
        "agent_name": agent,
        "query": query,
        "session_id": session_id,
        "t_start": t_start,
        "t_end": t,
        "duration_s": round(t - t_start, 3),
        "total_llm_time_s": 0.1 * len(llm_steps),
        "total_tool_time_s": 0.3 * len(llm_steps),
        "total_tokens_in": tokens[0] * len(llm_steps),
        "total_tokens_out": tokens[1] * len(llm_steps),
        "total_iterations": len(steps),
        "tool_call_count": len(llm_steps),
        "avg_ttft_s": 0.0,
        "success": success,
        "final_answer_summary": parts[-1][1],
        "files_modified": {},
        "persona": "default",
        "skills_matched": [],
        "parent_run_id": "",
        "sub_agent_runs": [],
        "steps": steps,
    }


def write_obs_run(obs_dir: Path, run: dict[str, Any]) -> Path:
    obs_dir.mkdir(parents=True, exist_ok=True)
    path = obs_dir / f"run_{run['run_id']}.json"
    path.write_text(json.dumps(run, ensure_ascii=False, indent=1), encoding="utf-8")
    return path
